//! Judging an appliance's answer to a templated request: success statuses, body checks (JSON pointer
//! with `*` for every array element), captures.

use serde_json::{Map, Value};

use super::CompiledRequest;
use crate::config::Check;

/// What one response means for the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// A success status and the check (if any) holds.
    Success,
    /// A `poll.on_status` status: poll before judging.
    Poll,
    /// A `permanent` status: the delivery fails at once. The text says why.
    Permanent(String),
    /// Anything else: retry on the schedule. The text says why.
    Retry(String),
}

/// The values at `pointer` in `doc`: RFC 6901, where a `*` segment stands for every element of an
/// array (or every value of an object). Missing paths give no value.
pub fn pointer_values<'a>(doc: &'a Value, pointer: &str) -> Vec<&'a Value> {
    let mut current = vec![doc];
    for raw in pointer.split('/').skip(1) {
        let segment = raw.replace("~1", "/").replace("~0", "~");
        let mut next = Vec::new();
        for v in current {
            match (v, segment.as_str()) {
                (Value::Array(items), "*") => next.extend(items.iter()),
                (Value::Object(map), "*") => next.extend(map.values()),
                (Value::Array(items), i) => next.extend(i.parse::<usize>().ok().and_then(|i| items.get(i))),
                (Value::Object(map), k) => next.extend(map.get(k)),
                _ => {}
            }
        }
        current = next;
    }
    current
}

/// Whether `doc` satisfies `check`: at least one value at the pointer, each passing the test.
pub fn matches(check: &Check, doc: &Value) -> bool {
    let values = pointer_values(doc, &check.pointer);
    !values.is_empty()
        && values.iter().all(|v| {
            check.equals.as_ref().is_none_or(|e| loose_eq(v, e))
                && (check.one_of.is_empty() || check.one_of.iter().any(|e| loose_eq(v, e)))
                && check.not_equals.as_ref().is_none_or(|e| !loose_eq(v, e))
        })
}

/// JSON equality where numbers compare by value (`200` equals `200.0`).
fn loose_eq(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Judges `status` + `body` for `req`.
pub fn judge(req: &CompiledRequest, status: u16, body: &[u8]) -> Judgement {
    if req.poll.as_ref().is_some_and(|p| p.on_status.contains(&status)) {
        return Judgement::Poll;
    }
    let success = if req.success.is_empty() { (200..300).contains(&status) } else { req.success.contains(&status) };
    if success {
        let Some(check) = &req.check else { return Judgement::Success };
        let doc: Value = match serde_json::from_slice(body) {
            Ok(doc) => doc,
            Err(e) => return Judgement::Retry(format!("HTTP {status}, but the body is not JSON for the check: {e}")),
        };
        if matches(check, &doc) {
            return Judgement::Success;
        }
        let found: Vec<String> = pointer_values(&doc, &check.pointer).iter().map(|v| v.to_string()).collect();
        return Judgement::Retry(format!(
            "HTTP {status}, but the check on {} failed (found [{}])",
            check.pointer,
            found.join(", ")
        ));
    }
    // The appliance's own reason, when its body gives one, says more than the status.
    let why = crate::model::bounded::reason(body).map(|r| format!(": {r}")).unwrap_or_default();
    if req.permanent.contains(&status) {
        return Judgement::Permanent(format!("HTTP {status}: permanent for this request{why}"));
    }
    Judgement::Retry(format!("HTTP {status}: not a success status for this request{why}"))
}

/// The `capture` values of `req` found in the JSON `body`, added to `into`. A value missing from the
/// body is skipped (a template that uses it then fails as undefined); a body that is not JSON is an
/// error.
pub fn capture(req: &CompiledRequest, body: &[u8], into: &mut Map<String, Value>) -> Result<(), String> {
    if req.capture.is_empty() {
        return Ok(());
    }
    let doc: Value = serde_json::from_slice(body).map_err(|e| format!("capture: the body is not JSON: {e}"))?;
    for (name, pointer) in &req.capture {
        if let Some(v) = doc.pointer(pointer) {
            into.insert(name.clone(), v.clone());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(pointer: &str, equals: Option<Value>, one_of: Vec<Value>, not_equals: Option<Value>) -> Check {
        Check { pointer: pointer.into(), equals, one_of, not_equals }
    }

    #[test]
    fn wildcards_cover_every_element() {
        let doc = json!({"results": [{"code": 200}, {"code": 422}]});
        assert_eq!(pointer_values(&doc, "/results/*/code"), vec![&json!(200), &json!(422)]);
        assert!(!matches(&check("/results/*/code", None, vec![json!(200)], None), &doc));
        let ok = json!({"results": [{"code": 200}, {"code": 200.0}]});
        assert!(matches(&check("/results/*/code", Some(json!(200)), vec![], None), &ok));
        assert!(!matches(&check("/missing", None, vec![], Some(json!(1))), &ok), "no value: no match");
        let task = json!({"results": [{"message": "in progress"}]});
        assert!(!matches(&check("/results/0/message", None, vec![], Some(json!("in progress"))), &task));
    }
}
