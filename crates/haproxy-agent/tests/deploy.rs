//! The files in `deploy/haproxy-agent/` agree with the agent: the example configuration passes
//! `vipwatch-haproxy check-config` (with its secret file supplied), and the systemd unit runs the
//! binary with that configuration's path and the state directory the configuration names.

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/haproxy-agent").join(file)
}

fn agent() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vipwatch-haproxy"));
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("VIPWATCH_HAPROXY_")) {
        cmd.env_remove(key);
    }
    cmd
}

fn toml_value(text: &str, key: &str) -> toml::Value {
    text.parse::<toml::Table>().unwrap()[key].clone()
}

#[test]
fn the_example_configuration_is_valid_once_its_secret_file_exists() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("webhook-secret");
    std::fs::write(&secret, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").unwrap();
    let out = agent()
        .arg("--config")
        .arg(deploy("vipwatch-haproxy.toml"))
        .arg("check-config")
        .env("VIPWATCH_HAPROXY_SECRET_FILES", format!("[\"{}\"]", secret.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    assert_eq!(toml_value(&printed, "listen").as_str(), Some("0.0.0.0:9080"));
    assert_eq!(toml_value(&printed, "dir").as_str(), Some("/var/lib/vipwatch-haproxy"));
    assert_eq!(toml_value(&printed, "stop_haproxy_on_exit").as_bool(), Some(false));
    assert!(!printed.contains("whsec_"), "secrets stay out of the output: {printed}");

    // As shipped, the missing secret file is named.
    let out = agent().arg("--config").arg(deploy("vipwatch-haproxy.toml")).arg("check-config").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "vipwatch-haproxy: invalid configuration: invalid value for `secret_files`: \
         /etc/vipwatch-haproxy/webhook-secret: No such file or directory (os error 2)"
    );
}

#[test]
fn the_systemd_unit_runs_the_example_configuration_in_its_state_directory() {
    let unit = std::fs::read_to_string(deploy("vipwatch-haproxy.service")).unwrap();
    let config = std::fs::read_to_string(deploy("vipwatch-haproxy.toml")).unwrap();
    let line = |key: &str| unit.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap().to_owned();
    let config_path = config.lines().next().unwrap().rsplit(' ').next().unwrap();
    assert_eq!(line("ExecStart"), format!("/usr/local/bin/vipwatch-haproxy --config {config_path} serve"));
    assert_eq!(toml_value(&config, "dir").as_str(), Some(format!("/var/lib/{}", line("StateDirectory")).as_str()));
    assert_eq!(line("KillMode"), "process", "an agent restart must leave HAProxy serving");
    let sysctl = std::fs::read_to_string(deploy("90-vipwatch-haproxy.conf")).unwrap();
    assert!(sysctl.lines().any(|l| l == "net.ipv4.ip_nonlocal_bind = 1"));
    let keepalived = std::fs::read_to_string(deploy("keepalived.conf")).unwrap();
    let listen = toml_value(&config, "listen");
    let port = listen.as_str().unwrap().rsplit(':').next().unwrap();
    assert!(
        keepalived.contains(&format!("http://127.0.0.1:{port}/healthz")),
        "keepalived follows the agent's /healthz"
    );
}
