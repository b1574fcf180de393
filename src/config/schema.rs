//! The JSON Schema of `vipwatch.toml`, generated from the config types and their doc comments (each
//! key's description is the first paragraph of its field's doc comment). The committed copy in
//! `docs/reference/schemas/` is what editors read (taplo, Even Better TOML) and what the
//! configuration reference page is rendered from; a test keeps both equal to this.

use std::borrow::Cow;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

use super::Config;

/// The schema's identifier (its `$id`): a URN, since no URL serves the schema; editors read a local
/// copy named in the file's first line (`#:schema ./vipwatch.schema.json`).
pub const SCHEMA_ID: &str = "urn:vipwatch:schema:vipwatch.toml";

/// The schema of the whole file, as a JSON value: draft 2020-12, `$defs` for shared shapes, no
/// `null` for optional keys (TOML has no null: an optional key is left out).
pub fn vipwatch_schema() -> serde_json::Value {
    generate::<Config>(SCHEMA_ID, "vipwatch.toml")
}

/// The identifier (`$id`) of the schema of the HAProxy agent's `vipwatch-haproxy.toml`: a URN, as
/// [`SCHEMA_ID`].
pub const AGENT_SCHEMA_ID: &str = "urn:vipwatch:schema:vipwatch-haproxy.toml";

/// The schema of the HAProxy agent's `vipwatch-haproxy.toml` (its config type lives in the agent's
/// crate; the settings here are shared).
pub fn agent_schema() -> serde_json::Value {
    generate::<vipwatch_haproxy::config::AgentConfig>(AGENT_SCHEMA_ID, "vipwatch-haproxy.toml")
}

/// The schema of `T` under `id` and `title`, with the settings every vipwatch schema uses (the
/// agent's too).
pub fn generate<T: JsonSchema>(id: &str, title: &str) -> serde_json::Value {
    let mut schema = SchemaSettings::draft2020_12().into_generator().into_root_schema_for::<T>();
    schema.insert("$id".into(), id.into());
    schema.insert("title".into(), title.into());
    let mut value = schema.to_value();
    drop_null(&mut value);
    unwrap_descriptions(&mut value);
    if durations(&mut value) {
        value["$defs"]["Duration"] = duration_schema();
    }
    value
}

/// The shape of every duration key: a string in humantime syntax (`"250ms"`, `"10s"`, `"5m"`,
/// `"24h"`, `"30d"`), as `humantime_serde` reads it. A duration field says
/// `#[schemars(with = "String", extend("x-humantime" = true))]`; [`generate`] points it here.
fn duration_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "string",
        "description": "A duration in humantime syntax: numbers with units (ns, us, ms, s, m, h, d, w, M, y; \
                        long forms such as `sec`, `min`, `hours`, `days` too), e.g. `\"250ms\"`, `\"10s\"`, \
                        `\"1h 30m\"`.",
        "pattern": r"^\s*([0-9]+\s*(nsec|ns|usec|us|µs|msec|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d|weeks?|w|months?|M|years?|y)\s*)+$",
        "examples": ["250ms", "10s", "5m", "24h", "30d"]
    })
}

/// Replaces every `{"type": "string", "x-humantime": true}` by a reference to the `Duration`
/// definition (keeping its description and default); whether there was any.
fn durations(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut found = false;
            if map.remove("x-humantime").is_some() {
                map.remove("type");
                map.insert("$ref".into(), "#/$defs/Duration".into());
                found = true;
            }
            map.values_mut().fold(found, |f, v| durations(v) | f)
        }
        Value::Array(items) => items.iter_mut().fold(false, |f, v| durations(v) | f),
        _ => false,
    }
}

/// Joins the lines of each paragraph of every `description` (doc comments are wrapped at the code's
/// line width; an editor's hover wraps by itself). Paragraphs stay apart.
fn unwrap_descriptions(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            if let Some(Value::String(d)) = map.get_mut("description") {
                *d = d
                    .split("\n\n")
                    .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect::<Vec<_>>()
                    .join("\n\n");
            }
            map.values_mut().for_each(unwrap_descriptions);
        }
        Value::Array(items) => items.iter_mut().for_each(unwrap_descriptions),
        _ => {}
    }
}

/// Removes `null` as an alternative everywhere (`"type": ["string", "null"]`, an `anyOf` member
/// `{"type": "null"}`): schemars allows it for every `Option`, but a TOML file cannot say null.
fn drop_null(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    map.insert("type".into(), only);
                }
            }
            if map.get("default").is_some_and(Value::is_null) {
                map.remove("default");
            }
            if let Some(Value::Array(any)) = map.get_mut("anyOf") {
                any.retain(|s| s.get("type").is_none_or(|t| t != "null"));
                if any.len() == 1
                    && let Some(Value::Object(only)) = any.pop()
                {
                    map.remove("anyOf");
                    for (k, v) in only {
                        map.entry(k).or_insert(v);
                    }
                }
            }
            map.values_mut().for_each(drop_null);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_null),
        _ => {}
    }
}

/// A secret given inline: a string, never printed (`check-config` shows `<redacted>`).
impl JsonSchema for super::Secret {
    fn schema_name() -> Cow<'static, str> {
        "Secret".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "writeOnly": true})
    }
}
