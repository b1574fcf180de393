//! Label and field selectors as the apiserver parses them from `labelSelector` / `fieldSelector`, and the
//! combined [`Matcher`] (namespace scope + both selectors) used by lists and watches.
//!
//! Label selector grammar (comma = AND): `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`.
//! `!=` and `notin` also match objects without the label, as in Kubernetes.
//! Field selectors: `metadata.name`, `metadata.namespace`, `spec.type`, `spec.clusterIP` with `=`, `==`,
//! `!=`; any other field is an error ("field label not supported").

use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed label selector: all requirements must hold. Empty = matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector(Vec<LabelReq>);

impl LabelSelector {
    /// Parse the `labelSelector` query value. Errors are human-readable messages for a 400 Status.
    pub(crate) fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        for term in split_top_level(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            reqs.push(parse_term(term).map_err(|e| format!("unable to parse requirement {term:?}: {e}"))?);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether an object's `metadata.labels` (absent or `null` = no labels) satisfies the selector.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
        })
    }
}

/// Split at commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> Result<String, String> {
    let ok = !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok { Ok(k.to_string()) } else { Err(format!("invalid label key {k:?}")) }
}

fn parse_term(term: &str) -> Result<LabelReq, String> {
    if let Some(rest) = term.strip_prefix('!') {
        return Ok(LabelReq::NotExists(valid_key(rest.trim())?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(LabelReq::NotEq(valid_key(k.trim())?, v.trim().to_string()));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(LabelReq::Eq(valid_key(k.trim())?, v.trim().to_string()));
    }
    let mut words = term.splitn(2, char::is_whitespace);
    let key = valid_key(words.next().unwrap_or("").trim())?;
    let Some(rest) = words.next().map(str::trim).filter(|r| !r.is_empty()) else {
        return Ok(LabelReq::Exists(key));
    };
    let (negate, list) = if let Some(l) = rest.strip_prefix("notin") {
        (true, l)
    } else if let Some(l) = rest.strip_prefix("in") {
        (false, l)
    } else {
        return Err(format!("unknown operator in {rest:?}"));
    };
    let inner = list
        .trim()
        .strip_prefix('(')
        .and_then(|l| l.strip_suffix(')'))
        .ok_or_else(|| "expected a parenthesised value list".to_string())?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect();
    if values.is_empty() {
        return Err("empty value list".into());
    }
    Ok(if negate { LabelReq::NotIn(key, values) } else { LabelReq::In(key, values) })
}

/// A parsed field selector: `(field path, wanted value, negate)` terms, all must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector(Vec<(&'static str, String, bool)>);

impl FieldSelector {
    /// Parse a Service `fieldSelector` query value (`metadata.name`, `metadata.namespace`, `spec.type`,
    /// `spec.clusterIP`); unsupported fields and malformed terms are errors.
    pub(crate) fn parse(s: &str) -> Result<FieldSelector, String> {
        FieldSelector::parse_with(s, |field| match field {
            "metadata.name" => Some("/metadata/name"),
            "metadata.namespace" => Some("/metadata/namespace"),
            "spec.type" => Some("/spec/type"),
            "spec.clusterIP" => Some("/spec/clusterIP"),
            _ => None,
        })
    }

    /// Parse a `fieldSelector` query value, mapping each field label to a JSON pointer with `resolve`
    /// (`None` = "field label not supported"); malformed terms are errors.
    pub(crate) fn parse_with(s: &str, resolve: impl Fn(&str) -> Option<&'static str>) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, value, negate) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, v, false)
            } else {
                return Err(format!("invalid selector: {term:?}; can't understand it"));
            };
            let field = field.trim();
            let pointer = resolve(field).ok_or_else(|| format!("field label not supported: {field}"))?;
            terms.push((pointer, value.trim().to_string(), negate));
        }
        Ok(FieldSelector(terms))
    }

    /// Whether the object satisfies every term (a missing field compares as `""`).
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(ptr, want, negate)| {
            let got = obj.pointer(ptr).and_then(Value::as_str).unwrap_or("");
            (got == want) != *negate
        })
    }
}

/// Namespace scope plus label and field selectors: what a list or watch request asks for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Matcher {
    /// `Some(ns)` for `/api/v1/namespaces/{ns}/services`, `None` for all namespaces.
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Matcher {
    /// Whether `obj` is in scope and passes both selectors.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let ns_ok = self
            .namespace
            .as_deref()
            .is_none_or(|want| obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(want));
        ns_ok && self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_operators() {
        let o = svc(json!({"app": "web", "tier": "front"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m("app=web") && m("app==web") && m("app!=db") && m("app") && m("!missing"));
        assert!(m("app in (web, db),tier notin (back)") && m("missing!=x") && m("missing notin (x)"));
        assert!(!m("app=db") && !m("!app") && !m("app in (db)") && !m("tier notin (front,x)"));
        assert!(m("") && m(" , "));
        assert!(!LabelSelector::parse("app=web").unwrap().matches(&svc(Value::Null)));
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b c").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = svc(Value::Null);
        let m = |s: &str| FieldSelector::parse(s).unwrap().matches(&o);
        assert!(m("metadata.name=a") && m("metadata.namespace==ns") && m("metadata.name!=b"));
        assert!(!m("metadata.name=a,metadata.namespace!=ns"));
        assert!(FieldSelector::parse("status.phase=x").is_err());
    }
}
