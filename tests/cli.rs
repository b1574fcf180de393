//! The `vipwatch` binary's command line: config validation exits 2 with one message naming the key.

#[path = "common/require.rs"]
mod require;

use std::collections::BTreeSet;
use std::io::BufRead;
use std::process::{Command, Output, Stdio};

fn vipwatch(args: &[&str], env: &[(&str, &str)], config: Option<&str>) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vipwatch"));
    cmd.current_dir(dir.path()).args(args).env_remove("VIPWATCH_CONFIG").env("VIPWATCH_LOG", "warn");
    if let Some(text) = config {
        let path = dir.path().join("vipwatch.toml");
        std::fs::write(&path, text).unwrap();
        cmd.arg("--config").arg(path);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_invalid(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(2), "stderr: {}", stderr(o));
    let err = stderr(o);
    assert!(err.starts_with("vipwatch: invalid configuration: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
}

#[test]
fn unknown_key_names_the_key() {
    let o = vipwatch(&["check-config"], &[], Some("[kubernetes]\nnamespacez = []\n"));
    assert_invalid(&o, "`kubernetes.namespacez`: unknown field");
}

#[test]
fn wrong_type_names_the_key_and_the_expected_type() {
    let o = vipwatch(&["check-config"], &[], Some("[kubernetes]\nmanage_classless = \"yes\"\n"));
    assert_invalid(&o, "`kubernetes.manage_classless`: invalid type: found string \"yes\", expected a boolean");
}

#[test]
fn unreadable_file_is_named() {
    let o = vipwatch(&["check-config", "--config", "/nonexistent/vipwatch.toml"], &[], None);
    assert_invalid(&o, "config file /nonexistent/vipwatch.toml: No such file or directory");
}

#[test]
fn invalid_url_and_scheme_are_rejected() {
    let o = vipwatch(&["check-config"], &[], Some("[kubernetes]\nurl = \"not a url\"\n"));
    assert_invalid(&o, "`kubernetes.url`: relative URL without a base");
    let o = vipwatch(&["check-config"], &[], Some("[kubernetes]\nurl = \"ftp://127.0.0.1:8001\"\n"));
    assert_invalid(&o, "invalid value for `kubernetes.url`: scheme `ftp` is not http or https");
}

#[test]
fn bad_duration_and_bad_environment_override_are_named() {
    let o = vipwatch(&["check-config"], &[], Some("[database]\nevent_retention = \"30 parsecs\"\n"));
    assert_invalid(&o, "`database.event_retention`: invalid value string \"30 parsecs\", expected a duration");
    let o = vipwatch(&["check-config"], &[("VIPWATCH_SERVER__LISTEN", "nope")], None);
    assert_invalid(&o, "`server.listen`: invalid socket address syntax (from `VIPWATCH_` environment variable(s))");
}

#[test]
fn a_cluster_name_that_is_not_a_dns_label_is_rejected() {
    for bad in ["Prod", "prod_eu", "-prod", &"a".repeat(64), ""] {
        let o = vipwatch(&["check-config"], &[], Some(&format!("[cluster]\nname = \"{bad}\"\n")));
        assert_invalid(&o, &format!("invalid value for `cluster.name`: `{bad}` is not a DNS-1123 label"));
    }
    let o = vipwatch(&["check-config"], &[("VIPWATCH_CLUSTER__NAME", "prod-eu1")], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("[cluster]\nname = \"prod-eu1\""));
}

#[test]
fn unknown_service_type_is_rejected() {
    let o = vipwatch(&["check-config"], &[], Some("[kubernetes]\nservice_types = [\"Loadbalancer\"]\n"));
    assert_invalid(&o, "invalid value for `kubernetes.service_types`: `Loadbalancer` is not one of");
}

#[test]
fn check_config_prints_the_effective_config_with_environment_overrides_and_redacted_secrets() {
    let env = [
        ("VIPWATCH_DATABASE__PATH", "/var/lib/vipwatch/state.db"),
        ("VIPWATCH_KUBERNETES__URL", "https://admin:hunter2@k8s.example:6443"),
    ];
    let o = vipwatch(&["check-config"], &env, Some("[kubernetes]\nnamespaces = [\"shop\"]\n"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("path = \"/var/lib/vipwatch/state.db\""), "{out}");
    assert!(out.contains("namespaces = [\"shop\"]"), "{out}");
    assert!(out.contains("url = \"https://admin:REDACTED@k8s.example:6443/\""), "{out}");
    assert!(!out.contains("hunter2"));
}

const WEBHOOK: &str = "[[webhooks]]\nname = \"f5-lab\"\nurl = \"https://lb.example.net/hooks/vip\"\n\
    secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nheaders = { Authorization = \"Bearer s3cr3t-token\" }\n";

#[test]
fn webhook_secrets_and_header_values_are_redacted_in_check_config() {
    let o = vipwatch(&["check-config"], &[], Some(WEBHOOK));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("name = \"f5-lab\""), "{out}");
    assert!(out.contains("secret = \"<redacted>\""), "{out}");
    assert!(out.contains("Authorization = \"<redacted>\""), "{out}");
    assert!(!out.contains("MfKQ9r8") && !out.contains("s3cr3t-token"), "{out}");
}

#[test]
fn webhook_errors_name_the_endpoint_and_key() {
    let bad_secret = WEBHOOK.replace("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "hunter2");
    let o = vipwatch(&["check-config"], &[], Some(&bad_secret));
    assert_invalid(&o, "invalid value for `webhooks.f5-lab.secret`: not a Standard Webhooks secret");
    assert!(!stderr(&o).contains("hunter2"), "the bad secret is not echoed");

    let missing_env =
        WEBHOOK.replace("secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"", "secret_env = \"NO_SUCH_VAR_X\"");
    let o = vipwatch(&["check-config"], &[], Some(&missing_env));
    assert_invalid(&o, "invalid value for `webhooks.f5-lab.secret_env`: `NO_SUCH_VAR_X` is not set");

    let twice = format!("{WEBHOOK}{WEBHOOK}");
    let o = vipwatch(&["check-config"], &[], Some(&twice));
    assert_invalid(&o, "invalid value for `webhooks.name`: `f5-lab` is used by more than one endpoint");

    let no_slots = format!("{WEBHOOK}concurrency = 0\n");
    let o = vipwatch(&["check-config"], &[], Some(&no_slots));
    assert_invalid(&o, "invalid value for `webhooks.f5-lab.concurrency`: must be between 1 and 4096");

    let bad_event = format!("{WEBHOOK}events = [\"ADDED\", \"CREATED\"]\n");
    let o = vipwatch(&["check-config"], &[], Some(&bad_event));
    assert_invalid(&o, "invalid value for `webhooks.f5-lab.events`: `CREATED` is not ADDED, MODIFIED or DELETED");

    let bad_selector = format!("{WEBHOOK}label_selector = \"tier in db\"\n");
    let o = vipwatch(&["check-config"], &[], Some(&bad_selector));
    assert_invalid(&o, "invalid value for `webhooks.f5-lab.label_selector`: invalid label selector term `tier in db`");
}

#[test]
fn secret_from_an_environment_variable_is_accepted() {
    let from_env =
        WEBHOOK.replace("secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"", "secret_env = \"LAB_SECRET\"");
    let o = vipwatch(&["check-config"], &[("LAB_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")], Some(&from_env));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8(o.stdout).unwrap().contains("secret_env = \"LAB_SECRET\""));
    // From a Secret made with `kubectl create secret --from-file`: the file's newline comes along.
    let o = vipwatch(&["check-config"], &[("LAB_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")], Some(&from_env));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn values_that_would_misbehave_at_run_time_are_rejected_up_front() {
    let cases = [
        ("[kubernetes]\nnamespaces = [\"Shop_Bad!\"]\n", "`Shop_Bad!` is not a valid namespace name"),
        ("[kubernetes]\nnamespaces = [\"a\", \"a\"]\n", "`a` is listed twice"),
        ("[database]\npath = \"\"\n", "invalid value for `database.path`: must not be empty"),
        ("[database]\nevent_retention = \"0s\"\n", "invalid value for `database.event_retention`: must be at least 1m"),
        (
            "[kubernetes]\nwatch_timeout = \"1000y\"\n",
            "invalid value for `kubernetes.watch_timeout`: must be at most 1h",
        ),
        ("[relay]\npoll_interval = \"0s\"\n", "invalid value for `relay.poll_interval`: must be at least 10ms"),
        ("[kubernetes]\nstale_after = \"0s\"\n", "invalid value for `kubernetes.stale_after`: must be at least 1s"),
        ("[kubernetes]\nlist_timeout = \"0s\"\n", "invalid value for `kubernetes.list_timeout`: must be at least 1s"),
        (
            "[kubernetes]\nconnect_timeout = \"500ms\"\n",
            "invalid value for `kubernetes.connect_timeout`: must be at least 1s",
        ),
        (
            "[database]\nwrite_retry_max_delay = \"10ms\"\n",
            "invalid value for `database.write_retry_max_delay`: must be between 100ms and 5m",
        ),
        ("[database]\nleader_ttl = \"1s\"\n", "invalid value for `database.leader_ttl`: must be between 3s and 5m"),
        (
            "[database]\nleader_renew = \"0s\"\n",
            "invalid value for `database.leader_renew`: must be between 100ms and 1m",
        ),
        (
            "[database]\nleader_ttl = \"5s\"\nleader_renew = \"2s\"\n",
            "invalid value for `database.leader_ttl`: must be at least three times database.leader_renew (2s)",
        ),
        (
            "[database]\nleader_step_down_after = \"0s\"\n",
            "invalid value for `database.leader_step_down_after`: must be between 1s and 1h",
        ),
        ("[database]\nreplica = \" \"\n", "invalid value for `database.replica`: must not be blank"),
        ("[database]\ncommit_interval = \"2s\"\n", "invalid value for `database.commit_interval`: must be at most 1s"),
        ("[server]\nworker_threads = 0\n", "invalid value for `server.worker_threads`: must be between 1 and 64"),
        ("[server]\nworker_threads = 65\n", "invalid value for `server.worker_threads`: must be between 1 and 64"),
    ];
    for (config, needle) in cases {
        let o = vipwatch(&["check-config"], &[], Some(config));
        assert_invalid(&o, needle);
    }
}

/// An attempt is cut off at nine tenths of `relay.lease`, so the lease must leave a webhook's whole
/// `timeout` below that.
#[test]
fn a_lease_that_would_cut_off_attempts_within_their_timeout_is_rejected() {
    let config = format!("[relay]\nlease = \"1050ms\"\n{WEBHOOK}timeout = \"1s\"\n");
    let o = vipwatch(&["check-config"], &[], Some(&config));
    assert_invalid(
        &o,
        "invalid value for `relay.lease`: nine tenths of it must be longer than every webhook timeout (`f5-lab` has 1s)",
    );
    let config = format!("[relay]\nlease = \"1200ms\"\n{WEBHOOK}timeout = \"1s\"\n");
    let o = vipwatch(&["check-config"], &[], Some(&config));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// `relay.lease` is 1 s to 24 h: a shorter one leaves an attempt's cut-off too little margin before
/// its lease ends on a busy machine (a new user saw attempts outlive a 30 ms lease), and a huge one
/// overflowed the arithmetic of the limits (a panic, exit 101) instead of being refused (exit 2).
/// The same for a huge webhook `timeout` beside a poll.
#[test]
fn a_lease_outside_one_second_to_a_day_is_rejected_and_huge_durations_do_not_panic() {
    let reason = "invalid value for `relay.lease`: must be between 1s and 24h";
    for lease in ["30ms", "999ms", "25h", "500000000000y"] {
        let config = format!("[relay]\nlease = \"{lease}\"\n{WEBHOOK}timeout = \"20ms\"\n");
        let o = vipwatch(&["check-config"], &[], Some(&config));
        assert_invalid(&o, reason);
    }
    let poll = "[webhooks.template]\nmode = \"event\"\nlike = { MODIFIED = \"ADDED\", DELETED = \"ADDED\", SYNCED = \"ADDED\" }\n\n[[webhooks.template.on.ADDED]]\nurl = \"/x\"\nbody = \"{}\"\n\
        poll = { url = \"/task\", until = { pointer = \"/done\", equals = true } }\n";
    let config = format!("{WEBHOOK}timeout = \"300000000000y\"\n{poll}");
    let o = vipwatch(&["check-config"], &[], Some(&config));
    assert_invalid(
        &o,
        "invalid value for `relay.lease`: nine tenths of it must be longer than a poll deadline plus two timeouts (`f5-lab` polls up to 30s)",
    );
    // The poll's default deadline (30 s) fits the default lease (60 s) with the default timeout.
    let config = format!("{WEBHOOK}{poll}");
    let o = vipwatch(&["check-config"], &[], Some(&config));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn webhook_tls_headers_and_secret_length_are_checked_by_check_config() {
    let short = WEBHOOK.replace("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_YWJj");
    assert_invalid(&vipwatch(&["check-config"], &[], Some(&short)), "`webhooks.f5-lab.secret`: the key is 3 bytes");
    let header = WEBHOOK.replace("Bearer s3cr3t-token", "a\\nb");
    let o = vipwatch(&["check-config"], &[], Some(&header));
    assert_invalid(&o, "`webhooks.f5-lab.headers`: the value of `Authorization` is not a valid header value");
    let missing_ca = format!("{WEBHOOK}tls = {{ ca_file = \"/nonexistent/ca.pem\" }}\n");
    let o = vipwatch(&["check-config"], &[], Some(&missing_ca));
    assert_invalid(&o, "`webhooks.f5-lab.tls.ca_file`: /nonexistent/ca.pem: No such file or directory");
    let not_pem =
        format!("{WEBHOOK}tls = {{ ca_file = \"{}\" }}\n", env!("CARGO_MANIFEST_DIR").to_owned() + "/Cargo.toml");
    let o = vipwatch(&["check-config"], &[], Some(&not_pem));
    assert_invalid(&o, "Cargo.toml is not a PEM file");
}

#[test]
fn credentials_in_urls_are_redacted() {
    let with_creds =
        WEBHOOK.replace("https://lb.example.net/hooks/vip", "http://admin:hunter2@lb.example.net/hook?token=sekrit");
    let o = vipwatch(&["check-config"], &[], Some(&with_creds));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("url = \"http://admin:REDACTED@lb.example.net/hook?token=REDACTED\""), "{out}");
    assert!(!out.contains("hunter2") && !out.contains("sekrit"));
}

#[test]
fn bad_pools_name_the_pool_and_the_reason() {
    let two = "[[pools]]\nname = \"a\"\naddresses = [\"192.0.2.0/24\"]\n\n[[pools]]\nname = \"b\"\naddresses = [\"192.0.2.200-192.0.2.210\"]\n";
    let o = vipwatch(&["check-config"], &[], Some(two));
    assert_eq!(o.status.code(), Some(2), "stderr: {}", stderr(&o));
    assert_eq!(
        stderr(&o),
        "vipwatch: invalid configuration: invalid address pool `b`: 192.0.2.200-192.0.2.210 overlaps 192.0.2.0-192.0.2.255 of pool `a`\n"
    );
    let malformed = "[[pools]]\nname = \"lab\"\naddresses = [\"10.0.0.0/8\", \"10.1.2.3-banana\"]\n";
    assert_invalid(
        &vipwatch(&["check-config"], &[], Some(malformed)),
        "invalid address pool `lab`: `banana` in `10.1.2.3-banana` is not an IP address",
    );
    let empty = "[[pools]]\nname = \"lab\"\naddresses = []\n";
    assert_invalid(&vipwatch(&["check-config"], &[], Some(empty)), "invalid address pool `lab`: `addresses` is empty");
    let ok = "[[pools]]\nname = \"lab\"\naddresses = [\"192.0.2.0/24\", \"2001:db8::/120\"]\nauto_assign = false\n";
    let o = vipwatch(&["check-config"], &[], Some(ok));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("[[pools]]\nname = \"lab\"\naddresses = [\n    \"192.0.2.0/24\",\n    \"2001:db8::/120\",\n]\nauto_assign = false\n"), "{}", String::from_utf8_lossy(&o.stdout));
}

#[test]
fn the_shipped_api_token_placeholder_is_refused() {
    let o = vipwatch(&["check-config"], &[("VIPWATCH_API_TOKEN", "REPLACE_ME_WITH_A_RANDOM_TOKEN")], None);
    assert_invalid(&o, "invalid value for `server.api_token`: is still the shipped placeholder");
}

#[test]
fn variables_of_other_tools_and_kubernetes_service_links_are_not_configuration() {
    let env = [
        ("VIPWATCH_PORT", "tcp://10.0.0.1:8080"),
        ("VIPWATCH_SERVICE_HOST", "10.0.0.1"),
        ("VIPWATCH_PORT_8080_TCP_ADDR", "10.0.0.1"),
        ("VIPWATCH_BIN", "/usr/local/bin/vipwatch"),
    ];
    let o = vipwatch(&["check-config"], &env, None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let plain = vipwatch(&["check-config"], &[], None);
    assert_eq!(String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&plain.stdout));
}

#[test]
fn a_table_and_key_variable_that_names_no_key_is_still_an_error() {
    let o = vipwatch(&["check-config"], &[("VIPWATCH_SEVRER__LISTEN", "0.0.0.0:8080")], None);
    assert_invalid(&o, "`sevrer`: unknown field");
    assert!(stderr(&o).contains("(from `VIPWATCH_` environment variable(s))"), "{}", stderr(&o));
    let o = vipwatch(&["check-config"], &[("VIPWATCH_SERVER__LISTN", "0.0.0.0:8080")], None);
    assert_invalid(&o, "`server.listn`: unknown field");
}

#[test]
fn a_key_with_one_underscore_too_few_is_ignored_with_a_warning_naming_the_right_form() {
    let o = vipwatch(&["check-config"], &[("VIPWATCH_DATABASE_PATH", "/var/lib/x.db")], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("did you mean VIPWATCH_DATABASE__PATH?"), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("path = \"vipwatch.db\""), "the variable changed nothing");
}

#[test]
fn an_empty_api_token_is_refused() {
    let o = vipwatch(&["check-config"], &[("VIPWATCH_API_TOKEN", "")], None);
    assert_invalid(&o, "invalid value for `server.api_token`: is empty");
}

#[test]
fn the_fake_apiserver_subcommand_serves_a_seed_directory_to_kubectl() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let seed = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kubernetes/real-world");
    let mut expected = BTreeSet::new();
    for entry in std::fs::read_dir(&seed).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|x| x == "json") {
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let ns = v["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
            expected.insert(format!("{ns}/{}", v["metadata"]["name"].as_str().unwrap()));
        }
    }
    let cwd = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vipwatch"))
        .current_dir(cwd.path())
        .env_remove("VIPWATCH_CONFIG")
        .env("VIPWATCH_LOG", "warn")
        .args(["fake-apiserver", "--listen", "127.0.0.1:0", "--seed"])
        .arg(&seed)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let url = first.trim().strip_prefix("fake apiserver listening on ").expect("the startup line").to_owned();
    let kubectl = |args: &[&str]| {
        let home = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("kubectl");
        cmd.env("HOME", home.path()).env_remove("KUBECONFIG").arg("--server").arg(&url).args(args);
        let out = cmd.output().expect("kubectl is installed (see README)");
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let listed: serde_json::Value = serde_json::from_str(&kubectl(&["get", "svc", "-A", "-o", "json"])).unwrap();
    let got: BTreeSet<String> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!("{}/{}", i["metadata"]["namespace"].as_str().unwrap(), i["metadata"]["name"].as_str().unwrap())
        })
        .collect();
    assert_eq!(got, expected);
    kubectl(&["label", "svc", "-n", "kube-system", "kube-dns", "seen=yes"]);
    let dns = kubectl(&["get", "svc", "-n", "kube-system", "kube-dns", "-o", "jsonpath={.metadata.labels.seen}"]);
    assert_eq!(dns, "yes");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn healthcheck_goes_straight_to_the_process_whatever_proxy_is_set() {
    // A one-request HTTP server answering 200 on the loopback.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/healthz", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut request = String::new();
        let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
        while reader.read_line(&mut request).unwrap() > 2 && !request.ends_with("\r\n\r\n") {}
        std::io::Write::write_all(&mut conn, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            .unwrap();
        request.lines().next().unwrap_or_default().to_owned()
    });
    // A proxy that does not exist: were it used, the check would fail.
    let proxy = "http://127.0.0.1:9";
    let env = [("HTTP_PROXY", proxy), ("http_proxy", proxy), ("ALL_PROXY", proxy), ("NO_PROXY", "")];
    let o = vipwatch(&["healthcheck", "--url", &url], &env, None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(server.join().unwrap(), "GET /healthz HTTP/1.1");
}

#[test]
fn string_keys_from_the_environment_are_taken_as_written() {
    // `openssl rand -hex` can print only digits; a path can be a number too.
    let env = [("VIPWATCH_API_TOKEN", "12345678901234567890"), ("VIPWATCH_DATABASE__PATH", "2026")];
    let o = vipwatch(&["check-config"], &env, None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("path = \"2026\"") && out.contains("api_token = \"<redacted>\""), "{out}");
    // A string key that does not parse still names the key and where it came from.
    let o = vipwatch(&["check-config"], &[("VIPWATCH_KUBERNETES__URL", "not a url")], None);
    assert_invalid(&o, "`kubernetes.url`");
    assert!(stderr(&o).contains("(from `VIPWATCH_` environment variable(s))"), "{}", stderr(&o));
}

/// A PostgreSQL URL that cannot be reached names why, not only the pool's "timed out", and the
/// URL without its password. (A refused port here; an unknown database or a wrong password come
/// back from the server the same way, through the first connection.)
#[test]
fn serve_with_an_unreachable_postgresql_names_the_reason_and_hides_the_password() {
    // Bound, never listening: refused, and no other test is given the port meanwhile.
    let refused = tokio::net::TcpSocket::new_v4().unwrap();
    refused.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = refused.local_addr().unwrap().port();
    let config = format!(
        "[kubernetes]\nurl = \"http://127.0.0.1:1\"\n[database]\nurl = \"postgres://vw:hunter2@127.0.0.1:{port}/vipwatch\"\n"
    );
    let o = vipwatch(&["serve"], &[("VIPWATCH_SERVER__LISTEN", "127.0.0.1:0")], Some(&config));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("cannot open database postgres://vw:REDACTED@127.0.0.1:{port}/vipwatch")), "{err}");
    assert!(err.contains("Connection refused"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

/// A value the config cannot parse inside `[[webhooks]]` or `[[pools]]` names the element by its
/// `name`, as validation does (`webhooks.f5-lab.timeout`), not by its index (a new user saw
/// `webhooks.0.timeout` for `"-1s"` beside `webhooks.f5-lab.timeout` for `"0s"`).
#[test]
fn a_value_that_cannot_be_parsed_in_a_webhook_or_pool_names_it() {
    let o = vipwatch(&["check-config"], &[], Some(&format!("{WEBHOOK}timeout = \"-1s\"\n")));
    assert_invalid(&o, "`webhooks.f5-lab.timeout`: invalid value string \"-1s\", expected a duration");
    let o = vipwatch(&["check-config"], &[], Some("[[pools]]\nname = \"lab\"\naddresses = \"x\"\n"));
    assert_invalid(&o, "`pools.lab.addresses`: invalid type: found string \"x\", expected a sequence");
}

/// The allocator settings in effect, as the binary logs them: vipwatch's own values by default, and
/// each `MIMALLOC_*` variable in the environment over them (`src/allocator.rs`).
#[test]
fn the_allocator_settings_are_vipwatchs_unless_the_environment_sets_them() {
    let settings = |env: &[(&str, &str)]| {
        let mut env = env.to_vec();
        env.push(("VIPWATCH_LOG", "vipwatch::allocator=debug"));
        let o = vipwatch(&["check-config"], &env, Some(""));
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let err = stderr(&o);
        let line = err.lines().find(|l| l.contains("allocator settings")).unwrap_or_else(|| panic!("{err}"));
        line.split_once("allocator settings ").unwrap().1.to_owned()
    };
    assert_eq!(settings(&[]), "purge_delay_ms=0 page_full_retain=0 generic_collect=1000 thp_disabled=true");
    let env = [("MIMALLOC_PURGE_DELAY", "250"), ("mimalloc_page_full_retain", "3"), ("MIMALLOC_ALLOW_THP", "")];
    assert_eq!(settings(&env), "purge_delay_ms=250 page_full_retain=3 generic_collect=1000 thp_disabled=false");
}
