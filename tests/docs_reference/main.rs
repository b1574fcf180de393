//! The generated reference under `docs/reference/`: each page and schema is what the code generates,
//! so the docs cannot drift from it. Regenerate with `UPDATE_DOCS=1 cargo test --test docs_reference`
//! and commit the result.

mod api;
mod catalog;
mod cli;
mod config;
mod markdown;
mod metrics;
mod modules;

use std::path::PathBuf;

/// Compares `generated` with the committed file `path` (relative to the repository root); with
/// `UPDATE_DOCS` set, writes it first.
fn check(path: &str, generated: &str) {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, generated).unwrap();
    }
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        committed == generated,
        "{path} differs from what the code generates; run `UPDATE_DOCS=1 cargo test --test docs_reference` \
         and commit it"
    );
}

/// The banner every generated page starts with, under its title.
fn generated_by(source: &str) -> String {
    format!(
        "<!-- Generated from {source} by `cargo test --test docs_reference`; do not edit. Regenerate with \
         `UPDATE_DOCS=1 cargo test --test docs_reference`. -->\n"
    )
}

#[test]
fn the_configuration_reference_is_generated_from_the_config_types() {
    let schema = vipwatch::config::schema::vipwatch_schema();
    check("docs/reference/schemas/vipwatch.schema.json", &(serde_json::to_string_pretty(&schema).unwrap() + "\n"));
    check("docs/reference/configuration.md", &config::page(&schema, config::VIPWATCH));
}

#[test]
fn the_agent_configuration_reference_is_generated_from_the_agent_config_type() {
    let schema = vipwatch::config::schema::agent_schema();
    check(
        "docs/reference/schemas/vipwatch-haproxy.schema.json",
        &(serde_json::to_string_pretty(&schema).unwrap() + "\n"),
    );
    check("docs/reference/agent-configuration.md", &config::page(&schema, config::AGENT));
}

#[test]
fn the_command_line_reference_is_each_subcommands_help() {
    check("docs/reference/cli.md", &cli::page());
}

#[test]
fn the_metrics_reference_is_what_the_registries_expose() {
    for exposition in
        [vipwatch::metrics::Metrics::reference_exposition(), vipwatch_haproxy::metrics::Metrics::reference_exposition()]
    {
        let families = exposition.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let parsed = metrics::parse(&exposition);
        assert_eq!(parsed.len(), families);
        for m in &parsed {
            assert!(!m.help.is_empty() && !m.kind.is_empty(), "{m:?}");
        }
        // A family that got no sample in `reference_exposition` would show no labels: every family
        // with labels must have been given one there.
        let sampled = exposition.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count();
        assert!(sampled >= families, "every metric needs a sample in reference_exposition()");
    }
    check("docs/reference/metrics.md", &metrics::page());
}

#[test]
fn the_annotations_and_events_references_are_the_catalogs() {
    check("docs/reference/annotations.md", &catalog::annotations());
    check("docs/reference/events.md", &catalog::events());
}

#[test]
fn the_rest_api_reference_is_rendered_from_the_openapi_document() {
    let doc: serde_json::Value = serde_json::from_str(&vipwatch::api::openapi::document_json()).unwrap();
    check("docs/reference/api.md", &api::page(&doc));
}

#[test]
fn the_data_flows_one_way_and_the_modules_page_says_so() {
    let modules = modules::read(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src"));
    let broken: Vec<String> = modules::FORBIDDEN
        .iter()
        .filter(|(from, to, _)| modules.get(*from).is_some_and(|m| m.imports.contains(*to)))
        .map(|(from, to, why)| format!("src/{from} imports src/{to}: {why}"))
        .collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    check("docs/reference/modules.md", &modules::page(&modules));
}
