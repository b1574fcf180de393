//! The minijinja environment templates render in: strict undefined, a fuel budget, JSON auto-escape
//! for bodies, no `safe` filter, the URL filters `path_segment` and `query`, `members` and
//! `without`, which let an `each` list what went away since the endpoint was `told`, and
//! `object_name`, which keeps an appliance's object names within its limits.

use minijinja::value::Rest;
use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Characters `path_segment` leaves alone: RFC 3986 unreserved (`A-Z a-z 0-9 - . _ ~`).
pub(super) const URL_PART: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// The minijinja environment every endpoint uses: strict undefined, `fuel` instructions per render,
/// JSON auto-escape for `*.body` templates, no `safe` filter, plus `path_segment`, `query`,
/// `members` and `without`.
pub fn environment(fuel: u64) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(fuel));
    env.set_auto_escape_callback(|name| if name.ends_with(".body") { AutoEscape::Json } else { AutoEscape::None });
    env.remove_filter("safe");
    env.add_filter("path_segment", path_segment);
    env.add_filter("query", query);
    env.add_filter("members", members);
    env.add_filter("without", without);
    env.add_filter("object_name", object_name);
    env
}

/// `{{ ['vs', cluster, service.namespace, service.name, item.port]|object_name(127) }}`: an object
/// name for the appliance. The parts are joined with `_` (Kubernetes names and the cluster name
/// hold no `_`, so the joined name is unambiguous), every character other than letters, digits,
/// `_`, `.` and `-` (what both NetScaler and AS3 names take) becomes `_`, and a name longer than
/// `max` characters is cut so that it ends in `_` and 8 hex digits of the SHA-256 of the whole
/// name: the same parts always give the same name, and two long names that share a prefix stay
/// apart. NetScaler names take 127 characters, AS3 tenant and application names 190.
///
/// Errors: a part that is none (an empty part would merge two names), `max` below 16.
fn object_name(parts: &Value, max: usize) -> Result<String, minijinja::Error> {
    use sha2::{Digest, Sha256};
    let invalid = |why: String| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, why);
    if max < 16 {
        return Err(invalid(format!("object_name: a maximum of {max} leaves no room for the hash")));
    }
    let mut joined = Vec::new();
    for part in parts.try_iter().map_err(|_| invalid("object_name: the value is not a list".into()))? {
        if part.is_none() || part.is_undefined() {
            return Err(invalid("object_name: a part is none".into()));
        }
        joined.push(part.as_str().map_or_else(|| part.to_string(), str::to_owned));
    }
    let name: String = joined
        .join("_")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '_' })
        .collect();
    if name.len() <= max {
        return Ok(name);
    }
    let hash = format!("{:x}", Sha256::digest(name.as_bytes()));
    Ok(format!("{}_{}", &name[..max - 9], &hash[..8]))
}

/// The value as JSON (template values are JSON already: the context is built from it).
fn json(filter: &str, value: &Value) -> Result<serde_json::Value, minijinja::Error> {
    serde_json::to_value(value).map_err(|e| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("{filter}: not a JSON value: {e}"))
    })
}

/// `{{ service|members }}`: every member of every port of a Service's `backends` (or of a
/// `backends` value itself), flat, each as a `backends_diff` entry: `servicePort`, `protocol`,
/// `address`, `port`, `state`. None, or a Service without backends, gives `[]`, so `told|members`
/// works before anything was told. An `each` can then list the members that left:
/// `told|members|without(service|members, "servicePort", "address", "port")`.
fn members(value: &Value) -> Result<Value, minijinja::Error> {
    let value = json("members", value)?;
    let backends = match value.get("backends") {
        Some(b) => b,
        None => &value,
    };
    let mut out = Vec::new();
    for p in backends.get("ports").and_then(serde_json::Value::as_array).into_iter().flatten() {
        for m in p.get("members").and_then(serde_json::Value::as_array).into_iter().flatten() {
            out.push(serde_json::json!({
                "servicePort": p["port"], "protocol": p["protocol"],
                "address": m["address"], "port": m["port"], "state": m["state"],
            }));
        }
    }
    Ok(Value::from(minijinja::value::Serde(out)))
}

/// `{{ list|without(other, "a", "b") }}`: the elements of `list` that match no element of `other`,
/// comparing the attributes named (all of them equal: a match), or whole elements when none is
/// named. A none `list` gives `[]` and a none `other` leaves `list` whole, so
/// `told.ports|without(service.ports, "port")` lists the ports that went away.
fn without(list: &Value, other: &Value, attributes: Rest<String>) -> Result<Value, minijinja::Error> {
    let (list, other) = (json("without", list)?, json("without", other)?);
    let items = |v: serde_json::Value, which: &str| match v {
        serde_json::Value::Null => Ok(Vec::new()),
        serde_json::Value::Array(items) => Ok(items),
        _ => {
            let why = format!("without: the {which} is not a list");
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, why))
        }
    };
    let (list, other) = (items(list, "value")?, items(other, "argument")?);
    let key = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        if attributes.is_empty() {
            vec![v.clone()]
        } else {
            attributes.iter().map(|a| v.get(a).cloned().unwrap_or_default()).collect()
        }
    };
    let present: Vec<Vec<serde_json::Value>> = other.iter().map(key).collect();
    let out: Vec<serde_json::Value> = list.into_iter().filter(|v| !present.contains(&key(v))).collect();
    Ok(Value::from(minijinja::value::Serde(out)))
}

/// The text of a URL filter's value; none (null) is an error: it would leave an empty segment or
/// value (`/vips//web`) rather than fail.
fn url_text(filter: &str, value: &Value) -> Result<String, minijinja::Error> {
    if value.is_none() || value.is_undefined() {
        let why = format!("{filter}: the value is none (an empty URL part is refused)");
        return Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, why));
    }
    Ok(value.as_str().map_or_else(|| value.to_string(), str::to_owned))
}

/// `{{ value|query }}`: percent-encodes like `path_segment`, for one query value (may be empty).
fn query(value: &Value) -> Result<String, minijinja::Error> {
    Ok(utf8_percent_encode(&url_text("query", value)?, URL_PART).to_string())
}

/// `{{ value|path_segment }}`: percent-encodes everything but RFC 3986 unreserved characters, `/`
/// included, so a value stays one URL path segment (or one query value).
///
/// Errors (the delivery fails as a template error): none, an empty value, `.` and `..` — URL
/// parsers resolve dot segments (RFC 3986 5.2.4), so `..` from an annotation would climb out of
/// its place in the path (`/tenants/../apps/web` is `/apps/web`).
fn path_segment(value: &Value) -> Result<String, minijinja::Error> {
    let text = url_text("path_segment", value)?;
    if matches!(text.as_str(), "" | "." | "..") {
        let why = format!("path_segment: `{text}` is not a path segment (empty and dot segments are refused)");
        return Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, why));
    }
    Ok(utf8_percent_encode(&text, URL_PART).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segment_encodes_slashes_and_reserved_characters() {
        assert_eq!(path_segment(&Value::from("a/b c?d#e%f")).unwrap(), "a%2Fb%20c%3Fd%23e%25f");
        assert_eq!(path_segment(&Value::from("web-1.shop_x~")).unwrap(), "web-1.shop_x~");
        assert_eq!(path_segment(&Value::from(42)).unwrap(), "42");
        assert_eq!(path_segment(&Value::from("...")).unwrap(), "...");
    }

    #[test]
    fn path_segment_refuses_dot_segments_empty_and_none_and_query_only_none() {
        for bad in [Value::from(".."), Value::from("."), Value::from(""), Value::from(())] {
            let e = path_segment(&bad).unwrap_err();
            assert_eq!(e.kind(), minijinja::ErrorKind::InvalidOperation, "{bad:?}");
        }
        assert_eq!(query(&Value::from("")).unwrap(), "");
        assert_eq!(query(&Value::from("..")).unwrap(), "..");
        assert_eq!(query(&Value::from(())).unwrap_err().kind(), minijinja::ErrorKind::InvalidOperation);
    }

    #[test]
    fn the_safe_filter_is_gone_and_undefined_is_an_error() {
        let mut env = environment(10_000);
        env.add_template_owned("t.body", "{{ x|safe }}").unwrap();
        let e = env.get_template("t.body").unwrap().render(minijinja::context! { x => "1" }).unwrap_err();
        assert_eq!(e.kind(), minijinja::ErrorKind::UnknownFilter);
        env.add_template_owned("u.body", "{{ svc.nmae }}").unwrap();
        let e = env
            .get_template("u.body")
            .unwrap()
            .render(minijinja::context! { svc => minijinja::context!{ name => "w" } });
        assert_eq!(e.unwrap_err().kind(), minijinja::ErrorKind::UndefinedError);
    }

    /// Renders `expr` (as JSON) with `ctx`.
    fn eval(expr: &str, ctx: serde_json::Value) -> Result<serde_json::Value, minijinja::Error> {
        let mut env = environment(100_000);
        env.add_template_owned("t", format!("{{{{ ({expr})|tojson }}}}")).unwrap();
        let out = env.get_template("t").unwrap().render(Value::from(minijinja::value::Serde(&ctx)))?;
        Ok(serde_json::from_str(&out).unwrap())
    }

    #[test]
    fn without_lists_what_is_in_one_list_and_not_the_other_by_the_attributes_named() {
        let ctx = serde_json::json!({
            "told": {"ports": [{"port": 80, "protocol": "TCP"}, {"port": 81, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]},
            "service": {"ports": [{"port": 81, "protocol": "TCP", "name": "x"}, {"port": 53, "protocol": "TCP"}]},
            "none_told": null,
        });
        let gone = eval("told.ports|without(service.ports, 'port')", ctx.clone()).unwrap();
        assert_eq!(gone, serde_json::json!([{"port": 80, "protocol": "TCP"}]));
        let gone = eval("told.ports|without(service.ports, 'port', 'protocol')", ctx.clone()).unwrap();
        assert_eq!(gone, serde_json::json!([{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]));
        assert_eq!(eval("[1, 2, 3]|without([2])", ctx.clone()).unwrap(), serde_json::json!([1, 3]), "whole values");
        assert_eq!(eval("none_told|without(service.ports, 'port')", ctx.clone()).unwrap(), serde_json::json!([]));
        assert_eq!(eval("[1]|without(none)", ctx.clone()).unwrap(), serde_json::json!([1]));
        assert_eq!(
            eval("(none_told.ports if none_told else [])|without(service.ports, 'port')", ctx.clone()).unwrap(),
            serde_json::json!([])
        );
        let e = eval("service|without([])", ctx).unwrap_err();
        assert_eq!(e.detail(), Some("without: the value is not a list"));
    }

    #[test]
    fn members_flattens_a_services_backends_in_the_shape_of_backends_diff() {
        let m = |address: &str, port: i64| serde_json::json!({"address": address, "port": port, "state": "active", "nodeName": "n", "zone": null});
        let backends = serde_json::json!({"mode": "nodePort", "ports": [
            {"name": "http", "protocol": "TCP", "port": 80, "members": [m("10.0.0.1", 30080), m("10.0.0.2", 30080)]},
            {"name": "dns", "protocol": "UDP", "port": 53, "members": [m("10.0.0.1", 30053)]},
        ]});
        let ctx = serde_json::json!({"service": {"backends": backends.clone()}, "backends": backends,
                                     "bare": {"backends": null}, "told": null});
        let flat = eval("service|members", ctx.clone()).unwrap();
        let entry = |sp: i64, proto: &str, address: &str, port: i64| serde_json::json!({"servicePort": sp, "protocol": proto, "address": address, "port": port, "state": "active"});
        assert_eq!(
            flat,
            serde_json::json!([
                entry(80, "TCP", "10.0.0.1", 30080),
                entry(80, "TCP", "10.0.0.2", 30080),
                entry(53, "UDP", "10.0.0.1", 30053)
            ])
        );
        assert_eq!(eval("backends|members", ctx.clone()).unwrap(), flat, "a backends value itself");
        assert_eq!(eval("told|members", ctx.clone()).unwrap(), serde_json::json!([]), "none");
        assert_eq!(eval("bare|members", ctx.clone()).unwrap(), serde_json::json!([]), "backend mode none");
        let left = eval("service|members|without([{'servicePort': 80, 'address': '10.0.0.1', 'port': 30080}], 'servicePort', 'address', 'port')", ctx).unwrap();
        assert_eq!(left, serde_json::json!([entry(80, "TCP", "10.0.0.2", 30080), entry(53, "UDP", "10.0.0.1", 30053)]));
    }

    #[test]
    fn object_names_join_sanitise_and_shorten_stably_within_the_limit() {
        let ctx = serde_json::json!({"cluster": "prod-eu1", "ns": "shop", "name": "web", "port": 8080});
        let short = eval("['vs', cluster, ns, name, port]|object_name(127)", ctx.clone()).unwrap();
        assert_eq!(short, serde_json::json!("vs_prod-eu1_shop_web_8080"));
        assert_eq!(eval("['a b', 'c/d']|object_name(127)", ctx.clone()).unwrap(), serde_json::json!("a_b_c_d"));
        let long = |name: &str| {
            let ctx = serde_json::json!({"cluster": "c".repeat(63), "ns": "n".repeat(63), "name": name, "port": 65535});
            eval("['vs', cluster, ns, name, port]|object_name(127)", ctx).unwrap().as_str().unwrap().to_owned()
        };
        let (a, b) = (long(&"a".repeat(63)), long(&format!("{}b", "a".repeat(62))));
        assert_eq!((a.len(), b.len()), (127, 127));
        assert_eq!(a[..118], b[..118], "the same readable prefix");
        assert_ne!(a, b, "the hash keeps them apart");
        assert_eq!(long(&"a".repeat(63)), a, "stable");
        assert!(a[118..].starts_with('_') && a[119..].chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        let e = eval("['vs', none]|object_name(127)", ctx.clone()).unwrap_err();
        assert_eq!(e.detail(), Some("object_name: a part is none"));
        let e = eval("['vs']|object_name(8)", ctx).unwrap_err();
        assert_eq!(e.detail(), Some("object_name: a maximum of 8 leaves no room for the hash"));
    }

    #[test]
    fn fuel_stops_a_runaway_loop() {
        let mut env = environment(10_000);
        env.add_template_owned("t.body", "[{% for i in range(100000) %}{{ i }},{% endfor %}0]").unwrap();
        let e = env.get_template("t.body").unwrap().render(()).unwrap_err();
        assert_eq!(e.kind(), minijinja::ErrorKind::OutOfFuel);
    }
}
