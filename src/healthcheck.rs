//! `vipwatch healthcheck`: one `GET /healthz` against the running service, for container health checks
//! (the image has no curl). Success is a 2xx answer within [`TIMEOUT`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use url::Url;

/// How long the whole request may take.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// Why the service is not healthy.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// No answer: connection refused, timeout, or a broken response (the cause is the `source`).
    #[error("GET {url}")]
    Request {
        /// The URL asked.
        url: Url,
        /// The transport error.
        source: reqwest::Error,
    },
    /// An answer, but not 2xx.
    #[error("GET {url}: HTTP {status}")]
    Status {
        /// The URL asked.
        url: Url,
        /// The status received.
        status: reqwest::StatusCode,
    },
}

/// The address a local client uses to reach a server listening on `listen`: the loopback address of the
/// same family when `listen` is unspecified (`0.0.0.0`, `[::]`), else `listen` itself.
pub fn reachable(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port()),
        _ => listen,
    }
}

/// `http://<reachable(listen)>/healthz`.
pub fn healthz_url(listen: SocketAddr) -> Url {
    Url::parse(&format!("http://{}/healthz", reachable(listen))).expect("a socket address makes a valid URL")
}

/// `GET url`; `Ok` with the status when it answers 2xx within [`TIMEOUT`]. Errors: [`HealthError`].
pub async fn check(url: &Url) -> Result<reqwest::StatusCode, HealthError> {
    crate::relay::sender::install_crypto_provider();
    let failed = |source| HealthError::Request { url: url.clone(), source };
    // The process itself, never through HTTP_PROXY / HTTPS_PROXY (a proxy cannot reach its loopback).
    let client = reqwest::Client::builder().timeout(TIMEOUT).no_proxy().build().map_err(failed)?;
    let response = client.get(url.clone()).send().await.map_err(failed)?;
    let status = response.status();
    if status.is_success() { Ok(status) } else { Err(HealthError::Status { url: url.clone(), status }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_listen_address_is_checked_on_loopback() {
        assert_eq!(healthz_url("0.0.0.0:8080".parse().unwrap()).as_str(), "http://127.0.0.1:8080/healthz");
        assert_eq!(healthz_url("[::]:9000".parse().unwrap()).as_str(), "http://[::1]:9000/healthz");
        assert_eq!(healthz_url("10.1.2.3:80".parse().unwrap()).as_str(), "http://10.1.2.3/healthz");
    }

    #[tokio::test]
    async fn a_closed_port_is_unhealthy_with_the_url_in_the_reason() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = healthz_url(listener.local_addr().unwrap());
        drop(listener);
        let err = check(&url).await.unwrap_err();
        assert!(matches!(err, HealthError::Request { .. }), "{err:?}");
        assert_eq!(err.to_string(), format!("GET {url}"));
    }
}
