//! The DNS step of every webhook connection: names are resolved with the system
//! resolver (or an injected lookup, for tests) and addresses in the forbidden set
//! ([`crate::config::forbidden_address`]: link-local, cloud metadata) are dropped, so a name that
//! resolves only to such addresses fails with [`ForbiddenAddress`] (attempt class
//! `forbidden_address`) instead of reaching the metadata service. IP-literal URLs skip DNS; config
//! validation refuses the forbidden ones.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::config::forbidden_address;

/// Resolves a host name to socket addresses (port 0): the system resolver by default.
pub type Lookup =
    Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>> + Send + Sync>;

/// [`Lookup`] through the system resolver (`getaddrinfo` via `tokio::net::lookup_host`).
pub fn system_lookup() -> Lookup {
    Arc::new(|host: String| Box::pin(async move { Ok(tokio::net::lookup_host((host.as_str(), 0)).await?.collect()) }))
}

/// A name resolved only to forbidden addresses.
#[derive(Debug, thiserror::Error)]
#[error("`{host}` resolves to {addresses} only ({why}); set allow_link_local = true if that is really the appliance")]
pub struct ForbiddenAddress {
    /// The name looked up.
    pub host: String,
    /// The addresses it resolved to, comma-separated.
    pub addresses: String,
    /// Why the first is refused.
    pub why: &'static str,
}

/// The endpoint's resolver: `lookup`, then the forbidden addresses dropped (unless `allow_link_local`).
pub(super) struct GuardedResolver {
    pub lookup: Lookup,
    pub allow_link_local: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let (lookup, allow) = (self.lookup.clone(), self.allow_link_local);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let all = lookup(host.clone()).await?;
            let (allowed, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
                all.into_iter().partition(|a| allow || forbidden_address(a.ip()).is_none());
            if allowed.is_empty()
                && let Some(first) = refused.first()
            {
                let addresses = refused.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>().join(", ");
                let why = forbidden_address(first.ip()).unwrap_or("forbidden");
                return Err(Box::new(ForbiddenAddress { host, addresses, why }) as _);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}
