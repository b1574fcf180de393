//! JSON Patch (RFC 6902, `application/json-patch+json`): `add`, `remove`, `replace`, `move`, `copy`,
//! `test`. As in the apiserver's json-patch library, `test` with `value: null` succeeds on a missing path
//! (kube-runtime's finalizer helper relies on that).

use serde_json::Value;

/// Why a patch could not be applied: the body is not a valid patch document (HTTP 400), or an operation
/// failed against the object (HTTP 422).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JsonPatchError {
    /// The body is not a valid JSON patch document (→ 400 `BadRequest`).
    Malformed(String),
    /// An operation does not apply to the object, e.g. a failed `test` (→ 422).
    Failed(String),
}

/// Apply the operations in `ops` (a JSON array) to `doc` in order; on error `doc` may be partly patched
/// (callers patch a copy).
pub(crate) fn apply(doc: &mut Value, ops: &Value) -> Result<(), JsonPatchError> {
    let malformed = |m: String| JsonPatchError::Malformed(m);
    let ops = ops.as_array().ok_or_else(|| malformed("a JSON patch must be a JSON array of operations".into()))?;
    for (i, op) in ops.iter().enumerate() {
        let field = |k: &str| op.get(k).and_then(Value::as_str);
        let name = field("op").ok_or_else(|| malformed(format!("operation {i}: missing string \"op\"")))?;
        let path = field("path").ok_or_else(|| malformed(format!("operation {i}: missing string \"path\"")))?;
        let path = parse_pointer(path).map_err(malformed)?;
        let value = || op.get("value").cloned().ok_or_else(|| malformed(format!("operation {i}: missing \"value\"")));
        let from = || {
            let f = field("from").ok_or_else(|| malformed(format!("operation {i}: missing string \"from\"")))?;
            parse_pointer(f).map_err(malformed)
        };
        let failed = |m: String| JsonPatchError::Failed(format!("{name} operation does not apply: {m}"));
        match name {
            "add" => add(doc, &path, value()?).map_err(failed)?,
            "remove" => drop(remove(doc, &path).map_err(failed)?),
            "replace" => {
                let v = value()?;
                *get_mut(doc, &path).ok_or_else(|| failed(format!("doc is missing path: {}", show(&path))))? = v;
            }
            "move" => {
                let from = from()?;
                if path.len() > from.len() && path[..from.len()] == from[..] {
                    return Err(failed("a value cannot be moved into one of its children".into()));
                }
                let v = remove(doc, &from).map_err(failed)?;
                add(doc, &path, v).map_err(failed)?;
            }
            "copy" => {
                let from = from()?;
                let v =
                    get(doc, &from).cloned().ok_or_else(|| failed(format!("doc is missing path: {}", show(&from))))?;
                add(doc, &path, v).map_err(failed)?;
            }
            "test" => {
                let want = op.get("value").cloned().unwrap_or(Value::Null);
                let got = get(doc, &path).cloned().unwrap_or(Value::Null);
                if got != want {
                    return Err(JsonPatchError::Failed(format!("testing value {} failed: test failed", show(&path))));
                }
            }
            other => return Err(malformed(format!("unexpected kind of operation: {other:?}"))),
        }
    }
    Ok(())
}

/// Split a JSON pointer into unescaped tokens (`""` = the whole document).
fn parse_pointer(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p.strip_prefix('/').ok_or_else(|| format!("JSON pointer must be empty or start with '/': {p:?}"))?;
    Ok(rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect())
}

fn show(path: &[String]) -> String {
    path.iter().map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1"))).collect()
}

fn index(token: &str, len: usize, allow_end: bool) -> Option<usize> {
    if token.is_empty() || (token.len() > 1 && token.starts_with('0')) || !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let i: usize = token.parse().ok()?;
    (i < len || (allow_end && i == len)).then_some(i)
}

fn get<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get(t),
        Value::Array(a) => a.get(index(t, a.len(), false)?),
        _ => None,
    })
}

fn get_mut<'a>(doc: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get_mut(t),
        Value::Array(a) => {
            let i = index(t, a.len(), false)?;
            a.get_mut(i)
        }
        _ => None,
    })
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parent)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    match get_mut(doc, parent) {
        Some(Value::Object(m)) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let i = if last == "-" { Some(a.len()) } else { index(last, a.len(), true) };
            let i = i.ok_or_else(|| format!("invalid array index {last:?} at {}", show(path)))?;
            a.insert(i, value);
            Ok(())
        }
        _ => Err(format!("doc is missing path: {}", show(path))),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, String> {
    let (last, parent) = path.split_last().ok_or_else(|| "cannot remove the whole document".to_string())?;
    let missing = || format!("doc is missing path: {}", show(path));
    match get_mut(doc, parent) {
        Some(Value::Object(m)) => m.remove(last).ok_or_else(missing),
        Some(Value::Array(a)) => {
            let i = index(last, a.len(), false).ok_or_else(missing)?;
            Ok(a.remove(i))
        }
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(doc: Value, ops: Value) -> Result<Value, JsonPatchError> {
        let mut d = doc;
        apply(&mut d, &ops).map(|()| d)
    }

    #[test]
    fn finalizer_patches_as_kube_runtime_sends_them() {
        let svc = json!({"metadata": {"name": "a"}});
        let add = json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                         {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}]);
        let with = run(svc, add.clone()).unwrap();
        assert_eq!(with["metadata"]["finalizers"], json!(["x"]));
        assert!(matches!(run(with.clone(), add), Err(JsonPatchError::Failed(_))));
        let more = json!([{"op": "test", "path": "/metadata/finalizers", "value": ["x"]},
                          {"op": "add", "path": "/metadata/finalizers/-", "value": "y"}]);
        let two = run(with, more).unwrap();
        let rm = json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "x"},
                        {"op": "remove", "path": "/metadata/finalizers/0"}]);
        assert_eq!(run(two, rm).unwrap()["metadata"]["finalizers"], json!(["y"]));
    }

    #[test]
    fn other_operations_and_errors() {
        let doc = json!({"a": {"b~c": 1, "d/e": [1, 2]}});
        let out = run(
            doc.clone(),
            json!([{"op": "replace", "path": "/a/b~0c", "value": 2},
                   {"op": "copy", "from": "/a/d~1e/1", "path": "/a/d~1e/0"},
                   {"op": "move", "from": "/a/b~0c", "path": "/z"}]),
        )
        .unwrap();
        assert_eq!(out, json!({"a": {"d/e": [2, 1, 2]}, "z": 2}));
        assert!(matches!(run(doc.clone(), json!([{"op": "remove", "path": "/nope"}])), Err(JsonPatchError::Failed(_))));
        assert!(matches!(
            run(doc.clone(), json!([{"op": "add", "path": "/a/d~1e/9", "value": 0}])),
            Err(JsonPatchError::Failed(_))
        ));
        assert!(matches!(run(doc.clone(), json!({"op": "add"})), Err(JsonPatchError::Malformed(_))));
        assert!(matches!(run(doc, json!([{"op": "frob", "path": ""}])), Err(JsonPatchError::Malformed(_))));
    }
}
