//! Compiles the vendored CRI `runtime.v1` protocol (see proto/README.md) into a
//! client-only tonic module, included by `src/cri/mod.rs`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_protos(&[proto], &["proto"])?;
    Ok(())
}
