//! The delivery row of a full-state template endpoint: a marker that one declaration of every
//! Service is due. The relay renders the declaration from the state table when it sends it.

use std::time::Duration;

use serde_json::json;

use crate::store::{NewDelivery, new_msg_id};

/// A full-state delivery of `webhook` (`kind` `MODIFIED` or `SYNCED`) due in `debounce`; `why` is
/// logged in its payload (`event`, `start`, `resend`, `resync`).
pub fn declaration(
    webhook: &str,
    kind: &'static str,
    debounce: Duration,
    why: &str,
    event_id: Option<i64>,
) -> NewDelivery {
    NewDelivery {
        webhook: webhook.to_owned(),
        kind,
        msg_id: new_msg_id(),
        payload: json!({"full_state": true, "reason": why, "event_id": event_id}).to_string(),
        coalesce_ms: Some(i64::try_from(debounce.as_millis()).unwrap_or(i64::MAX)),
    }
}
