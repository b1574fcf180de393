//! Appliance-assigned VIPs: an endpoint with `assigns_vip = true` answers a delivery with
//! `{"vips": ["203.0.113.7", "2001:db8::7"]}` or `{"hostname": "lb-42.example.net"}`, and that becomes
//! the Service's address.

use serde::Deserialize;

use crate::model::Assignment;
use crate::model::bounded::{QUOTE, bounded};
use crate::store::Claimed;

/// The most addresses an appliance may assign one Service (a dual-stack VIP is two; a cloud load
/// balancer has one per zone): a longer list is refused, not stored.
pub const MAX_ADDRESSES: usize = 16;

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    vips: Vec<String>,
    #[serde(default)]
    hostname: Option<String>,
}

/// The assignment in a 2xx response `body` to `claimed`. `Ok(None)`: the body names no address (an
/// empty body is fine: the appliance keeps the address it gave before). Errors: a message for a body
/// that is not that JSON shape or carries an entry that is not an IP address / DNS name.
pub fn assignment(claimed: &Claimed, body: &[u8]) -> Result<Option<Assignment>, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let b: Body = serde_json::from_slice(body).map_err(|e| {
        format!("response body is not {{\"vips\"|\"hostname\"}} JSON: {}", bounded(&e.to_string(), QUOTE))
    })?;
    if b.vips.len() > MAX_ADDRESSES {
        return Err(format!("{} addresses in `vips`; at most {MAX_ADDRESSES} are taken", b.vips.len()));
    }
    if let Some(bad) = b.vips.iter().find(|v| v.parse::<std::net::IpAddr>().is_err()) {
        return Err(format!("`{}` in `vips` is not an IP address", bounded(bad, QUOTE)));
    }
    let hostname = b.hostname.filter(|h| !h.is_empty());
    if let Some(h) = &hostname
        && !is_dns_name(h)
    {
        return Err(format!("`{}` is not a DNS name", bounded(h, QUOTE)));
    }
    if b.vips.is_empty() && hostname.is_none() {
        return Ok(None);
    }
    let uid = uid_of(&claimed.payload).ok_or("the delivery's payload has no service uid")?;
    Ok(Some(Assignment { key: claimed.key.clone(), uid, addresses: b.vips, hostname }))
}

fn uid_of(payload: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(payload).ok()?;
    v.pointer("/data/service/uid")?.as_str().map(str::to_owned)
}

/// RFC 1123 host name: dot-separated labels of letters, digits and `-`, at most 253 characters.
fn is_dns_name(h: &str) -> bool {
    h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}
