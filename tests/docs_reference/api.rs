//! The REST API reference, rendered from the OpenAPI document the code generates: one section per tag,
//! one per operation with its parameters and answers, then every schema.

use serde_json::{Map, Value};

use crate::markdown::{cell, table};

/// The whole page.
pub fn page(doc: &Value) -> String {
    let info = &doc["info"];
    let mut out = format!(
        "# REST API\n\n{}\n{}\n\nThe document itself: `GET /openapi.json` on a running vipwatch, `vipwatch openapi`, or \
         the committed `openapi/openapi.json`; a running vipwatch serves Swagger UI at `/docs`. Error codes: \
         [Errors](errors.md).\n",
        crate::generated_by("the OpenAPI document (`src/api`, `openapi/openapi.json`)"),
        info["description"].as_str().unwrap_or_default()
    );
    let tags = doc["tags"].as_array().cloned().unwrap_or_default();
    for tag in &tags {
        let name = tag["name"].as_str().unwrap_or_default();
        let about = tag["description"].as_str().unwrap_or(name);
        out += &format!("\n## {about} {{#{name}}}\n");
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                if op["tags"].as_array().is_some_and(|t| t.iter().any(|t| t == name)) {
                    out += &operation(path, method, op);
                }
            }
        }
    }
    out +=
        "\n## Schemas {#schemas}\n\nThe shapes of the bodies above; `?` marks a field that may be absent or `null`.\n";
    for (name, schema) in doc["components"]["schemas"].as_object().into_iter().flatten() {
        out += &schema_section(name, schema);
    }
    out
}

fn operation(path: &str, method: &str, op: &Value) -> String {
    let id = op["operationId"].as_str().unwrap_or_default().replace('_', "-");
    let mut out = format!("\n### `{} {path}` {{#{id}}}\n\n", method.to_uppercase());
    if let Some(summary) = op["summary"].as_str() {
        out += &format!("{}\n\n", summary.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    if let Some(d) = op["description"].as_str() {
        out += &format!("{}\n\n", d.trim());
    }
    if op.get("security").and_then(Value::as_array).is_some_and(|s| !s.is_empty()) {
        out += "Needs `Authorization: Bearer <server.api_token>`.\n\n";
    }
    let params: Vec<Vec<String>> = op["parameters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            vec![
                format!("`{}`", p["name"].as_str().unwrap_or_default()),
                p["in"].as_str().unwrap_or_default().to_owned(),
                type_name(&p["schema"]),
                if p["required"].as_bool() == Some(true) { "yes".into() } else { "no".into() },
                cell(p["description"].as_str().unwrap_or_default()),
            ]
        })
        .collect();
    if !params.is_empty() {
        out += &table(&["parameter", "in", "type", "required", "meaning"], &params);
        out += "\n";
    }
    let answers: Vec<Vec<String>> = op["responses"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(status, r)| {
            let body = r["content"].as_object().and_then(|c| c.values().next()).map(|m| type_name(&m["schema"]));
            let headers = r["headers"].as_object().map(|h| h.keys().map(|k| format!("`{k}`")).collect::<Vec<_>>());
            let mut what = cell(r["description"].as_str().unwrap_or_default());
            if let Some(h) = headers {
                what += &format!(" (headers: {})", h.join(", "));
            }
            vec![format!("`{status}`"), body.unwrap_or_default(), what]
        })
        .collect();
    out + &table(&["status", "body", "meaning"], &answers)
}

fn schema_section(name: &str, schema: &Value) -> String {
    let mut out = format!("\n### `{name}` {{#schema-{}}}\n\n", name.to_lowercase());
    if let Some(d) = schema["description"].as_str() {
        out += &format!("{}\n\n", cell(d).replace("<br><br>", "\n\n"));
    }
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", v.as_str().unwrap_or_default())).collect();
        return out + &format!("One of {}.\n", values.join(", "));
    }
    let mut own = Map::new();
    let mut based_on = Vec::new();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        match part.get("$ref") {
            Some(_) => based_on.push(type_name(part)),
            None => own.extend(part.as_object().cloned().unwrap_or_default()),
        }
    }
    let shape = if own.is_empty() { schema.as_object().cloned().unwrap_or_default() } else { own };
    if !based_on.is_empty() {
        out += &format!("Every field of {}, and:\n\n", based_on.join(", "));
    }
    let required: Vec<&str> =
        shape.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let rows: Vec<Vec<String>> = shape
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(field, s)| {
            let optional = if required.contains(&field.as_str()) && !nullable(s) { "" } else { "?" };
            vec![format!("`{field}`{optional}"), type_name(s), cell(description(s))]
        })
        .collect();
    if rows.is_empty() { out } else { out + &table(&["field", "type", "meaning"], &rows) }
}

/// A field's description: its own, or, for a nullable reference (`oneOf` the reference and `null`),
/// the one utoipa puts beside the reference.
fn description(s: &Value) -> &str {
    let beside = || s["oneOf"].as_array()?.iter().find_map(|o| o["description"].as_str());
    s["description"].as_str().or_else(beside).unwrap_or_default()
}

fn nullable(s: &Value) -> bool {
    s["type"].as_array().is_some_and(|t| t.iter().any(|t| t == "null"))
        || s["oneOf"].as_array().is_some_and(|o| o.iter().any(|x| x["type"] == "null"))
}

/// How a schema reads in a table: `string`, `array of [EventDto](#schema-eventdto)`, ...
fn type_name(s: &Value) -> String {
    if let Some(r) = s["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) {
        return format!("[`{r}`](#schema-{})", r.to_lowercase());
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(options) = s[key].as_array() {
            let named: Vec<String> = options.iter().filter(|o| o["type"] != "null").map(type_name).collect();
            return named.join(" or ");
        }
    }
    if let Some(values) = s["enum"].as_array() {
        return values.iter().map(|v| format!("`{}`", v.as_str().unwrap_or("null"))).collect::<Vec<_>>().join(" \\| ");
    }
    let kind = match &s["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => {
            ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect::<Vec<_>>().join(" or ")
        }
        _ => return "any".into(),
    };
    match kind.as_str() {
        "array" => format!("array of {}", type_name(&s["items"])),
        "object" if s["additionalProperties"].is_object() => {
            format!("map of {}", type_name(&s["additionalProperties"]))
        }
        "string" if s["format"] == "date-time" => "string (RFC 3339)".into(),
        "integer" => "integer".into(),
        other => other.to_owned(),
    }
}
