//! Compiles `vynil/**/*.proto` with `protox` (a Rust protobuf compiler), so no
//! system `protoc` is needed to build the workspace.

use prost::Message;
use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "vynil/catalog/v1/catalog.proto",
    "vynil/scanner/v1/scanner.proto",
    "vynil/purger/v1/purger.proto",
    "vynil/lifecycle/v1/lifecycle.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["."])?;

    // The encoded descriptor set feeds gRPC server reflection.
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("vynil_descriptor.bin"), descriptors.encode_to_vec())?;

    tonic_prost_build::configure()
        // Every RPC a service does not implement yet answers UNIMPLEMENTED.
        .generate_default_stubs(true)
        .compile_fds(descriptors)?;
    Ok(())
}
