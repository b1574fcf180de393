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
    // With exactly the environment the systemd unit sets.
    let unit = std::fs::read_to_string(deploy("vipwatch-haproxy.service")).unwrap();
    let unit_env: Vec<(String, String)> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("Environment="))
        .map(|kv| kv.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).unwrap())
        .collect();
    assert!(!unit_env.is_empty());
    let out = agent()
        .arg("--config")
        .arg(deploy("vipwatch-haproxy.toml"))
        .arg("check-config")
        .envs(unit_env)
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

/// `keepalived -t` on the shipped keepalived.conf, with the interface one this host has: no warning,
/// no error. keepalived before 2.2.8 kills itself in `-t` when the script user is not root
/// (acassen/keepalived#2617, the daemon is not affected), so there the file is checked with `root`.
#[test]
fn the_keepalived_configuration_passes_keepalived_s_own_check() {
    let version = Command::new("keepalived").arg("-v").output();
    let version = version.expect("keepalived checks the shipped keepalived.conf: install Debian's `keepalived`");
    let version = String::from_utf8_lossy(&version.stderr).to_string() + &String::from_utf8_lossy(&version.stdout);
    let shipped = std::fs::read_to_string(deploy("keepalived.conf")).unwrap();
    let interface = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "lo")
        .min()
        .expect("a network interface besides lo");
    let mut text = shipped.replace("eth0", &interface);
    if version.contains("v2.2.7 ") || version.contains("v2.2.6 ") || version.contains("v2.2.5 ") {
        text = text.replace("script_user nobody", "script_user root");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keepalived.conf");
    std::fs::write(&file, text).unwrap();
    let out = Command::new("keepalived").arg("-t").arg("-f").arg(&file).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert_eq!((out.status.code(), said.trim()), (Some(0), ""), "{version}");
    // The shipped file keeps what the check relies on.
    for line in ["    enable_script_security", "    script_user nobody", "        vipwatch_haproxy_healthz"] {
        assert!(shipped.lines().any(|l| l == line), "missing `{line}`");
    }
    let pass = shipped.lines().find_map(|l| l.trim().strip_prefix("auth_pass ")).unwrap();
    assert!(pass.split_whitespace().next().unwrap().len() <= 8, "keepalived uses 8 characters of auth_pass");
}

#[test]
fn configuration_errors_name_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let weak = dir.path().join("weak");
    std::fs::write(&weak, "whsec_YQ==\n").unwrap();
    let config = dir.path().join("agent.toml");
    let run = |toml: &str, args: &[&str]| {
        std::fs::write(&config, toml).unwrap();
        agent().arg("--config").arg(&config).args(args).output().unwrap()
    };
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).trim().to_owned();

    let o = run(&format!("secret_files = [\"{}\"]\n", weak.display()), &["check-config"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        format!(
            "vipwatch-haproxy: invalid configuration: invalid value for `secret_files`: {}: the key is 1 bytes; Standard Webhooks keys are 24 to 64 random bytes",
            weak.display()
        )
    );
    let good = "secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n";
    let o = run(&format!("{good}haproxy_bin = \"/nonexistent/haproxy\"\n"), &["check-config"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "vipwatch-haproxy: invalid configuration: invalid value for `haproxy_bin`: /nonexistent/haproxy: No such file or directory (os error 2)"
    );
    let o = run(&format!("{good}batch_window = \"11s\"\n"), &["check-config"]);
    assert_eq!(
        stderr(&o),
        "vipwatch-haproxy: invalid configuration: invalid value for `batch_window`: must be at most 10s (deliveries would time out)"
    );
    let o = run(&format!("{good}concurrency = 5000\n"), &["check-config"]);
    assert_eq!(
        stderr(&o),
        "vipwatch-haproxy: invalid configuration: invalid value for `concurrency`: must be between 1 and 4096"
    );
    let o = run(&format!("{good}hard_stop_after = \"0s\"\n"), &["check-config"]);
    assert!(stderr(&o).contains("`hard_stop_after`: must be at least 1s"), "{}", stderr(&o));

    // `render` needs no secret: it only reads the stored state (none yet: the skeleton).
    let o = run(&format!("dir = \"{}\"\n", dir.path().join("state").display()), &["render"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("# Generated by vipwatch-haproxy from 0 Services"));
}
