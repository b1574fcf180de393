//! Request-template benchmark, in-process, each figure next to a baseline from the same run.
//!
//! Run: `cargo bench --bench templates` (optional args: SERVICES ROUNDS, default 10000 2000).
//!
//! - baseline: serializing the default payload (the sample MODIFIED, `WebhookPayload`) with
//!   serde_json, median per call — what a plain webhook delivery costs to build.
//! - per delivery (event mode): parsing the stored payload (and, for templates that read `told`,
//!   what the endpoint was told: the check-config sample), building the template context and
//!   rendering the request(s) of the shipped examples' MODIFIED — generic REST (one PUT), AS3
//!   per-app (one POST) and NITRO (the removals of what the sample's `told` has more, then four
//!   POSTs) — median and p99 per delivery, and the ratio to the baseline.
//! - full state: SERVICES Services (each the sample Service renamed, with its own VIP and two
//!   members per port) rendered into the shipped AS3 tenant declaration: building the Service values
//!   and the context, rendering, parsing the result as JSON (what vipwatch checks); best of 5, and
//!   the ratio to SERVICES baseline serializations. Then the process's peak RSS (VmHWM), next to
//!   its peak before the full-state renders.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use vipwatch::config::{Secret, SecretRef, WebhookConfig};
use vipwatch::template::{Compiled, SAMPLE_PAYLOAD, event_context, full_state_context, sample_told};

fn example(name: &str) -> WebhookConfig {
    #[derive(serde::Deserialize)]
    struct File {
        webhooks: Vec<WebhookConfig>,
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/templates").join(name);
    let file: File = toml::from_str(&std::fs::read_to_string(dir.join("webhook.toml")).unwrap()).unwrap();
    let mut w = file.webhooks.into_iter().next().unwrap();
    let t = w.template.as_mut().unwrap();
    t.resolve_paths(&dir);
    let inline = SecretRef { secret: Some(Secret::new("x")), ..SecretRef::default() };
    t.auth = t.auth.take().map(|a| match a {
        vipwatch::config::AuthConfig::Bearer(_) => vipwatch::config::AuthConfig::Bearer(inline.clone()),
        vipwatch::config::AuthConfig::Basic(mut b) => {
            b.password = inline.clone();
            vipwatch::config::AuthConfig::Basic(b)
        }
    });
    for s in t.secrets.values_mut() {
        *s = inline.clone();
    }
    w
}

/// Median and p99 of `f` over `rounds` calls, in microseconds (the median, not the mean: the machine is
/// shared, and one descheduled call would move a mean).
fn measure(rounds: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        f();
        times.push(t.elapsed());
    }
    times.sort();
    let p50 = times[rounds / 2].as_secs_f64() * 1e6;
    let p99 = times[(rounds * 99 / 100).min(rounds - 1)].as_secs_f64() * 1e6;
    (p50, p99)
}

fn vm_hwm_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// `n` Services shaped like the sample's, each with its own name, VIP and members.
fn services(n: usize) -> Vec<Value> {
    let payload: Value = serde_json::from_str(SAMPLE_PAYLOAD).unwrap();
    let template = payload["data"]["service"].clone();
    (0..n)
        .map(|i| {
            let mut s = template.clone();
            s["namespace"] = json!(format!("ns-{}", i % 100));
            s["name"] = json!(format!("svc-{i}"));
            s["vips"] = json!([format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255)]);
            s
        })
        .collect()
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let n = args.first().copied().unwrap_or(10_000);
    let rounds = args.get(1).copied().unwrap_or(2_000);
    let mut results = common::results::Results::new("templates");
    results.param("services", n);
    results.param("rounds", rounds);
    let typed: vipwatch_contract::WebhookPayload = serde_json::from_str(SAMPLE_PAYLOAD).unwrap();

    let (base, base_p99) = measure(rounds, || {
        std::hint::black_box(serde_json::to_string(&typed).unwrap());
    });
    println!("baseline: serde_json of the default payload: p50 {base:.2} µs, p99 {base_p99:.2} µs");
    let baseline = "serde_json of the default payload";

    for name in ["generic-rest", "f5-as3-per-app", "netscaler-nitro"] {
        let w = example(name);
        let compiled = Compiled::new(&w).unwrap();
        let secrets = compiled.secrets_value();
        // What the endpoint was told, parsed as the relay parses it from the store.
        let told_text = sample_told().to_string();
        let (p50, p99) = measure(rounds, || {
            let payload: Value = serde_json::from_str(SAMPLE_PAYLOAD).unwrap();
            let told: Option<Value> = compiled.uses_told().then(|| serde_json::from_str(&told_text).unwrap());
            let ctx = event_context(&payload, &w.name, &secrets, told.as_ref(), &Map::new());
            for req in compiled.requests("MODIFIED") {
                std::hint::black_box(compiled.render_all(req, &ctx).unwrap());
            }
        });
        let requests = compiled.requests("MODIFIED").len();
        println!(
            "per delivery, {name} ({requests} request(s)): p50 {p50:.2} µs ({:.1}× baseline), p99 {p99:.2} µs",
            p50 / base
        );
        results.compare(&format!("per delivery, {name}: p50"), p50, "µs", &format!("{baseline}: p50"), base);
        results.compare(&format!("per delivery, {name}: p99"), p99, "µs", &format!("{baseline}: p99"), base_p99);
    }
    let rss_before = vm_hwm_mib();

    let w = example("f5-as3-tenant");
    let compiled = Compiled::new(&w).unwrap();
    let secrets = compiled.secrets_value();
    let req = compiled.full_state().unwrap();
    let mut best = Duration::MAX;
    let mut bytes = 0;
    for _ in 0..5 {
        let list = services(n);
        let t = Instant::now();
        let ctx = full_state_context(list, Some("bench"), "2026-12-01T10:00:00.000Z", &w.name, &secrets, &Map::new());
        let rendered = compiled.render(req, &ctx).unwrap();
        bytes = rendered.body.as_ref().map_or(0, String::len);
        best = best.min(t.elapsed());
    }
    let ms = best.as_secs_f64() * 1e3;
    println!(
        "full state: {n} Services into the AS3 tenant: {ms:.1} ms ({:.1}× {n} baseline serializations), {:.1} MiB body",
        best.as_secs_f64() * 1e6 / (base * n as f64),
        bytes as f64 / (1024.0 * 1024.0)
    );
    let rss = vm_hwm_mib();
    println!("peak RSS (VmHWM): {rss:.1} MiB");
    let serializations = format!("{n} × {baseline}: p50");
    results.compare("full state into the AS3 tenant: best of 5", ms, "ms", &serializations, base * n as f64 / 1e3);
    results.figure("full state into the AS3 tenant: body", bytes as f64 / (1024.0 * 1024.0), "MiB");
    results.compare("peak RSS (whole process)", rss, "MiB", "the process before the full-state renders", rss_before);
    results.write();
}
