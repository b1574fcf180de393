//! `vipwatch check-config` for templates: compile every endpoint's templates and render each request
//! against a sample Service (`shop/web`, whose annotation tries to break out of its JSON string),
//! shaped per event type ([`sample_payload`]), so a typo, an undefined variable or a body that is not
//! JSON fails before `serve`. Templates that read `told` render twice: with `told` none (nothing
//! acknowledged yet) and with [`sample_told`].

use serde_json::{Map, Value, json};

use super::{Compiled, TemplateError, event_context, full_state_context};
use crate::config::{Config, ConfigError, TEMPLATE_EVENTS, TemplateMode, WebhookConfig};

/// The sample payload templates are checked against (the default payload of a MODIFIED; the data
/// model in docs/reference/templates.md lists the same fields).
pub const SAMPLE_PAYLOAD: &str = include_str!("sample.json");

/// The cluster the sample's Service lives in (`data.cluster` of [`SAMPLE_PAYLOAD`]).
pub const SAMPLE_CLUSTER: &str = "sample-cluster";

/// The sample's Service, and a second one (`shop/api`, no VIP yet), as full-state `services`.
pub fn sample_services() -> Vec<Value> {
    let payload: Value = serde_json::from_str(SAMPLE_PAYLOAD).expect("the sample is JSON");
    let web = payload["data"]["service"].clone();
    let mut api = web.clone();
    api["name"] = json!("api");
    api["uid"] = json!("7d1c9a52-2b8e-4f0c-8d3e-51a0b7c6e911");
    api["vips"] = json!([]);
    api["ingress"] = json!([]);
    api["annotations"] = json!({});
    vec![api, web]
}

/// The sample shaped as `event`'s real payload: only a MODIFIED carries `previous`, `changed` and
/// `backendsDiff`; a SYNCED carries `sync` and no `event_id` (as `relay::router` builds it). A
/// template that reads `previous.vips` on ADDED fails here, not at its first real ADDED.
pub fn sample_payload(event: &str) -> Value {
    let mut payload: Value = serde_json::from_str(SAMPLE_PAYLOAD).expect("the sample is JSON");
    payload["type"] = json!(format!("service.{}", event.to_ascii_lowercase()));
    let data = payload["data"].as_object_mut().expect("the sample has data");
    data.insert("event".into(), json!(event));
    if event != "MODIFIED" {
        for key in ["previous", "changed", "backendsDiff"] {
            data.remove(key);
        }
    }
    if event == "SYNCED" {
        data.insert("event_id".into(), Value::Null);
        data.insert("cause".into(), json!("resync"));
        data.insert(
            "sync".into(),
            json!({"id": "0b7c3f4e-5a61-4c2d-9e8f-1a2b3c4d5e6f", "index": 1, "total": 2, "as_of_event_id": 42}),
        );
    }
    payload
}

/// What the endpoint was `told` in the sample: the sample's Service as acknowledged before, with one
/// port more (`admin`, 8080/TCP, one member) and one member more on port 80 (`10.0.0.13`), so that
/// requests over what went away since render something.
pub fn sample_told() -> Value {
    let payload: Value = serde_json::from_str(SAMPLE_PAYLOAD).expect("the sample is JSON");
    let mut told = payload["data"]["service"].clone();
    told["resourceVersion"] = json!("1200");
    let admin = json!({"name": "admin", "protocol": "TCP", "port": 8080, "targetPort": "8080", "nodePort": 30880,
                       "appProtocol": null});
    told["ports"].as_array_mut().expect("the sample has ports").push(admin);
    let member = |address: &str, port: i64| json!({"address": address, "port": port, "state": "active", "nodeName": "node-c", "zone": "z3"});
    let ports = told["backends"]["ports"].as_array_mut().expect("the sample has members");
    ports[0]["members"].as_array_mut().expect("port 80 has members").push(member("10.0.0.13", 30080));
    ports.push(json!({"name": "admin", "protocol": "TCP", "port": 8080, "members": [member("10.0.0.11", 30880)]}));
    told
}

/// Compiles the templates of every enabled endpoint of `config` and renders each request against
/// the sample (every event type, with `told` none and [`sample_told`] when a template reads it; for
/// full state, two Services). Returns one line per request rendered (`webhook: request METHOD url,
/// N body bytes`; those with [`sample_told`] when a template reads `told`). Errors:
/// [`ConfigError::Webhook`] with key `template` and the template's name, line and reason.
pub fn check_config(config: &Config) -> Result<Vec<String>, ConfigError> {
    let mut lines = Vec::new();
    for w in config.webhooks.iter().filter(|w| w.enabled && w.template.is_some()) {
        let invalid = |e: TemplateError| ConfigError::Webhook {
            name: w.name.clone(),
            key: "template".into(),
            reason: e.to_string(),
        };
        lines.extend(check_endpoint(w).map_err(invalid)?);
    }
    Ok(lines)
}

fn check_endpoint(w: &WebhookConfig) -> Result<Vec<String>, TemplateError> {
    let compiled = Compiled::new(w)?;
    let captured = sample_captures(&compiled);
    let secrets = compiled.secrets_value();
    let mut lines = Vec::new();
    let mut line = |name: &str, r: &super::Rendered| {
        let body = r.body.as_ref().map_or(0, String::len);
        let url = crate::config::redact_url(&r.url);
        lines.push(format!("{}: {name} {} {url}, {body} body bytes", w.name, r.method));
    };
    match compiled.config.mode {
        TemplateMode::Event => {
            let told = sample_told();
            for event in TEMPLATE_EVENTS {
                let payload = sample_payload(event);
                if compiled.uses_told() {
                    // Nothing acknowledged yet: checked, not printed.
                    let ctx = event_context(&payload, &w.name, &secrets, None, &captured);
                    for req in compiled.requests(event) {
                        compiled.render_all(req, &ctx).map_err(told_none)?;
                        if req.poll.is_some() {
                            compiled.render_poll(req, &ctx).map_err(told_none)?;
                        }
                    }
                }
                let told = compiled.uses_told().then_some(&told);
                let ctx = event_context(&payload, &w.name, &secrets, told, &captured);
                for req in compiled.requests(event) {
                    for r in compiled.render_all(req, &ctx)? {
                        line(&req.name, &r);
                    }
                    if req.poll.is_some() {
                        line(&format!("{}.poll", req.name), &compiled.render_poll(req, &ctx)?);
                    }
                }
            }
        }
        TemplateMode::FullState => {
            let cluster = Some(SAMPLE_CLUSTER);
            let ctx = full_state_context(
                sample_services(),
                cluster,
                "2026-12-01T10:00:00.000Z",
                &w.name,
                &secrets,
                &captured,
            );
            if let Some(req) = compiled.full_state() {
                for r in compiled.render_all(req, &ctx)? {
                    line(&req.name, &r);
                }
                if req.poll.is_some() {
                    line("full_state.poll", &compiled.render_poll(req, &ctx)?);
                }
            }
        }
    }
    Ok(lines)
}

/// `e`, saying that it happened with `told` none.
fn told_none(e: TemplateError) -> TemplateError {
    const NONE: &str = "(with `told` none: nothing acknowledged yet)";
    match e {
        TemplateError::Template { template, line, reason } => {
            TemplateError::Template { template, line, reason: format!("{reason} {NONE}") }
        }
        TemplateError::Output { template, what } => TemplateError::Output { template, what: format!("{what} {NONE}") },
        TemplateError::Setup(why) => TemplateError::Setup(why),
    }
}

/// `captured.<name>` = `"sample-<name>"` for every capture any request declares.
fn sample_captures(compiled: &Compiled) -> Map<String, Value> {
    let requests = TEMPLATE_EVENTS.iter().flat_map(|e| compiled.requests(e)).chain(compiled.full_state());
    requests.flat_map(|r| r.capture.keys()).map(|name| (name.clone(), json!(format!("sample-{name}")))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_exactly_a_default_payload() {
        let typed: vipwatch_contract::WebhookPayload = serde_json::from_str(SAMPLE_PAYLOAD).unwrap();
        let again = serde_json::to_value(&typed).unwrap();
        let original: Value = serde_json::from_str(SAMPLE_PAYLOAD).unwrap();
        assert_eq!(again, original, "the sample round-trips through the contract type");
    }
}
