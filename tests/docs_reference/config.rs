//! A configuration reference page from a config file's JSON Schema: one section per TOML table, one
//! row per key with its type, default and meaning (the field's doc comment).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::markdown::{cell, table};

/// What differs between the two config pages.
pub struct Page {
    /// The page title.
    pub title: &'static str,
    /// Where the types live (for the banner).
    pub source: &'static str,
    /// The schema's file name under `docs/reference/schemas/`.
    pub schema_file: &'static str,
    /// The introduction, Markdown, between the banner and the first section.
    pub intro: &'static str,
    /// How a top-level key that is not a table is grouped: the section title and anchor, or `None`
    /// when every top-level key is a table.
    pub top_keys: Option<(&'static str, &'static str)>,
    /// The order of the top-level tables (keys within a table are in alphabetical order). Every
    /// top-level table must be listed.
    pub tables: &'static [&'static str],
    /// Shapes used in several places, by definition name: their section's heading, anchor, and the
    /// name their own tables are shown under.
    pub shared: &'static [Shared],
}

/// A shape used in several places: `(definition name, heading, anchor, path of its own tables)`.
pub type Shared = (&'static str, &'static str, &'static str, &'static str);

/// `vipwatch.toml`.
pub const VIPWATCH: Page = Page {
    title: "Configuration reference",
    source: "the config types in `src/config/`",
    schema_file: "vipwatch.schema.json",
    intro: "One TOML file (`--config FILE`, or `VIPWATCH_CONFIG`; default `vipwatch.toml` in the working \
directory when it exists). Every key is optional; an unknown key is an error. Any key can be overridden by \
an environment variable `VIPWATCH_<TABLE>__<KEY>` (double underscore between table and key), except the \
arrays of tables (`[[webhooks]]`, `[[pools]]`), which are set in the file only: see \
[Environment variables](environment.md). `vipwatch check-config` validates a file and prints the effective \
configuration with secrets redacted.\n\nDurations use humantime syntax (`\"250ms\"`, `\"10s\"`, `\"5m\"`, \
`\"24h\"`, `\"30d\"`).",
    top_keys: None,
    tables: &["cluster", "kubernetes", "database", "server", "relay", "backends", "webhooks", "pools", "guard"],
    shared: &[
        (
            "RequestTemplate",
            "A request: `[[webhooks.template.on.<EVENT>]]`, `[webhooks.template.full_state]`",
            "webhooks-template-request",
            "request",
        ),
        ("SecretRef", "A secret: `{ secret | secret_file | secret_env }`", "secret-ref", "secret"),
    ],
};

/// `vipwatch-haproxy.toml`.
pub const AGENT: Page = Page {
    title: "Agent configuration reference",
    source: "the agent's config type in `crates/haproxy-agent/src/config.rs`",
    schema_file: "vipwatch-haproxy.schema.json",
    intro: "The HAProxy agent (`vipwatch-haproxy`) reads one TOML file (`--config FILE`, or \
`VIPWATCH_HAPROXY_CONFIG`; default `vipwatch-haproxy.toml` in the working directory when it exists). Every \
key is optional but the secrets; an unknown key is an error. Any key can be overridden by an environment \
variable `VIPWATCH_HAPROXY_<KEY>` (e.g. `VIPWATCH_HAPROXY_LISTEN=0.0.0.0:9080`; lists as TOML arrays). \
`vipwatch-haproxy check-config` validates the file and prints it with secrets redacted.\n\nDurations use \
humantime syntax (`\"200ms\"`, `\"10s\"`, `\"30m\"`).",
    top_keys: Some(("Keys", "keys")),
    tables: &[],
    shared: &[],
};

/// The whole page.
pub fn page(schema: &Value, page: Page) -> String {
    let mut out = format!("# {}\n\n{}\n{}\n\n", page.title, crate::generated_by(page.source), page.intro);
    out += &format!(
        "The file's JSON Schema, generated from the same types: [`{0}`](schemas/{0}) (also \
         `docs/reference/schemas/{0}` in the repository). Editors that read schemas for TOML (taplo, the \
         Even Better TOML extension) validate and complete the file when its first line points at a copy of \
         it: `#:schema ./{0}`.\n",
        page.schema_file
    );
    let defs = schema["$defs"].as_object().cloned().unwrap_or_default();
    let mut doc = Doc { defs, shared: page.shared, ..Doc::default() };
    let root = schema.as_object().unwrap();
    match page.top_keys {
        Some((title, anchor)) => {
            let top = Section {
                heading: format!("## {title} {{#{anchor}}}"),
                anchor: anchor.to_owned(),
                path: String::new(),
                about: String::new(),
                shape: root.clone(),
            };
            out += &doc.render(&top);
        }
        None => {
            let keys: Vec<&String> = properties(root).map(|(k, _)| k).collect();
            let unlisted: Vec<_> = keys.iter().filter(|k| !page.tables.contains(&k.as_str())).collect();
            assert!(unlisted.is_empty(), "top-level tables {unlisted:?} are missing from the page's `tables` order");
            for key in page.tables {
                let mut sections = Vec::new();
                doc.nested(&format!("[{key}]"), &root["properties"][*key], 2, &mut sections);
                for s in sections {
                    out += &doc.render(&s);
                }
            }
        }
    }
    out
}

/// A section to render: one TOML table's keys.
struct Section {
    /// The Markdown heading line, with its anchor.
    heading: String,
    /// The anchor, for links to it.
    anchor: String,
    /// The dotted path of the table (`webhooks.tls`); empty at the top.
    path: String,
    /// The table's own description.
    about: String,
    /// Its schema (an object with `properties`).
    shape: Map<String, Value>,
}

#[derive(Default)]
struct Doc {
    defs: Map<String, Value>,
    shared: &'static [Shared],
    /// Definitions already given a section, with its anchor.
    done: Vec<(String, String)>,
    anchors: BTreeSet<String>,
}

impl Doc {
    /// Adds the section of `prop` (the key at dotted `path`) to `out` when it is a table or a list of
    /// tables; returns how to name its type in a row, with a link to the section.
    fn nested(&mut self, path: &str, prop: &Value, level: usize, out: &mut Vec<Section>) -> Option<String> {
        let (shape, wrap, def) = self.table_shape(prop)?;
        let list = wrap.ends_with("array of ");
        let link = |anchor: &str| format!("{wrap}[table{}](#{anchor})", if wrap.is_empty() { "" } else { "s" });
        if let Some((_, anchor)) = def.as_ref().and_then(|d| self.done.iter().find(|(n, _)| n == d)) {
            return Some(link(anchor));
        }
        let plain = path.trim_start_matches('[').trim_end_matches(']');
        let shared = def.as_deref().and_then(|d| self.shared.iter().find(|(n, ..)| *n == d));
        let (title, anchor, plain) = match shared {
            Some((_, title, anchor, path)) => ((*title).to_owned(), (*anchor).to_owned(), *path),
            None => {
                let shown = if level == 2 && list { format!("[[{plain}]]") } else { format!("[{plain}]") };
                (format!("`{shown}`"), plain.replace(['.', '_'], "-"), plain)
            }
        };
        assert!(self.anchors.insert(anchor.clone()), "two sections with the anchor {anchor}");
        let about = match shared {
            Some(_) => description(&Value::Object(shape.clone())),
            None => description(prop).or_else(|| description(&Value::Object(shape.clone()))),
        };
        let hashes = "#".repeat(level.min(4));
        if let Some(def) = def {
            self.done.push((def, anchor.clone()));
        }
        out.push(Section {
            heading: format!("{hashes} {title} {{#{anchor}}}"),
            anchor: anchor.clone(),
            path: plain.to_owned(),
            about: about.unwrap_or_default(),
            shape,
        });
        Some(link(&anchor))
    }

    /// `(object schema, how it is wrapped, its definition's name)` when `prop` is a table, a list or
    /// map of tables, or a choice of tables; the wrapping reads `""`, `"array of "`, `"table of "`,
    /// `"table of array of "`.
    fn table_shape(&self, prop: &Value) -> Option<(Map<String, Value>, String, Option<String>)> {
        let (resolved, def) = self.resolve(prop);
        if resolved.get("properties").is_some() || resolved.get("oneOf").is_some_and(all_tables) {
            return Some((resolved.as_object()?.clone(), String::new(), def));
        }
        let inner = [("array of ", resolved.get("items")), ("table of ", resolved.get("additionalProperties"))];
        for (wrap, inner) in inner {
            if let Some((shape, deeper, def)) = inner.and_then(|i| self.table_shape(i)) {
                return Some((shape, format!("{wrap}{deeper}"), def));
            }
        }
        None
    }

    /// `prop` with a `$ref` followed, and the definition's name.
    fn resolve<'a>(&'a self, prop: &'a Value) -> (&'a Value, Option<String>) {
        match prop.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
            Some(name) => (self.defs.get(name).unwrap_or(prop), Some(name.to_owned())),
            None => (prop, None),
        }
    }

    /// The section and, after it, the sections of the tables it holds.
    fn render(&mut self, s: &Section) -> String {
        let mut children = Vec::new();
        let mut out = self.render_own(s, &mut children);
        for child in children {
            out += &self.render(&child);
        }
        out
    }

    fn render_own(&mut self, s: &Section, children: &mut Vec<Section>) -> String {
        let mut out = format!("\n{}\n\n", s.heading);
        if !s.about.is_empty() {
            out += &format!("{}\n\n", s.about.trim());
        }
        if let Some(choices) = s.shape.get("oneOf").and_then(Value::as_array) {
            out += "One of:\n\n";
            for c in choices {
                let key = properties(c.as_object().unwrap()).next().map(|(k, _)| k.clone()).unwrap_or_default();
                let inner = &c["properties"][&key];
                let path = format!("{}.{key}", s.path);
                let ty = self.nested(&path, inner, 3, children).unwrap_or_else(|| self.type_name(inner));
                out += &format!("- `{key}` ({ty}): {}\n", cell(&description(c).unwrap_or_default()));
            }
            return out;
        }
        let required: Vec<&str> =
            s.shape.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let mut rows = Vec::new();
        for (key, prop) in properties(&s.shape) {
            let path = if s.path.is_empty() { key.clone() } else { format!("{}.{key}", s.path) };
            let level = if s.path.is_empty() { 2 } else { 3 };
            let nested = self.nested(&path, prop, level, children);
            let default = match prop.get("default") {
                _ if required.contains(&key.as_str()) => "required".to_owned(),
                Some(d) if d.is_object() && nested.is_some() => "see its table".to_owned(),
                Some(d) => format!("`{}`", toml_value(d)),
                None => "unset".to_owned(),
            };
            // A key with a section of its own is linked through the section's anchor.
            let name = match &nested {
                Some(_) => format!("`{key}`"),
                None => format!("<span id=\"{}-{}\"></span>`{key}`", s.anchor, key.replace('_', "-")),
            };
            let ty = nested.unwrap_or_else(|| self.type_name(prop));
            rows.push(vec![name, ty, default, cell(&description(prop).unwrap_or_default())]);
        }
        out + &table(&["key", "type", "default", "meaning"], &rows)
    }

    /// How a key's type reads in a row: `string`, `duration`, `` `event` \| `full_state` ``, ...
    fn type_name(&self, prop: &Value) -> String {
        let (resolved, def) = self.resolve(prop);
        match def.as_deref() {
            Some("Duration") => return "duration".into(),
            Some("Secret") => return "string (secret)".into(),
            _ => {}
        }
        if let Some(values) = enum_values(resolved) {
            return values.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(" \\| ");
        }
        match resolved.get("type").and_then(Value::as_str) {
            Some("array") => format!("array of {}", resolved.get("items").map_or("any".into(), |i| self.type_name(i))),
            Some("object") => match resolved.get("additionalProperties") {
                Some(v) if v.is_object() => format!("table of {}", self.type_name(v)),
                _ => "table".into(),
            },
            Some("integer") => "integer".into(),
            Some("number") => "number".into(),
            Some("boolean") => "boolean".into(),
            Some("string") => match resolved.get("format").and_then(Value::as_str) {
                Some("uri") => "URL".into(),
                _ => "string".into(),
            },
            _ => "any JSON value".into(),
        }
    }
}

/// The keys of an object schema, in order.
fn properties(shape: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
    shape.get("properties").and_then(Value::as_object).into_iter().flatten()
}

fn description(v: &Value) -> Option<String> {
    v.get("description").and_then(Value::as_str).map(str::to_owned)
}

fn all_tables(one_of: &Value) -> bool {
    one_of.as_array().is_some_and(|o| o.iter().all(|c| c.get("properties").is_some()))
}

/// The values of an enumeration (`enum`, or a `oneOf` of `const`s).
fn enum_values(v: &Value) -> Option<Vec<String>> {
    if let Some(e) = v.get("enum").and_then(Value::as_array) {
        return Some(e.iter().map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned)).collect());
    }
    let one_of = v.get("oneOf").and_then(Value::as_array)?;
    one_of
        .iter()
        .map(|c| c.get("const").or_else(|| c.get("enum").and_then(|e| e.get(0))))
        .map(|c| c.and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// A default as it would be written in TOML.
fn toml_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!("[{}]", items.iter().map(toml_value).collect::<Vec<_>>().join(", ")),
        Value::Object(map) if map.is_empty() => "{}".into(),
        Value::Object(map) => {
            let pairs: Vec<String> = map.iter().map(|(k, v)| format!("{k} = {}", toml_value(v))).collect();
            format!("{{ {} }}", pairs.join(", "))
        }
        other => other.to_string(),
    }
}
