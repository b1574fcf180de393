//! The shipped Prometheus alerting rules (`deploy/prometheus/`) and Grafana dashboard (`deploy/grafana/`):
//! promtool (Debian's `prometheus` package) accepts the rules and passes their unit tests, every dashboard
//! query is valid PromQL, the dashboard has the shape Grafana loads, and every metric either of them names
//! is one vipwatch exports — a renamed metric cannot leave a silent alert behind.

#[path = "common/require.rs"]
mod require;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use vipwatch::metrics::Metrics;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

const RULES: &str = "deploy/prometheus/vipwatch.rules.yml";
const RULE_TESTS: &str = "deploy/prometheus/vipwatch.rules.test.yml";
const DASHBOARD: &str = "deploy/grafana/vipwatch-dashboard.json";

/// Runs `promtool` with `args`; panics with its output unless it exits 0.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("promtool on PATH (Debian: apt-get install prometheus; README: Two commands)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// Every sample name vipwatch can export, with the suffixes each metric type's samples carry. A
/// labelled family renders nothing before its first sample, so the names come from the registrations
/// in `src/metrics.rs` (`registry.register("name", help, m.field.clone())`) and the type from the
/// field's declaration; the metrics a fresh registry renders must agree with them.
fn exported() -> BTreeSet<String> {
    let source = std::fs::read_to_string(repo("src/metrics.rs")).unwrap();
    let flat: String = source.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut names = BTreeSet::new();
    for call in flat.split("registry.register(").skip(1) {
        let name = call.split('"').nth(1).expect("a quoted metric name");
        let field = call.split("m.").nth(1).and_then(|f| f.split('.').next()).expect("m.field.clone()");
        let declared = flat.split(&format!("pub {field}: ")).nth(1).expect("the field is declared");
        let kind = declared.split([';', '}', '/']).next().unwrap();
        let suffixes: &[&str] = if kind.contains("Counter") {
            &["_total", "_created"]
        } else if kind.contains("Histogram") {
            &["_bucket", "_sum", "_count", "_created"]
        } else {
            &[""]
        };
        names.extend(suffixes.iter().map(|s| format!("vipwatch_{name}{s}")));
    }
    for line in Metrics::new().render().lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let sample = line.split(['{', ' ']).next().unwrap();
        assert!(names.contains(sample), "{sample} is rendered but not found in src/metrics.rs: {names:?}");
    }
    names
}

/// `vipwatch_…` identifiers in `text`.
fn named(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("vipwatch_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo(DASHBOARD)).unwrap()).expect("the dashboard is JSON")
}

/// Every panel query, with Grafana's interval variables replaced by what Grafana substitutes.
fn dashboard_queries(dash: &Value) -> Vec<String> {
    let mut queries = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("each target has an expr");
            queries.push(expr.replace("$__rate_interval", "5m").replace("$instance", ".*"));
        }
    }
    queries
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let Some(_promtool) = require::require_tool("promtool") else { return };
    let checked = promtool(&["check", "rules", repo(RULES).to_str().unwrap()]);
    let alerts = std::fs::read_to_string(repo(RULES)).unwrap().matches("- alert: ").count();
    assert!(checked.contains(&format!("SUCCESS: {alerts} rules found")), "{checked}");
    let tested = promtool(&["test", "rules", repo(RULE_TESTS).to_str().unwrap()]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_alert_has_a_unit_test_and_a_row_in_the_monitoring_guide() {
    let rules: Value = serde_norway::from_str(&std::fs::read_to_string(repo(RULES)).unwrap()).unwrap();
    let tests = std::fs::read_to_string(repo(RULE_TESTS)).unwrap();
    let alerts_page = std::fs::read_to_string(repo("docs/how-to/monitoring.md")).unwrap();
    for rule in rules["groups"][0]["rules"].as_array().unwrap() {
        let alert = rule["alert"].as_str().unwrap();
        assert!(tests.contains(&format!("alertname: {alert}\n")), "{alert} has no promtool unit test");
        let row = format!("| `{alert}` |");
        assert!(alerts_page.contains(&row), "{alert} has no row in docs/how-to/monitoring.md");
        for key in ["summary", "description"] {
            assert!(rule["annotations"][key].as_str().is_some_and(|s| !s.is_empty()), "{alert}: no {key}");
        }
        assert!(["critical", "warning"].contains(&rule["labels"]["severity"].as_str().unwrap()), "{alert}");
    }
}

#[test]
fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    let exported = exported();
    assert!(exported.contains("vipwatch_events_total"), "{exported:?}");
    let rules = std::fs::read_to_string(repo(RULES)).unwrap();
    let tests = std::fs::read_to_string(repo(RULE_TESTS)).unwrap();
    let dash = std::fs::read_to_string(repo(DASHBOARD)).unwrap();
    for (file, text) in [(RULES, rules), (RULE_TESTS, tests), (DASHBOARD, dash)] {
        let unknown: Vec<String> = named(&text).difference(&exported).cloned().collect();
        assert_eq!(unknown, Vec::<String>::new(), "{file} names metrics vipwatch does not export");
    }
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    let Some(_promtool) = require::require_tool("promtool") else { return };
    let dash = dashboard();
    let queries = dashboard_queries(&dash);
    assert_eq!(queries.len(), 24);
    // promtool parses expressions only inside rule files: one recording rule per query.
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": q}))
        .collect();
    let file = tempfile::Builder::new().suffix(".yml").tempfile().unwrap();
    let doc = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(file.path(), serde_norway::to_string(&doc).unwrap()).unwrap();
    let checked = promtool(&["check", "rules", file.path().to_str().unwrap()]);
    assert!(checked.contains(&format!("SUCCESS: {} rules found", queries.len())), "{checked}");
}

#[test]
fn the_dashboard_has_the_shape_grafana_loads() {
    let dash = dashboard();
    assert_eq!(dash["uid"], "vipwatch");
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36, "a schema Grafana 9+ loads without migration");
    let vars: Vec<&str> =
        dash["templating"]["list"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(vars, ["datasource", "instance"]);
    let mut ids = BTreeSet::new();
    for panel in dash["panels"].as_array().unwrap() {
        let id = panel["id"].as_u64().expect("every panel has a numeric id");
        assert!(ids.insert(id), "panel id {id} twice");
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(x + w <= 24 && grid["h"].as_u64().unwrap() > 0, "panel {id} outside the 24-column grid");
        match panel["type"].as_str().unwrap() {
            "row" => {}
            "stat" | "timeseries" => {
                assert_eq!(panel["datasource"]["uid"], "${datasource}", "panel {id} uses the datasource variable");
                assert!(!panel["targets"].as_array().unwrap().is_empty(), "panel {id} has no query");
            }
            other => panic!("panel {id}: unexpected type {other}"),
        }
    }
}
