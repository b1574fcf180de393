//! Kubernetes label selectors (`app=web,tier!=db,env in (prod,stage),!legacy`): parsed here into
//! kube-core's [`Selector`] expressions, matched by kube-core. Syntax per the Kubernetes "Labels and
//! Selectors" concept page.

use std::collections::{BTreeMap, BTreeSet};

use kube_core::{Expression, Selector, SelectorExt};

/// A selector string that does not parse; the message says which term and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector term `{term}`: {reason}")]
pub struct SelectorError {
    /// The offending term.
    pub term: String,
    /// What is wrong.
    pub reason: &'static str,
}

/// A parsed label selector. The empty string selects everything.
#[derive(Debug, Clone, Default)]
pub struct LabelSelector(Selector);

impl LabelSelector {
    /// Parses comma-separated terms: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`.
    /// Errors: [`SelectorError`] naming the first bad term.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let terms = split_terms(s);
        let exprs: Result<Vec<Expression>, SelectorError> = terms.iter().map(|t| parse_term(t)).collect();
        Ok(Self(exprs?.into_iter().collect()))
    }

    /// Whether `labels` satisfy every term.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.matches(labels)
    }

    /// [`Self::matches`] for labels held in another map (vipwatch's sorted vectors): the pairs are
    /// copied into a `BTreeMap` for kube-core only when some term needs them; an empty selector
    /// matches without looking.
    /// Takes pairs of anything that reads as a string (`String`, `CompactString`).
    pub fn matches_pairs<K, V>(&self, labels: impl IntoIterator<Item = (K, V)>) -> bool
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        self.0.selects_all()
            || self
                .0
                .matches(&labels.into_iter().map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned())).collect())
    }
}

/// Splits on commas outside parentheses, dropping empty terms.
fn split_terms(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()).collect()
}

fn parse_term(term: &str) -> Result<Expression, SelectorError> {
    let err = |reason| SelectorError { term: term.to_owned(), reason };
    let key = |k: &str| {
        let k = k.trim();
        let ok = !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
        if ok { Ok(k.to_owned()) } else { Err(err("bad key")) }
    };
    if let Some(rest) = term.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(key(rest)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Expression::NotEqual(key(k)?, v.trim().to_owned()));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Expression::Equal(key(k)?, v.trim().to_owned()));
    }
    for (op, notin) in [(" notin ", true), (" in ", false)] {
        if let Some((k, set)) = term.split_once(op) {
            let set = set.trim().strip_prefix('(').and_then(|s| s.strip_suffix(')')).ok_or(err("expected (a,b)"))?;
            let values: BTreeSet<String> =
                set.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect();
            return Ok(if notin { Expression::NotIn(key(k)?, values) } else { Expression::In(key(k)?, values) });
        }
    }
    Ok(Expression::Exists(key(term)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_operator_matches_as_kubernetes_does() {
        let l = labels(&[("app", "web"), ("env", "prod")]);
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app=web,env in (prod, stage)", true),
            ("env notin (prod)", false),
            ("tier notin (db)", true),
            ("app", true),
            ("!app", false),
            ("!tier", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
    }

    #[test]
    fn bad_terms_are_named() {
        let e = LabelSelector::parse("app=web,env in prod").unwrap_err();
        assert_eq!(e.to_string(), "invalid label selector term `env in prod`: expected (a,b)");
        assert!(LabelSelector::parse("a b=c").is_err());
    }
}
