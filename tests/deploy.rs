//! The deployment files agree with each other and with vipwatch: the Dockerfile, docker-compose.yml
//! and the config files they ship, and the Kubernetes manifests of deploy/kubernetes (parsed strictly
//! into k8s-openapi types). Config files are read by `vipwatch check-config`, the normal loader.

#[path = "deploy/files.rs"]
mod deploy_files;
#[path = "deploy/kubelet.rs"]
mod kubelet;
#[path = "deploy/serve.rs"]
mod serve;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use deploy_files::{Compose, Dockerfile, Manifests, check_config, load_config, repo, vipwatch};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use vipwatch::config::Config;
use vipwatch::fake_apiserver::FakeApiServer;

/// The image's health check, the compose health check and the binary path all name this.
const BINARY: &str = "/usr/local/bin/vipwatch";

/// How long a started `vipwatch serve` may take to become ready, and to stop after SIGTERM.
const DEADLINE: Duration = Duration::from_secs(30);

#[test]
fn the_image_exposes_the_port_its_config_listens_on_and_keeps_the_database_on_its_volume() {
    let docker = Dockerfile::read();
    let config_path = docker.env("VIPWATCH_CONFIG");
    assert_eq!(config_path, "/etc/vipwatch/vipwatch.toml");
    assert_eq!(
        docker.args("COPY"),
        vec![format!("--from=build {BINARY} {BINARY}"), format!("deploy/docker/vipwatch.toml {config_path}")]
    );
    let config = load_config::<&str, &str>(&repo("deploy/docker/vipwatch.toml"), &[]);
    assert_eq!(docker.args("EXPOSE"), [config.server.listen.port().to_string()]);
    assert_eq!(docker.json("VOLUME"), [database_dir(&config)]);
    assert_eq!(docker.args("USER"), ["10001"]);
    assert_eq!(docker.json("ENTRYPOINT"), [BINARY]);
    assert_eq!(docker.json("CMD"), ["serve"]);
    assert_eq!(docker.healthcheck(), [BINARY, "healthcheck"]);
    assert_eq!(config.kubernetes.url, None, "in a cluster the image uses the pod's service account");
}

#[test]
fn compose_publishes_the_exposed_port_and_mounts_the_volume_at_the_database_dir() {
    let docker = Dockerfile::read();
    let compose = Compose::read();
    let vipwatch = compose.service("vipwatch");
    let mounted = vipwatch.mount_source(&docker.env("VIPWATCH_CONFIG")).expect("a config file over the image's");
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let config = load_config(&repo(&mounted), &[("APPLIANCE_WEBHOOK_SECRET", secret)]);
    let port = config.server.listen.port().to_string();
    assert_eq!(docker.args("EXPOSE"), std::slice::from_ref(&port));
    assert_eq!(vipwatch.ports, [format!("127.0.0.1:{port}:{port}")]);
    assert_eq!(vipwatch.mount_source(&database_dir(&config)).as_deref(), Some("vipwatch-data"));
    assert!(compose.volumes.contains_key("vipwatch-data"));
    assert_eq!(
        vipwatch.healthcheck.test,
        ["CMD".to_owned()].into_iter().chain(docker.healthcheck()).collect::<Vec<_>>()
    );
    assert_eq!(vipwatch.depends_on.keys().collect::<Vec<_>>(), ["appliance", "kubectl-proxy"]);
    assert!(vipwatch.depends_on.values().all(|d| d.condition == "service_healthy"));
}

#[test]
fn compose_points_vipwatch_at_the_proxy_and_the_appliance_it_runs() {
    let compose = Compose::read();
    let vipwatch = compose.service("vipwatch");
    let mounted = vipwatch.mount_source("/etc/vipwatch/vipwatch.toml").unwrap();
    let config =
        load_config(&repo(&mounted), &[("APPLIANCE_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]);
    let proxy = compose.service("kubectl-proxy");
    assert!(proxy.command.contains(&"--port=8001".to_owned()), "{:?}", proxy.command);
    assert_eq!(config.kubernetes.url.as_ref().map(|u| u.as_str()), Some("http://kubectl-proxy:8001/"));
    let appliance = compose.service("appliance");
    assert_eq!(appliance.command, ["demo-receiver", "--listen", "0.0.0.0:9000"]);
    assert_eq!(appliance.healthcheck.test, ["CMD", BINARY, "healthcheck", "--url", "http://127.0.0.1:9000/healthz"]);
    assert_eq!(appliance.image, vipwatch.image, "the appliance is the vipwatch image");
    assert_eq!(config.webhooks.len(), 1);
    assert_eq!(config.webhooks[0].url.as_str(), "http://appliance:9000/hooks/vip");
    let var = config.webhooks[0].secret_env.clone().expect("the secret comes from the environment");
    assert!(vipwatch.environment.contains_key(&var), "vipwatch gets {var}");
    assert!(appliance.environment.contains_key(&var), "the appliance gets {var}");
    assert!(!var.starts_with("VIPWATCH_"), "VIPWATCH_* variables are config keys");
}

#[test]
fn every_kubernetes_manifest_is_a_known_kind_with_only_known_fields() {
    let manifests = Manifests::read();
    let kinds: Vec<String> =
        manifests.docs.iter().map(|(file, doc)| format!("{file}: {}", doc["kind"].as_str().unwrap())).collect();
    assert_eq!(
        kinds,
        [
            "configmap.yaml: ConfigMap",
            "deployment.yaml: Deployment",
            "namespace.yaml: Namespace",
            "pvc.yaml: PersistentVolumeClaim",
            "rbac.yaml: ServiceAccount",
            "rbac.yaml: ClusterRole",
            "rbac.yaml: ClusterRoleBinding",
            "secret.yaml: Secret",
            "service.yaml: Service",
        ]
    );
    manifests.check_all_strictly();
}

#[test]
fn kustomize_renders_every_manifest_into_the_vipwatch_namespace() {
    let manifests = Manifests::read();
    let listed: BTreeSet<String> = manifests.kustomization().resources.into_iter().collect();
    let files: BTreeSet<String> = manifests.docs.iter().map(|(file, _)| file.clone()).collect();
    assert_eq!(listed, files);
    let rendered = deploy_files::kustomize();
    assert_eq!(rendered.len(), manifests.docs.len());
    for doc in &rendered {
        let cluster_scoped =
            ["Namespace", "ClusterRole", "ClusterRoleBinding"].contains(&doc["kind"].as_str().unwrap());
        let namespace = doc["metadata"]["namespace"].as_str();
        assert_eq!(namespace, (!cluster_scoped).then_some("vipwatch"), "{}", doc["kind"]);
    }
}

#[test]
fn the_deployment_serves_the_configmaps_port_and_mounts_the_claim_at_the_database_dir() {
    let m = Manifests::read();
    let config = configmap_config(&m, &secret_env(&m, true));
    let deployment: Deployment = m.one();
    let spec = &deployment.spec;
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.strategy.as_ref().and_then(|s| s.type_.as_deref()), Some("Recreate"));
    let pod = spec.template.spec.as_ref().unwrap();
    let container = &pod.containers[0];
    let port = &container.ports.as_ref().unwrap()[0];
    assert_eq!((port.name.as_deref(), port.container_port), (Some("http"), i32::from(config.server.listen.port())));
    let mounts: BTreeMap<&str, &str> =
        container.volume_mounts.iter().flatten().map(|v| (v.name.as_str(), v.mount_path.as_str())).collect();
    let volume = |name: &str| pod.volumes.iter().flatten().find(|v| v.name == name).unwrap().clone();
    let pvc: PersistentVolumeClaim = m.one();
    assert_eq!(volume("data").persistent_volume_claim.unwrap().claim_name, pvc.metadata.name.unwrap());
    assert_eq!(mounts["data"], database_dir(&config));
    let configmap: ConfigMap = m.one();
    assert_eq!(volume("config").config_map.unwrap().name, configmap.metadata.name.unwrap());
    let env = container.env.iter().flatten().find(|e| e.name == "VIPWATCH_CONFIG").and_then(|e| e.value.clone());
    assert_eq!(env, Some(format!("{}/vipwatch.toml", mounts["config"])));
}

#[test]
fn the_probes_are_real_api_routes_on_the_api_port() {
    let m = Manifests::read();
    let deployment: Deployment = m.one();
    let container = &deployment.spec.template.spec.unwrap().containers[0];
    let openapi: serde_json::Value = serde_json::from_str(&vipwatch::api::openapi::document_json()).unwrap();
    let probes = [
        ("startup", container.startup_probe.clone()),
        ("liveness", container.liveness_probe.clone()),
        ("readiness", container.readiness_probe.clone()),
    ];
    let mut paths = Vec::new();
    for (what, probe) in probes {
        let get = probe.and_then(|p| p.http_get).unwrap_or_else(|| panic!("{what} probe is an HTTP GET"));
        assert_eq!(get.port, IntOrString::String("http".into()), "{what} probe");
        let path = get.path.unwrap();
        assert!(openapi["paths"].get(&path).is_some(), "{what} probe: {path} is not an API route");
        paths.push(path);
    }
    assert_eq!(paths, ["/healthz", "/healthz", "/readyz"]);
    let service: Service = m.one();
    let port = &service.spec.unwrap().ports.unwrap()[0];
    assert_eq!(port.target_port, Some(IntOrString::String("http".into())));
}

#[test]
fn the_secret_holds_exactly_the_variables_the_config_reads() {
    let m = Manifests::read();
    let secret: Secret = m.one();
    let keys: BTreeSet<String> = secret.string_data.clone().unwrap().into_keys().collect();
    let config = configmap_config(&m, &secret_env(&m, true));
    let mut wanted: BTreeSet<String> = config.webhooks.iter().filter_map(|w| w.secret_env.clone()).collect();
    wanted.insert("VIPWATCH_API_TOKEN".into());
    assert_eq!(keys, wanted);
    assert!(config.server.api_token.is_some(), "VIPWATCH_API_TOKEN reaches server.api_token");
    let deployment: Deployment = m.one();
    let container = &deployment.spec.template.spec.unwrap().containers[0];
    let from = container.env_from.as_ref().unwrap()[0].secret_ref.clone().unwrap();
    assert_eq!(Some(from.name), secret.metadata.name);
}

#[test]
fn the_shipped_placeholder_secret_is_refused_until_replaced() {
    let m = Manifests::read();
    let dir = tempfile::tempdir().unwrap();
    let file = write_configmap_toml(&m, &dir);
    let output = check_config(&file, &secret_env(&m, false));
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim_end(),
        "vipwatch: invalid configuration: invalid value for `webhooks.appliance.secret`: not a Standard Webhooks secret (`whsec_` + base64 key)"
    );
}

#[test]
fn the_pod_runs_as_the_images_user_without_privileges() {
    let m = Manifests::read();
    let deployment: Deployment = m.one();
    let pod = deployment.spec.template.spec.unwrap();
    let security = pod.security_context.unwrap();
    let uid = Dockerfile::read().args("USER")[0].parse::<i64>().unwrap();
    assert_eq!((security.run_as_non_root, security.run_as_user, security.fs_group), (Some(true), Some(uid), Some(uid)));
    let container = pod.containers[0].security_context.clone().unwrap();
    assert_eq!(container.read_only_root_filesystem, Some(true));
    assert_eq!(container.allow_privilege_escalation, Some(false));
    assert_eq!(container.capabilities.unwrap().drop, Some(vec!["ALL".to_owned()]));
    let account: ServiceAccount = m.one();
    assert_eq!(pod.service_account_name, account.metadata.name);
}

#[test]
fn the_cluster_role_grants_what_vipwatch_does_and_is_bound_to_its_account() {
    let m = Manifests::read();
    let role: ClusterRole = m.one();
    let allows = |group: &str, resource: &str, verb: &str| {
        role.rules.iter().flatten().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    let needed = [
        ("", "services", "get"),
        ("", "services", "list"),
        ("", "services", "watch"),
        ("", "services", "patch"),
        ("", "services/status", "patch"),
        ("", "events", "create"),
        ("events.k8s.io", "events", "create"),
        ("discovery.k8s.io", "endpointslices", "watch"),
        ("", "nodes", "watch"),
    ];
    for (group, resource, verb) in needed {
        assert!(allows(group, resource, verb), "{verb} {group}/{resource}");
    }
    assert!(!allows("", "secrets", "get") && !allows("", "services", "delete"));
    let binding: ClusterRoleBinding = m.one();
    let account: ServiceAccount = m.one();
    assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (Some(subject.name.clone()), subject.namespace.clone()),
        (account.metadata.name, account.metadata.namespace)
    );
}

#[test]
fn the_deployment_turns_service_links_off_and_outlasts_the_shutdown_grace() {
    let m = Manifests::read();
    let deployment: Deployment = m.one();
    let pod = deployment.spec.template.spec.unwrap();
    assert_eq!(pod.enable_service_links, Some(false));
    let config = configmap_config(&m, &secret_env(&m, true));
    let grace = Duration::from_secs(pod.termination_grace_period_seconds.unwrap().try_into().unwrap());
    // After SIGTERM, in-flight deliveries get relay.shutdown_grace, then the database closes; the
    // kubelet's SIGKILL must not come first.
    assert!(
        config.relay.shutdown_grace + Duration::from_secs(5) <= grace,
        "{:?} vs {grace:?}",
        config.relay.shutdown_grace
    );
}

#[test]
fn check_config_reads_the_same_configuration_from_what_a_kubelet_injects() {
    let m = Manifests::read();
    let dir = tempfile::tempdir().unwrap();
    let file = write_configmap_toml(&m, &dir);
    let baseline = check_config(&file, &secret_env(&m, true));
    assert_eq!(baseline.status.code(), Some(0), "{}", String::from_utf8_lossy(&baseline.stderr));
    for links in [false, true] {
        let env = pod_env(&m, links, &file);
        assert_eq!(env.iter().any(|(k, _)| k == "VIPWATCH_PORT_8080_TCP_ADDR"), links);
        let output = vipwatch(&env).arg("check-config").output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&baseline.stdout));
    }
}

#[tokio::test]
async fn serve_becomes_ready_on_a_read_only_root_from_what_a_kubelet_injects() {
    let m = Manifests::read();
    let api = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = write_configmap_toml(&m, &dir);
    let mut env = pod_env(&m, true, &file);
    let data = dir.path().join("data");
    env.extend(test_overrides(&api, &data));
    let served = serve::serve_read_only(&env, &data, DEADLINE).await;
    assert!(served.ready, "not ready:\n{}", served.stderr);
    assert_eq!(served.status.code(), Some(0), "{}", served.stderr);
}

#[tokio::test]
async fn compose_environment_is_accepted_by_check_config_and_serve() {
    let compose = Compose::read();
    let vipwatch_service = compose.service("vipwatch");
    let config_path = Dockerfile::read().env("VIPWATCH_CONFIG");
    let mounted = repo(&vipwatch_service.mount_source(&config_path).unwrap());
    let mut env = vec![
        ("HOSTNAME".to_owned(), "3f2a9c1d7b8e".to_owned()),
        ("VIPWATCH_CONFIG".to_owned(), mounted.to_str().unwrap().to_owned()),
    ];
    for key in vipwatch_service.environment.keys() {
        env.push((key.clone(), valid_secret_value(key)));
    }
    let output = vipwatch(&env).arg("check-config").output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let api = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    env.extend(test_overrides(&api, &data));
    let served = serve::serve_read_only(&env, &data, DEADLINE).await;
    assert!(served.ready, "not ready:\n{}", served.stderr);
    assert_eq!(served.status.code(), Some(0), "{}", served.stderr);
}

#[tokio::test]
async fn while_the_first_list_cannot_complete_the_probes_keep_the_pod_alive_but_unready() {
    let deployment: Deployment = Manifests::read().one();
    let container = deployment.spec.template.spec.unwrap().containers.remove(0);
    let path = |p: Option<k8s_openapi::api::core::v1::Probe>| p.unwrap().http_get.unwrap().path.unwrap();
    let probes = [
        (path(container.startup_probe), 200),
        (path(container.liveness_probe), 200),
        (path(container.readiness_probe.clone()), 503),
    ];
    let api = FakeApiServer::start().await.unwrap();
    api.faults().refuse_connections(true);
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.kubernetes.url = Some(api.url().parse().unwrap());
    config.database.path = dir.path().join("vipwatch.db");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = vipwatch::app::start(config, listener).await.unwrap();
    vipwatch::relay::sender::install_crypto_provider();
    let client = reqwest::Client::new();
    let get = |path: String| {
        let url = format!("http://{}{path}", running.addr);
        let client = client.clone();
        async move { client.get(url).send().await.unwrap().status().as_u16() }
    };
    for (path, status) in &probes {
        assert_eq!(get(path.clone()).await, *status, "{path} while the apiserver is unreachable");
    }
    api.faults().refuse_connections(false);
    let ready = tokio::time::timeout(DEADLINE, async {
        while get(path(container.readiness_probe.clone())).await != 200 {
            tokio::time::sleep(Duration::from_millis(50)).await; // ok: polling a condition under a deadline
        }
    });
    assert!(ready.await.is_ok(), "ready once the apiserver answers");
    running.stop().await.unwrap();
}

/// What the kubelet injects into the shipped container (see `deploy/kubelet.rs`), with the mounted
/// ConfigMap file at `file` instead of `/etc/vipwatch/vipwatch.toml` (the test cannot write there).
fn pod_env(m: &Manifests, service_links: bool, file: &Path) -> Vec<(String, String)> {
    let mut env = kubelet::environment(m, service_links, valid_secret_value);
    for (key, value) in &mut env {
        if key == "VIPWATCH_CONFIG" {
            *value = file.to_str().unwrap().to_owned();
        }
    }
    env
}

/// What only this test changes, in documented forms: the simulated cluster instead of the in-cluster
/// one, the database in `data`, the API on a free loopback port.
fn test_overrides(api: &FakeApiServer, data: &Path) -> Vec<(String, String)> {
    std::fs::create_dir_all(data).unwrap();
    vec![
        ("VIPWATCH_KUBERNETES__URL".into(), api.url()),
        ("VIPWATCH_DATABASE__PATH".into(), data.join("vipwatch.db").to_str().unwrap().to_owned()),
        ("VIPWATCH_SERVER__LISTEN".into(), "127.0.0.1:0".into()),
    ]
}

/// A valid value for a variable the shipped Secret or compose file passes: the API token, or a
/// webhook secret.
fn valid_secret_value(key: &str) -> String {
    if key == "VIPWATCH_API_TOKEN" { "t0ken" } else { "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" }.to_owned()
}

/// The directory of the database file.
fn database_dir(config: &Config) -> String {
    config.database.path.parent().unwrap().to_str().unwrap().to_owned()
}

/// The Secret's `stringData` as environment variables: as shipped, or (`valid`) with each value
/// replaced by a valid one of its kind.
fn secret_env(m: &Manifests, valid: bool) -> Vec<(String, String)> {
    let secret: Secret = m.one();
    secret
        .string_data
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k.clone(), if valid { valid_secret_value(&k) } else { v }))
        .collect()
}

/// The ConfigMap's `vipwatch.toml`, loaded with `env`.
fn configmap_config(m: &Manifests, env: &[(String, String)]) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    load_config(&write_configmap_toml(m, &dir), &env)
}

fn write_configmap_toml(m: &Manifests, dir: &tempfile::TempDir) -> PathBuf {
    let configmap: ConfigMap = m.one();
    let path = dir.path().join("vipwatch.toml");
    std::fs::write(&path, &configmap.data.unwrap()["vipwatch.toml"]).unwrap();
    path
}
