//! Request templates: compiling an endpoint's `[webhooks.template]` with minijinja, the data model
//! templates see, rendering requests, and judging the appliance's answers. Pure code: no I/O but
//! reading `body_file`s at compile time; the relay sends what this renders.
//!
//! Safety by construction: bodies render with minijinja's JSON auto-escape (every printed value is
//! serialized as JSON, so an annotation cannot break out of its string), `safe` and `autoescape`
//! blocks are refused, a rendered body must parse as JSON, undefined variables are errors, a fuel
//! budget stops runaway loops, and URL / header output may not carry CR or LF.

mod context;
mod engine;
mod filters;
mod rules;
mod sample;

pub use context::{event_context, full_state_context, service_value};
pub use engine::{Compiled, CompiledRequest, Rendered, redact, with_item};
pub use filters::environment;
pub use rules::{Judgement, capture, judge, matches, pointer_values};
pub use sample::{SAMPLE_PAYLOAD, check_config, sample_services, sample_told};

/// A template that cannot be compiled or rendered, or a request it rendered that cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A template does not compile, or failed while rendering (undefined value, out of fuel, a bad
    /// filter argument). `template` is e.g. `on.ADDED[0].body`.
    #[error("template `{template}`{}: {reason}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Template {
        /// Which template: request name and part (`url`, `headers.X`, `body`).
        template: String,
        /// 1-based line in that template, when known.
        line: Option<usize>,
        /// What went wrong.
        reason: String,
    },
    /// Rendered output that cannot be sent (a body that is not JSON, a URL that does not parse, a
    /// header value with a line break, a forbidden address).
    #[error("`{template}` rendered {what}")]
    Output {
        /// Which template.
        template: String,
        /// What is wrong with the output.
        what: String,
    },
    /// The endpoint's template settings cannot be used (unreadable `body_file`, missing secret).
    #[error("{0}")]
    Setup(String),
}

impl TemplateError {
    /// From a minijinja error of template `template`.
    pub(crate) fn from_minijinja(template: &str, e: &minijinja::Error) -> Self {
        let reason = match e.detail() {
            Some(d) => format!("{}: {d}", e.kind()),
            None => e.kind().to_string(),
        };
        Self::Template { template: template.to_owned(), line: e.line(), reason }
    }
}
