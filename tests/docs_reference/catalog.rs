//! The annotations and Kubernetes Event reasons references, from the catalogs in `src/model`.

use vipwatch::model::Reason;
use vipwatch::model::annotations::ANNOTATIONS;

use crate::markdown::{cell, table};

/// The annotations page.
pub fn annotations() -> String {
    let rows: Vec<Vec<String>> = ANNOTATIONS
        .iter()
        .map(|a| {
            let also = a.also.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
            let key = if also.is_empty() { format!("`{}`", a.key) } else { format!("`{}` (also {also})", a.key) };
            vec![key, cell(a.value), cell(a.meaning)]
        })
        .collect();
    format!(
        "# Annotations\n\n{}\nThe annotations vipwatch reads on a Service. It writes none; the one thing it puts \
         on a Service's metadata is its finalizer, `{}` (see [the finalizer](../explanation/vip-lifecycle.md)), and \
         it writes `status.loadBalancer.ingress`.\n\n{}",
        crate::generated_by("`src/model/annotations.rs`"),
        vipwatch::model::FINALIZER,
        table(&["annotation", "value", "meaning"], &rows)
    )
}

/// The Kubernetes Events page.
pub fn events() -> String {
    let rows: Vec<Vec<String>> = Reason::ALL
        .iter()
        .map(|r| {
            let kind = if r.warning() { "Warning" } else { "Normal" };
            vec![format!("`{r}`"), kind.into(), format!("`{}`", r.action()), cell(r.meaning())]
        })
        .collect();
    format!(
        "# Kubernetes Events\n\n{}\nvipwatch publishes Events about Services through `events.k8s.io/v1`, \
         reported by `{}` (repeats fold into a series). The first four reasons are the upstream service \
         controller's, used as it uses them. `kubectl describe service NAME` and `kubectl get events` show them. \
         Events wait in a queue of {} for the apiserver; past it they are dropped and counted \
         (`vipwatch_kubernetes_writes_total{{kind=\"event\",outcome=\"dropped\"}}`).\n\n{}",
        crate::generated_by("`Reason` in `src/model/notice.rs`"),
        vipwatch::publish::events::CONTROLLER,
        vipwatch::model::NOTICE_QUEUE,
        table(&["reason", "type", "action", "meaning"], &rows)
    )
}
