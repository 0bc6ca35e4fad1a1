//! Writes `crates/api/openapi.json` from `crates/api/openapi.template.json` and the types:
//! `cargo run -p warden-api-types --features schema --example openapi`.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let api = Path::new(env!("CARGO_MANIFEST_DIR")).join("../api");
    let template = std::fs::read_to_string(api.join("openapi.template.json"))?;
    let out = api.join("openapi.json");
    std::fs::write(&out, warden_api_types::openapi::document(&template)?)?;
    println!("wrote {}", out.display());
    Ok(())
}
