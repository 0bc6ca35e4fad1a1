//! The API's OpenAPI document: the paths, written by hand in `crates/api/openapi.template.json`,
//! and `components.schemas`, generated here from the types themselves, so that a schema can
//! never say something the wire format does not.

use schemars::generate::SchemaSettings;
use serde_json::Value;

use crate::*;

/// The command that writes `crates/api/openapi.json` from the template and the types.
pub const REGENERATE: &str = "cargo run -p warden-api-types --features schema --example openapi";

/// The JSON Schema of every body the API takes or answers, and of what they refer to, by name
/// (the type's), with references in `#/components/schemas/`.
pub fn schemas() -> serde_json::Map<String, Value> {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();
    // Every type a path of the template names; what they refer to comes along.
    let _ = (
        generator.subschema_for::<ErrorBody>(),
        generator.subschema_for::<Health>(),
        generator.subschema_for::<AppSpec>(),
        generator.subschema_for::<Scale>(),
        generator.subschema_for::<ProcessType>(),
        generator.subschema_for::<Restart>(),
        generator.subschema_for::<Restarted>(),
        generator.subschema_for::<crate::RunRequest>(),
        generator.subschema_for::<NewUser>(),
        generator.subschema_for::<UserChange>(),
        generator.subschema_for::<UserView>(),
        generator.subschema_for::<NewOidcProvider>(),
        generator.subschema_for::<OidcProviderChange>(),
        generator.subschema_for::<OidcProviderView>(),
        generator.subschema_for::<StartRequest>(),
        generator.subschema_for::<InstanceRecord>(),
        generator.subschema_for::<AppLogEntry>(),
        generator.subschema_for::<RouterLines>(),
        generator.subschema_for::<NodeRecord>(),
        generator.subschema_for::<DrainOrder>(),
        generator.subschema_for::<Lattice>(),
        generator.subschema_for::<Status>(),
        generator.subschema_for::<Release>(),
        generator.subschema_for::<ReleaseEvent>(),
        generator.subschema_for::<UploadLimits>(),
        generator.subschema_for::<ConfigChange>(),
        generator.subschema_for::<Rollback>(),
        generator.subschema_for::<AppData>(),
        generator.subschema_for::<AuditRecord>(),
        generator.subschema_for::<Verified>(),
        generator.subschema_for::<NewOperator>(),
        generator.subschema_for::<OperatorChange>(),
        generator.subschema_for::<OperatorView>(),
        generator.subschema_for::<Login>(),
        generator.subschema_for::<IssuedToken>(),
        generator.subschema_for::<NewToken>(),
        generator.subschema_for::<TokenView>(),
        generator.subschema_for::<SessionView>(),
        generator.subschema_for::<DeviceLogin>(),
        generator.subschema_for::<DeviceStarted>(),
        generator.subschema_for::<DevicePollRequest>(),
        generator.subschema_for::<DevicePollAnswer>(),
    );
    generator.take_definitions(true)
}

/// The whole document: `template` (OpenAPI 3.1 JSON) with its `components.schemas` replaced by
/// [`schemas`], pretty-printed with sorted keys and a final newline.
pub fn document(template: &str) -> Result<String, serde_json::Error> {
    let mut doc: Value = serde_json::from_str(template)?;
    doc["components"]["schemas"] = Value::Object(schemas());
    let mut text = serde_json::to_string_pretty(&doc)?;
    text.push('\n');
    Ok(text)
}
