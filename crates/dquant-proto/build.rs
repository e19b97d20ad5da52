//! Compiles `proto/dquant/v1/agent.proto` with protox (a pure-Rust protobuf compiler), so a
//! build needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/dquant/v1/agent.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
