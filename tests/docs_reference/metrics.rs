//! The metrics reference: every metric of vipwatch and of the agent as their registries expose it
//! (name, type, labels, help).

use crate::markdown::{cell, table};

/// The whole page.
pub fn page() -> String {
    let mut out = format!(
        "# Metrics\n\n{}\nBoth binaries serve the OpenMetrics text format on `GET /metrics` (vipwatch: \
         behind the API token when `server.require_auth_for_reads` is set). Counters are shown with the \
         `_total` suffix a scrape carries; a histogram's series are `<name>_bucket`, `_sum` and `_count`. \
         The alert rules and the dashboard that use them: [Monitoring](../how-to/monitoring.md).\n",
        crate::generated_by("the metric registries (`src/metrics.rs`, `crates/haproxy-agent/src/metrics.rs`)")
    );
    out += &section("vipwatch", "vipwatch", &vipwatch::metrics::Metrics::reference_exposition());
    out +=
        &section("vipwatch-haproxy", "the HAProxy agent", &vipwatch_haproxy::metrics::Metrics::reference_exposition());
    out
}

/// One metric of an exposition.
#[derive(Debug, Default)]
pub struct Metric {
    /// As a query names it (`vipwatch_events_total`).
    pub name: String,
    /// `counter`, `gauge`, `histogram`.
    pub kind: String,
    /// Label names, in exposition order (`le` left out).
    pub labels: Vec<String>,
    /// The `# HELP` text.
    pub help: String,
}

/// The metrics of an OpenMetrics exposition in which every family has a sample.
pub fn parse(exposition: &str) -> Vec<Metric> {
    let mut out: Vec<Metric> = Vec::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push(Metric { name: name.to_owned(), help: help.replace("\\\\", "\\"), ..Metric::default() });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let last = out.last_mut().expect("TYPE after HELP");
            last.kind = rest.split_once(' ').map_or("", |(_, k)| k).to_owned();
            if last.kind == "counter" {
                last.name += "_total";
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let last = out.last_mut().expect("a sample after HELP");
            if last.labels.is_empty()
                && let Some((_, labels)) = line.split_once('{')
            {
                let labels = labels.split_once('}').map_or("", |(l, _)| l);
                last.labels = labels
                    .split(',')
                    .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_owned()))
                    .filter(|k| k != "le")
                    .collect();
            }
        }
    }
    out
}

fn section(anchor: &str, title: &str, exposition: &str) -> String {
    let rows: Vec<Vec<String>> = parse(exposition)
        .into_iter()
        .map(|m| {
            let labels = m.labels.iter().map(|l| format!("`{l}`")).collect::<Vec<_>>().join(", ");
            vec![format!("`{}`", m.name), m.kind, labels, cell(&m.help)]
        })
        .collect();
    format!("\n## Metrics of {title} {{#{anchor}}}\n\n{}", table(&["metric", "type", "labels", "meaning"], &rows))
}
