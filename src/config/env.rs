//! Which `VIPWATCH_*` environment variables are configuration, and which are not.
//!
//! Only two forms are read (README, "Configuration"):
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
//! `enableServiceLinks`); their names never hold a double underscore, since Service port names cannot
//! contain `--`.

use tracing::{debug, warn};

/// The prefix of every variable vipwatch reads.
pub const PREFIX: &str = "VIPWATCH_";

/// The tables of the configuration file (`[kubernetes]`, …): the `<TABLE>` of `VIPWATCH_<TABLE>__<KEY>`.
pub const TABLES: [&str; 7] = ["kubernetes", "database", "server", "relay", "backends", "webhooks", "pools"];

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

/// [`classify`] of what follows the prefix (`DATABASE__PATH` for `VIPWATCH_DATABASE__PATH`).
pub fn classify_rest(rest: &str) -> EnvVar {
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
    fn a_single_underscore_after_a_table_name_gets_a_hint() {
        let hint = |h: &str| Some(EnvVar::Ignored { hint: Some(h.into()) });
        assert_eq!(classify("VIPWATCH_DATABASE_PATH"), hint("VIPWATCH_DATABASE__PATH"));
        assert_eq!(classify("VIPWATCH_SERVER_LISTEN"), hint("VIPWATCH_SERVER__LISTEN"));
    }
}
