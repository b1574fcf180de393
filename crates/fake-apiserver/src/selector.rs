//! Label and field selectors as the apiserver parses them from `labelSelector` / `fieldSelector`, and the
//! combined [`Matcher`] (namespace scope + both selectors) used by lists and watches.
//!
//! Label selector grammar (comma = AND): `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`.
//! `!=` and `notin` also match objects without the label, as in Kubernetes.
//! Field selectors: `=`, `==`, `!=` on the field labels a resource allows
//! ([`super::resource::Resource::field_pointer`]; events: `super::events::field_pointer`); any other field is
//! an error ("field label not supported").

use std::collections::BTreeMap;

use serde_json::Value;

/// A parsed label selector (the crate's own parser, [`vipwatch_label_selector::LabelSelector`], which vipwatch also uses to filter
/// webhooks): all requirements must hold. Empty = matches everything.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelSelector(vipwatch_label_selector::LabelSelector);

impl LabelSelector {
    /// Parse the `labelSelector` query value. Errors are human-readable messages for a 400 Status.
    pub(crate) fn parse(s: &str) -> Result<LabelSelector, String> {
        vipwatch_label_selector::LabelSelector::parse(s).map(LabelSelector).map_err(|e| e.to_string())
    }

    /// Whether an object's `metadata.labels` (absent or `null` = no labels) satisfies the selector.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels: BTreeMap<String, String> = obj
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|l| l.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned()))).collect())
            .unwrap_or_default();
        self.0.matches(&labels)
    }
}

/// A parsed field selector: `(field path, wanted value, negate)` terms, all must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector(Vec<(&'static str, String, bool)>);

impl FieldSelector {
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
    /// `Some(ns)` for a namespaced collection (`.../namespaces/{ns}/services`), `None` for all
    /// namespaces and for cluster-scoped resources.
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

    use crate::resource::Resource;

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
        let parse = |r: Resource, s: &str| FieldSelector::parse_with(s, |f| r.field_pointer(f));
        let m = |s: &str| parse(Resource::Services, s).unwrap().matches(&o);
        assert!(m("metadata.name=a") && m("metadata.namespace==ns") && m("metadata.name!=b"));
        assert!(!m("metadata.name=a,metadata.namespace!=ns"));
        assert!(parse(Resource::Services, "status.phase=x").is_err());
        assert!(parse(Resource::Services, "spec.type=LoadBalancer").is_ok());
        assert!(parse(Resource::Nodes, "spec.type=LoadBalancer").unwrap_err().contains("not supported"));
        let node = json!({"metadata": {"name": "w1"}});
        assert!(parse(Resource::Nodes, "metadata.name=w1,metadata.namespace=").unwrap().matches(&node));
    }
}
