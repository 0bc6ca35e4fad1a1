//! Nothing to build: this script exists so that the protoc-bin-vendored build-dependency is
//! fetched with the other crates, for `tools/protoc` to find when the machine has no protoc
//! (etcd-client's build script needs one).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
