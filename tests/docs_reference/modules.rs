//! The modules of the controller and what each imports from the others, read from the source: the
//! architecture's one-way data flow is checked here, and the modules reference page is generated
//! from the same reading.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::markdown::{cell, table};

/// Imports that would break the data flow (watch → store → relay → appliance; the API reads the
/// store and writes only rows; the config is read by everyone and reads no running part), each with
/// the reason shown when the code grows one.
pub const FORBIDDEN: &[(&str, &str, &str)] = &[
    ("api", "relay", "the API reads the store and writes only rows; the relay delivers them"),
    ("api", "publish", "the API reads the store; only the leader's publisher writes to Kubernetes"),
    ("config", "watch", "the configuration is read by the running parts, not the other way round"),
    ("config", "store", "the configuration is read by the running parts, not the other way round"),
    ("config", "relay", "the configuration is read by the running parts, not the other way round"),
    ("model", "store", "the model is pure: no I/O"),
    ("model", "watch", "the model is pure: no I/O"),
    ("model", "relay", "the model is pure: no I/O"),
    ("store", "watch", "the store is written by the watch, not a reader of it"),
    ("store", "relay", "the store holds the outbox; the relay reads it"),
    ("store", "route", "routing writes rows through the store, not the other way round"),
    ("store", "api", "the API reads the store"),
    ("watch", "relay", "the watch records; the relay delivers what was recorded"),
    ("watch", "api", "the API reads what the watch recorded"),
    ("watch", "publish", "the watch records; the publisher writes back what was acknowledged"),
    ("route", "relay", "routing decides what is sent; the relay sends it"),
    ("relay", "watch", "the relay reads the store, not the watch"),
    ("relay", "api", "the relay reads the store, not the API"),
    ("publish", "relay", "the publisher reads delivery outcomes from the store"),
    ("publish", "watch", "the publisher reads what was recorded from the store"),
];

/// A module of `src/`: its first doc line and the other modules it imports.
pub struct Module {
    /// What its `//!` doc comment says first.
    pub about: String,
    /// `crate::<name>` paths used in code (comments left out).
    pub imports: BTreeSet<String>,
}

/// Every top-level module of `src/` (a folder or a file), by name.
pub fn read(src: &Path) -> BTreeMap<String, Module> {
    let mut out = BTreeMap::new();
    // Rustdoc links read as plain code on the page.
    let doc_link = regex::Regex::new(r"\[(`[^`]+`)\](\([^)]*\))?").unwrap();
    for entry in std::fs::read_dir(src).unwrap().map(Result::unwrap) {
        let path = entry.path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if matches!(name.as_str(), "lib" | "main") {
            continue;
        }
        let files = if path.is_dir() { rust_files(&path) } else { vec![path.clone()] };
        let head = if path.is_dir() { path.join("mod.rs") } else { path.clone() };
        let about = std::fs::read_to_string(&head)
            .unwrap_or_default()
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .map(|l| l.trim_start_matches("//!").trim())
            .collect::<Vec<_>>()
            .join(" ");
        let about = about.split(". ").next().unwrap_or_default().trim_end_matches('.');
        let about = doc_link.replace_all(about, "$1").into_owned();
        let mut imports = BTreeSet::new();
        for file in files {
            for line in std::fs::read_to_string(file).unwrap().lines() {
                let code = line.split("//").next().unwrap_or_default();
                for (i, _) in code.match_indices("crate::") {
                    let rest = &code[i + "crate::".len()..];
                    let module: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if !module.is_empty() && module != name {
                        imports.insert(module);
                    }
                }
            }
        }
        out.insert(name, Module { about, imports });
    }
    out
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let p = entry.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The modules page.
pub fn page(modules: &BTreeMap<String, Module>) -> String {
    let rows: Vec<Vec<String>> = modules
        .iter()
        .map(|(name, m)| {
            let imports = m.imports.iter().map(|i| format!("`{i}`")).collect::<Vec<_>>().join(", ");
            vec![format!("`src/{name}`"), cell(&m.about), imports]
        })
        .collect();
    let rules: Vec<Vec<String>> =
        FORBIDDEN.iter().map(|(from, to, why)| vec![format!("`{from}` → `{to}`"), cell(why)]).collect();
    format!(
        "# Modules\n\n{}\nThe controller's modules and what each imports from the others, read from the source. \
         The data flows one way, as [the architecture](../explanation/architecture.md) describes; a test fails \
         when the code grows one of the imports below the table.\n\n{}\n## Imports that would break the flow {{#forbidden}}\n\n{}",
        crate::generated_by("the `use crate::…` paths of `src/`"),
        table(&["module", "what it holds", "imports"], &rows),
        table(&["import", "why not"], &rules)
    )
}
