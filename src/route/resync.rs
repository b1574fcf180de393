//! A full resync: a `service.synced` delivery with the current view of every in-scope Service an
//! endpoint takes, then one `sync.completed`, enqueued from a snapshot of the state table.

use tracing::info;
use vipwatch_contract::SyncMarker;

use super::router::{Route, Router};
use super::{RouteError, declaration, payload};
use crate::config::Config;
use crate::model::ServiceKey;
use crate::store::{NewDelivery, ServiceRow, Store, new_msg_id, now_ms};

/// Enqueues a full resync for each named endpoint (all enabled endpoints when `only` is `None`): a
/// `service.synced` delivery with the current view and members of every in-scope Service it takes,
/// each marked with the resync's id, its index and the total, then one `sync.completed`. Returns how
/// many Services per endpoint. Each endpoint's deliveries are made from a snapshot of the state table
/// taken in the transaction that enqueues them ([`Store::enqueue_resync`]), so a change recorded
/// meanwhile is neither superseded unseen nor overtaken by an older state.
/// Errors: [`RouteError::UnknownWebhook`], [`RouteError::Store`].
pub async fn resync(store: &Store, config: &Config, only: Option<&str>) -> Result<Vec<(String, usize)>, RouteError> {
    let router = std::sync::Arc::new(Router::new(config, store.log_id())?);
    if let Some(name) = only
        && !router.routes.iter().any(|r| r.name == name)
    {
        return Err(RouteError::UnknownWebhook(name.to_owned()));
    }
    let mut out = Vec::new();
    for (i, route) in router.routes.iter().enumerate().filter(|(_, r)| only.is_none_or(|n| n == r.name)) {
        if route.full_state.is_some() {
            // One declaration of everything, due now (it renders the state table when sent).
            let n = store.services().await?.iter().filter(|s| route.accepts_service(s)).count();
            let d = declaration(&route.name, "SYNCED", std::time::Duration::ZERO, "resync", None);
            store.enqueue_full_state(d).await?;
            out.push((route.name.clone(), n));
            continue;
        }
        // The deliveries are made in the write transaction, on the store's owner of the write
        // connection: from a router of their own.
        let (shared, log_id) = (router.clone(), store.log_id().to_owned());
        let enqueued = store
            .enqueue_resync(move |as_of, services| synced(&shared, &shared.routes[i], &log_id, as_of, services))
            .await?;
        // Every Service's `service.synced`, and (unless templated) the `sync.completed`.
        out.push((route.name.clone(), enqueued - usize::from(!route.templated)));
    }
    Ok(out)
}

/// A resync's deliveries to `route` from a snapshot of the state table (`services`, with the newest
/// event id `as_of`): a `service.synced` per Service the endpoint takes, then (unless templated)
/// the `sync.completed`.
fn synced(
    router: &Router,
    route: &Route,
    log_id: &str,
    as_of: i64,
    services: &[ServiceRow],
) -> Vec<(NewDelivery, ServiceKey)> {
    let (now, as_of_event_id) = (now_ms(), Some(as_of));
    let matching: Vec<_> = services.iter().filter(|s| route.accepts_service(s)).collect();
    let (id, total) = (format!("sync_{}", uuid::Uuid::new_v4().simple()), matching.len() as u64);
    let mut deliveries: Vec<_> = matching
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let sync = SyncMarker { id: id.clone(), index: Some(i as u64 + 1), total, as_of_event_id };
            (router.synced(route, s, now, sync), s.key.clone())
        })
        .collect();
    // `sync.completed` goes on a queue of its own (no Service), so it does not wait for the others:
    // receivers count the `service.synced` of the same id up to `total`.
    let marker = SyncMarker { id, index: None, total, as_of_event_id };
    let completed = payload::render_completed(now, log_id, router.cluster(), marker);
    if !route.templated {
        let (webhook, msg_id) = (route.name.clone(), new_msg_id());
        let marker = NewDelivery { webhook, kind: "SYNCED", msg_id, payload: completed, coalesce_ms: None };
        deliveries.push((marker, ServiceKey::new("", "")));
    }
    deliveries
}

/// Resyncs every enabled endpoint whose default backend mode (its `backend_mode`, else `[backends]
/// mode`) is not the one it had when vipwatch last started: its receiver holds members in the old
/// mode, and a mode switch by configuration records no event of its own for every Service. Call it
/// once the first lists are stored (the resync then carries the new mode's members). Returns the
/// endpoints resynced. Errors: [`RouteError::Store`].
pub async fn resync_switched_modes(store: &Store, config: &Config) -> Result<Vec<String>, RouteError> {
    let modes = config
        .webhooks
        .iter()
        .filter(|w| w.enabled)
        .map(|w| (w.name.clone(), w.backend_mode.unwrap_or(config.backends.mode).as_str().to_owned()))
        .collect();
    let mut resynced = Vec::new();
    for (name, old) in store.swap_endpoint_modes(&modes).await? {
        let new = &modes[&name];
        let sent = resync(store, config, Some(&name)).await?;
        let services = sent.first().map_or(0, |s| s.1);
        info!(webhook = %name, from = %old, to = %new, services, "backend mode changed since the last start: resyncing the endpoint");
        resynced.push(name);
    }
    Ok(resynced)
}
