//! Compiles the vendored CRI `runtime.v1` protocol (see proto/README.md) into a
//! client-only tonic module, included by `src/cri/mod.rs`; and the device plugin API
//! `deviceplugin/v1beta1` with clients and servers (the agent serves `Registration` and
//! calls `DevicePlugin`; the test device plugin does the reverse), included by
//! `src/cm/devicemanager/mod.rs`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_protos(&[proto], &["proto"])?;
    let deviceplugin = "proto/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={deviceplugin}");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Sorted maps: the same Allocate answer always encodes to the same checkpoint bytes.
        .btree_map(".")
        .compile_protos(&[deviceplugin], &["proto"])?;
    Ok(())
}
