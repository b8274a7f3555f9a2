//! Compiles the vendored protocols (see proto/README.md) into tonic modules: the CRI
//! `runtime.v1` client-only (included by `src/cri/mod.rs`); the device plugin API
//! `deviceplugin/v1beta1` with clients and servers (the agent serves `Registration` and
//! calls `DevicePlugin`; the test device plugin does the reverse), included by
//! `src/cm/devicemanager/mod.rs`; the CSI spec's `csi.v1` and the kubelet's plugin
//! registration `pluginregistration` with clients and servers (included by
//! `src/volume/csi/mod.rs` and `src/pluginmanager/mod.rs`: the agent is the client, the test
//! CSI driver serves them).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cri = "proto/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto";
    let deviceplugin = "proto/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto";
    let csi = "proto/csi/v1/csi.proto";
    let registration = "proto/k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto";
    for proto in [cri, deviceplugin, csi, registration] {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_protos(&[cri], &["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Sorted maps: the same Allocate answer always encodes to the same checkpoint bytes.
        .btree_map(".")
        .compile_protos(&[deviceplugin], &["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&[csi, registration], &["proto"])?;
    Ok(())
}
