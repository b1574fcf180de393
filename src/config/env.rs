//! Which `VIPWATCH_*` environment variables are configuration, and which are not.
//!
//! Only two forms are read (docs/reference/environment.md):
//! - `VIPWATCH_<TABLE>__<KEY>` (double underscore between table and key, e.g. `VIPWATCH_DATABASE__PATH`):
//!   the key `table.key`. A table or key that does not exist is still an error, so a typo cannot pass
//!   silently;
//! - the named variables: `VIPWATCH_API_TOKEN` (= `server.api_token`), and `VIPWATCH_CONFIG` and
//!   `VIPWATCH_LOG`, which the CLI and the logger read and which are not keys.
//!
//! Every other `VIPWATCH_*` variable belongs to someone else and is ignored (a debug line; a warning
//! when it looks like a mistyped key, e.g. `VIPWATCH_DATABASE_PATH`). Kubernetes injects such variables
//! into every pod: for the Service `vipwatch` the kubelet sets `VIPWATCH_SERVICE_HOST`,
//! `VIPWATCH_PORT=tcp://…`, `VIPWATCH_PORT_8080_TCP_ADDR` and so on (service links,
//! `enableServiceLinks`), and Docker's `--link` sets `VIPWATCH_ENV_…` and `VIPWATCH_NAME`. A Service
//! name may hold `--` (`vipwatch-relay--blue` gives `VIPWATCH_RELAY__BLUE_SERVICE_HOST`), so a name
//! with a double underscore that has the shape of such a variable ([`is_link_shaped`]) is ignored
//! too — unless it names a real key ([`known`] decides; `VIPWATCH_BACKENDS__KUBE_PROXY_HEALTH_PORT`
//! ends in `_PORT` and is one).

use tracing::{debug, warn};

/// The prefix of every variable vipwatch reads.
pub const PREFIX: &str = "VIPWATCH_";

/// The tables of the configuration file (`[kubernetes]`, …): the `<TABLE>` of `VIPWATCH_<TABLE>__<KEY>`.
/// Every top-level key of [`super::Config`], which a test checks against the config's schema.
pub const TABLES: [&str; 9] =
    ["kubernetes", "database", "server", "relay", "backends", "webhooks", "pools", "guard", "cluster"];

/// How one environment variable is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvVar {
    /// Configuration: the dotted, lower-case key it sets (e.g. `database.path`).
    Key(String),
    /// `VIPWATCH_CONFIG` or `VIPWATCH_LOG`: read elsewhere, not a key.
    Named,
    /// Not vipwatch's: ignored. `hint` names the key it probably meant, when it looks like a mistyped
    /// `VIPWATCH_<TABLE>__<KEY>` (one underscore instead of two).
    Ignored {
        /// e.g. `VIPWATCH_DATABASE__PATH`.
        hint: Option<String>,
    },
}

/// Classifies the variable `name`; `None` when it does not start with `VIPWATCH_` (compared
/// case-insensitively, as environment overrides always were).
pub fn classify(name: &str) -> Option<EnvVar> {
    let prefix = name.get(..PREFIX.len())?;
    if !prefix.eq_ignore_ascii_case(PREFIX) {
        return None;
    }
    Some(classify_rest(&name[PREFIX.len()..]))
}

/// Whether `lower` (a lower-case name after the prefix) has the shape of a Kubernetes service-link
/// variable (`…_service_host`, `…_service_port[_<port name>]`, `…_port`,
/// `…_port_<number>_<tcp|udp|sctp>[_proto|_port|_addr]`) or a Docker link one (`…_env_…`, `…_name`).
pub fn is_link_shaped(lower: &str) -> bool {
    if lower.ends_with("_service_host")
        || lower.ends_with("_service_port")
        || lower.contains("_service_port_")
        || lower.ends_with("_port")
        || lower.ends_with("_name")
        || lower.starts_with("env_")
        || lower.contains("_env_")
    {
        return true;
    }
    lower.match_indices("_port_").any(|(at, _)| {
        let mut rest = lower[at + "_port_".len()..].split('_');
        let number = rest.next().is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        let proto = rest.next().is_some_and(|p| matches!(p, "tcp" | "udp" | "sctp"));
        let tail = rest.collect::<Vec<_>>();
        number && proto && matches!(tail.as_slice(), [] | ["proto" | "port" | "addr"])
    })
}

/// [`classify`] of what follows the prefix (`DATABASE__PATH` for `VIPWATCH_DATABASE__PATH`). A
/// `__` form shaped like a link variable is a key only when [`known`] says the key exists.
pub fn classify_rest(rest: &str) -> EnvVar {
    match classify_form(rest) {
        EnvVar::Key(dotted) if is_link_shaped(&rest.to_ascii_lowercase()) && !known(&dotted) => {
            EnvVar::Ignored { hint: None }
        }
        other => other,
    }
}

/// Whether `dotted` (`table.key`, lower case) is a key of the configuration: a field of one of its
/// tables, as [`Config::default`](super::Config) serializes them.
pub fn known(dotted: &str) -> bool {
    defaults().contains_key(dotted)
}

/// Whether `dotted` is a key whose value is a string (a path, URL, selector, token, …; an unset
/// optional one counts): its variable is taken as written, never parsed as a number or boolean.
pub fn is_string_key(dotted: &str) -> bool {
    matches!(dotted, "server.api_token") || defaults().get(dotted).is_some_and(|v| v.is_string() || v.is_null())
}

/// Every `table.key` of the configuration with its default value.
fn defaults() -> &'static std::collections::HashMap<String, serde_json::Value> {
    static KEYS: std::sync::OnceLock<std::collections::HashMap<String, serde_json::Value>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let defaults = serde_json::to_value(super::Config::default()).unwrap_or_default();
        let tables = defaults.as_object().cloned().unwrap_or_default();
        tables
            .into_iter()
            .flat_map(|(table, v)| {
                let keys = v.as_object().cloned().unwrap_or_default();
                keys.into_iter().map(move |(key, value)| (format!("{table}.{key}"), value))
            })
            .collect()
    })
}

/// The `VIPWATCH_*` variables of string keys ([`is_string_key`]), as written: `VIPWATCH_API_TOKEN=12345`
/// is the token "12345", not a number the loader then refuses.
#[derive(Debug, Default)]
pub struct Strings(Vec<(String, String)>);

impl Strings {
    /// The string-key variables of the process environment.
    pub fn from_env() -> Self {
        let vars = std::env::vars().filter_map(|(name, value)| match classify(&name)? {
            EnvVar::Key(dotted) if is_string_key(&dotted) => Some((dotted, value)),
            _ => None,
        });
        Self(vars.collect())
    }
}

impl figment::Provider for Strings {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named("`VIPWATCH_` environment variable(s)")
    }

    fn data(&self) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        let mut dict = figment::value::Dict::new();
        for (dotted, value) in &self.0 {
            let nested = figment::util::nest(dotted, value.clone().into());
            if let figment::value::Value::Dict(_, d) = nested {
                for (k, v) in d {
                    merge_into(&mut dict, k, v);
                }
            }
        }
        Ok(figment::Profile::Default.collect(dict))
    }
}

/// Inserts `value` at `key` of `dict`, merging nested tables.
fn merge_into(dict: &mut figment::value::Dict, key: String, value: figment::value::Value) {
    use figment::value::Value;
    match (dict.get_mut(&key), value) {
        (Some(Value::Dict(_, existing)), Value::Dict(_, new)) => {
            for (k, v) in new {
                merge_into(existing, k, v);
            }
        }
        (_, value) => {
            dict.insert(key, value);
        }
    }
}

/// The form alone: named variable, `__` key, or someone else's (with a hint).
fn classify_form(rest: &str) -> EnvVar {
    let lower = rest.to_ascii_lowercase();
    match lower.as_str() {
        "config" | "log" => return EnvVar::Named,
        "api_token" => return EnvVar::Key("server.api_token".into()),
        _ => {}
    }
    if lower.contains("__") {
        let parts: Vec<&str> = lower.split("__").collect();
        if parts.iter().all(|p| !p.is_empty()) {
            return EnvVar::Key(parts.join("."));
        }
        return EnvVar::Ignored { hint: None };
    }
    let hint = TABLES.iter().find_map(|table| {
        let key = lower.strip_prefix(table)?.strip_prefix('_').filter(|k| !k.is_empty())?;
        Some(format!("{PREFIX}{}__{}", table.to_ascii_uppercase(), key.to_ascii_uppercase()))
    });
    EnvVar::Ignored { hint }
}

/// Logs every `VIPWATCH_*` variable of the process environment that is not configuration: at debug
/// level, or as a warning naming the key it probably meant.
pub fn log_ignored() {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        match classify(&name) {
            Some(EnvVar::Ignored { hint: Some(hint) }) => warn!(
                variable = %name,
                "ignoring environment variable: not a configuration key (did you mean {hint}? keys are VIPWATCH_<TABLE>__<KEY>)"
            ),
            Some(EnvVar::Ignored { hint: None }) => {
                debug!(variable = %name, "ignoring environment variable: not a configuration key")
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Option<EnvVar> {
        Some(EnvVar::Key(k.into()))
    }

    /// A table added to the configuration is known here too, so a mistyped variable for it gets
    /// its hint.
    #[test]
    fn the_tables_are_the_configurations_top_level_keys() {
        let schema = crate::config::schema::vipwatch_schema();
        let mut keys: Vec<&str> = schema["properties"].as_object().unwrap().keys().map(String::as_str).collect();
        let mut tables = TABLES.to_vec();
        keys.sort_unstable();
        tables.sort_unstable();
        assert_eq!(tables, keys);
    }

    #[test]
    fn table_and_key_forms_are_keys_even_when_they_name_nothing() {
        assert_eq!(classify("VIPWATCH_DATABASE__PATH"), key("database.path"));
        assert_eq!(classify("VIPWATCH_KUBERNETES__NAMESPACES"), key("kubernetes.namespaces"));
        assert_eq!(classify("VIPWATCH_SEVRER__LISTEN"), key("sevrer.listen"), "the loader refuses it");
        assert_eq!(classify("VIPWATCH_API_TOKEN"), key("server.api_token"));
    }

    #[test]
    fn service_links_and_other_tools_variables_are_not_configuration() {
        for name in [
            "VIPWATCH_SERVICE_HOST",
            "VIPWATCH_SERVICE_PORT",
            "VIPWATCH_SERVICE_PORT_HTTP",
            "VIPWATCH_PORT",
            "VIPWATCH_PORT_8080_TCP",
            "VIPWATCH_PORT_8080_TCP_PROTO",
            "VIPWATCH_PORT_8080_TCP_PORT",
            "VIPWATCH_PORT_8080_TCP_ADDR",
            "VIPWATCH_METRICS_SERVICE_HOST",
            "VIPWATCH_BIN",
            "VIPWATCH___X",
        ] {
            assert_eq!(classify(name), Some(EnvVar::Ignored { hint: None }), "{name}");
        }
        assert_eq!(classify("VIPWATCH_CONFIG"), Some(EnvVar::Named));
        assert_eq!(classify("VIPWATCH_LOG"), Some(EnvVar::Named));
        assert_eq!(classify("KUBERNETES_SERVICE_HOST"), None);
    }

    #[test]
    fn service_links_of_a_service_name_with_a_double_hyphen_are_not_configuration() {
        // kubectl create service … vipwatch-relay--blue: DNS-1035 names allow `--`.
        for name in [
            "VIPWATCH_RELAY__BLUE_SERVICE_HOST",
            "VIPWATCH_RELAY__BLUE_SERVICE_PORT",
            "VIPWATCH_RELAY__BLUE_SERVICE_PORT_HTTP",
            "VIPWATCH_RELAY__BLUE_PORT",
            "VIPWATCH_RELAY__BLUE_PORT_8080_TCP",
            "VIPWATCH_RELAY__BLUE_PORT_8080_TCP_ADDR",
            "VIPWATCH_RELAY__BLUE_PORT_53_UDP_PROTO",
            "VIPWATCH_SERVER__X_ENV_PATH",
            "VIPWATCH_SERVER__X_NAME",
        ] {
            assert_eq!(classify(name), Some(EnvVar::Ignored { hint: None }), "{name}");
        }
        // Real keys that happen to look like links stay keys; other typos stay errors.
        assert_eq!(classify("VIPWATCH_BACKENDS__KUBE_PROXY_HEALTH_PORT"), key("backends.kube_proxy_health_port"));
        assert_eq!(classify("VIPWATCH_RELAY__CONCURENCY"), key("relay.concurency"));
    }

    #[test]
    fn a_single_underscore_after_a_table_name_gets_a_hint() {
        let hint = |h: &str| Some(EnvVar::Ignored { hint: Some(h.into()) });
        assert_eq!(classify("VIPWATCH_DATABASE_PATH"), hint("VIPWATCH_DATABASE__PATH"));
        assert_eq!(classify("VIPWATCH_SERVER_LISTEN"), hint("VIPWATCH_SERVER__LISTEN"));
        assert_eq!(classify("VIPWATCH_CLUSTER_NAME"), hint("VIPWATCH_CLUSTER__NAME"));
    }
}
