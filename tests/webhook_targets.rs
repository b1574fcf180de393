//! Webhook target checks: link-local and cloud-metadata targets are refused at
//! config load in every spelling and at connect time after DNS, and certificate failures of a real
//! TLS server are recorded as class `tls`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::receiver::{Receiver, SECRET};
use common::webhook;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use vipwatch::config::Config;
use vipwatch::relay::resolve::Lookup;
use vipwatch::relay::sender::{AttemptResult, Sender};

/// Loads `toml` the way `check-config` and `serve` do; the error message on refusal.
fn check_config(toml: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vipwatch.toml");
    std::fs::write(&path, toml).unwrap();
    Config::load(Some(&path)).map(|_| ()).map_err(|e| e.to_string())
}

fn endpoint(url: &str, extra: &str) -> String {
    format!("[[webhooks]]\nname = \"f5-lab\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\n{extra}")
}

#[test]
fn check_config_refuses_link_local_and_metadata_urls_in_every_spelling() {
    // (as written, as the URL parser normalises it)
    let refused = [
        ("http://169.254.169.254/latest/meta-data/", "http://169.254.169.254/latest/meta-data/"),
        ("http://2852039166/hook", "http://169.254.169.254/hook"),
        ("http://0xa9fea9fe/hook", "http://169.254.169.254/hook"),
        ("http://0251.0376.0251.0376/hook", "http://169.254.169.254/hook"),
        ("http://169.254.1.7:8080/hook", "http://169.254.1.7:8080/hook"),
        ("http://[::ffff:169.254.169.254]/hook", "http://[::ffff:a9fe:a9fe]/hook"),
        ("http://[64:ff9b::a9fe:a9fe]/hook", "http://[64:ff9b::a9fe:a9fe]/hook"),
        ("https://[fe80::1]/hook", "https://[fe80::1]/hook"),
        ("http://[fd00:ec2::254]/hook", "http://[fd00:ec2::254]/hook"),
        ("http://100.100.100.200/hook", "http://100.100.100.200/hook"),
    ];
    for (url, normalised) in refused {
        let err = check_config(&endpoint(url, "")).expect_err(url);
        let expected = format!("invalid value for `webhooks.f5-lab.url`: {normalised} points at ");
        assert!(err.contains(&expected), "{url}: {err}");
        assert!(err.contains("allow_link_local = true"), "{url}: {err}");
    }
    for url in ["http://169.254.169.254/hook", "http://[fe80::1]/hook"] {
        assert_eq!(check_config(&endpoint(url, "allow_link_local = true\n")), Ok(()), "{url} with the opt-in");
    }
    for url in
        ["http://10.0.0.7/hook", "http://[2001:db8::7]/hook", "http://127.0.0.1:8080/hook", "https://lb.example.net/"]
    {
        assert_eq!(check_config(&endpoint(url, "")), Ok(()), "{url}");
    }
}

/// A lookup answering from a fixed table (port 0, like the system resolver), else "not found".
fn table(entries: &[(&str, &[&str])]) -> Lookup {
    let entries: Vec<(String, Vec<SocketAddr>)> = entries
        .iter()
        .map(|(name, ips)| (name.to_string(), ips.iter().map(|ip| SocketAddr::new(ip.parse().unwrap(), 0)).collect()))
        .collect();
    let entries = Arc::new(entries);
    Arc::new(move |host: String| {
        let found = entries.iter().find(|(n, _)| *n == host).map(|(_, a)| a.clone());
        Box::pin(async move { found.ok_or_else(|| std::io::Error::other(format!("{host}: not in the table"))) })
    })
}

async fn attempt(sender: &Sender) -> AttemptResult {
    sender.send("msg_0123456789abcdef0123456789abcdef", "{}").await
}

fn class(r: &AttemptResult) -> Option<&str> {
    r.record.error_class
}

#[tokio::test]
async fn a_name_resolving_to_a_metadata_address_is_refused_at_connect_time() {
    let rx = Receiver::ok().await;
    let port = rx.url.split(':').nth(2).unwrap().split('/').next().unwrap().to_owned();
    let lookup = table(&[
        ("metadata.test", &["169.254.169.254"]),
        ("imds6.test", &["fd00:ec2::254", "fe80::1"]),
        ("mixed.test", &["169.254.169.254", "127.0.0.1"]),
        ("appliance.test", &["127.0.0.1"]),
    ]);
    for host in ["metadata.test", "imds6.test"] {
        let sender =
            Sender::with_lookup(&webhook("lab", &format!("http://{host}:{port}/hook")), lookup.clone()).unwrap();
        let r = attempt(&sender).await;
        assert_eq!(class(&r), Some("forbidden_address"), "{host}: {:?}", r.record.error);
        let error = r.record.error.unwrap();
        assert!(error.contains(&format!("`{host}` resolves to")) && error.contains("allow_link_local"), "{error}");
    }
    assert!(rx.hits().is_empty(), "nothing reached any receiver");
    // The allowed addresses of a name are still used; a plain name goes through.
    for host in ["mixed.test", "appliance.test"] {
        let sender =
            Sender::with_lookup(&webhook("lab", &format!("http://{host}:{port}/hook")), lookup.clone()).unwrap();
        let r = attempt(&sender).await;
        assert_eq!((r.record.status_code, class(&r)), (Some(204), None), "{host}: {:?}", r.record.error);
    }
    assert_eq!(rx.hits().len(), 2);
    // The system resolver: `localhost` is loopback, which is allowed.
    let sender = Sender::new(&webhook("lab", &format!("http://localhost:{port}/hook"))).unwrap();
    assert_eq!(attempt(&sender).await.record.status_code, Some(204));
}

/// Writes a self-signed certificate for `dns_name` and its key (PEM) into `dir` with the openssl CLI.
fn self_signed(dir: &Path, dns_name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join(format!("{dns_name}.crt")), dir.join(format!("{dns_name}.key")));
    let o = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .args(["-subj", &format!("/CN={dns_name}"), "-addext", &format!("subjectAltName=DNS:{dns_name}")])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .output()
        .expect("the openssl CLI runs");
    assert!(o.status.success(), "openssl: {}", String::from_utf8_lossy(&o.stderr));
    (cert, key)
}

/// A real TLS server on 127.0.0.1:0 presenting `cert`: it runs each handshake to its end (the client
/// aborts it) on a thread of its own. Returns the port.
fn tls_server(cert: &Path, key: &Path) -> u16 {
    vipwatch::relay::sender::install_crypto_provider();
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(cert).unwrap().collect::<Result<_, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let config = Arc::new(rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key).unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut conn = rustls::ServerConnection::new(config.clone()).unwrap();
            while conn.is_handshaking() {
                if conn.complete_io(&mut stream).is_err() {
                    break;
                }
            }
        }
    });
    port
}

#[tokio::test]
async fn certificate_failures_are_recorded_as_class_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path(), "appliance.example");
    let port = tls_server(&cert, &key);
    let url = format!("https://127.0.0.1:{port}/hook");

    // Self-signed, not trusted.
    let r = attempt(&Sender::new(&webhook("lab", &url)).unwrap()).await;
    assert_eq!(class(&r), Some("tls"), "{:?}", r.record.error);
    assert!(r.record.error.as_deref().unwrap().contains("UnknownIssuer"), "{:?}", r.record.error);

    // Trusted through `tls.ca_file`, but issued for another name than the one dialled.
    let mut w = webhook("lab", &url);
    w.tls.ca_file = Some(cert.clone());
    let r = attempt(&Sender::new(&w).unwrap()).await;
    assert_eq!(class(&r), Some("tls"), "{:?}", r.record.error);
    assert!(r.record.error.as_deref().unwrap().contains("not valid for name"), "{:?}", r.record.error);

    // A closed port stays `connect`.
    let refused = common::Refused::new();
    let r = attempt(&Sender::new(&webhook("lab", &format!("https://{}/hook", refused.addr))).unwrap()).await;
    assert_eq!(class(&r), Some("connect"), "{:?}", r.record.error);
}
