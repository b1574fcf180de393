//! The deployment files agree with each other and with vipwatch: the Dockerfile, the compose files
//! (docker-compose.yml on SQLite, deploy/compose/docker-compose.postgres.yml with two replicas on
//! PostgreSQL) and the config files they ship, and both Kubernetes variants (deploy/kubernetes on
//! SQLite, deploy/kubernetes/postgres), rendered by `kubectl kustomize` and parsed strictly into
//! k8s-openapi types. Config files are read by `vipwatch check-config`, the normal loader.

#[path = "deploy/files.rs"]
mod deploy_files;
#[path = "deploy/kubelet.rs"]
mod kubelet;
#[path = "deploy/postgres.rs"]
mod postgres;
#[path = "common/require.rs"]
mod require;
#[path = "deploy/serve.rs"]
mod serve;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use deploy_files::{
    COMPOSE, COMPOSE_POSTGRES, Compose, ComposeService, Dockerfile, KUSTOMIZE_POSTGRES, KUSTOMIZE_SQLITE, Manifests,
    check_config, interpolate, kustomization, load_config, repo, vipwatch,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
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
    let config = load_config(&compose.file(&mounted), &[("APPLIANCE_WEBHOOK_SECRET", secret)]);
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
        load_config(&compose.file(&mounted), &[("APPLIANCE_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]);
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
fn compose_with_postgres_runs_two_replicas_of_the_image_beside_the_same_sidecars() {
    let (root, pg) = (Compose::read(), Compose::read_file(COMPOSE_POSTGRES));
    assert_eq!(
        pg.services.keys().collect::<Vec<_>>(),
        ["appliance", "kubectl-proxy", "postgres", REPLICA_A, REPLICA_B]
    );
    // The sidecar and the example appliance are the root file's (the build context resolved).
    let (raw_root, raw_pg) = (Compose::raw(COMPOSE), Compose::raw(COMPOSE_POSTGRES));
    assert_eq!(raw_pg["services"]["kubectl-proxy"], raw_root["services"]["kubectl-proxy"]);
    let without_build = |v: &serde_json::Value| {
        let mut v = v.clone();
        v.as_object_mut().unwrap().remove("build");
        v
    };
    assert_eq!(without_build(&raw_pg["services"]["appliance"]), without_build(&raw_root["services"]["appliance"]));
    let context = |c: &Compose, s: &ComposeService| c.file(s.build.as_deref().expect("built from the repository"));
    assert_eq!(context(&pg, pg.service("appliance")), context(&root, root.service("appliance")));
    let single = root.service("vipwatch");
    let config_path = Dockerfile::read().env("VIPWATCH_CONFIG");
    let mut host_ports = BTreeSet::new();
    for name in [REPLICA_A, REPLICA_B] {
        let replica = pg.service(name);
        assert_eq!((&replica.image, context(&pg, replica)), (&single.image, context(&root, single)), "{name}");
        assert_eq!(replica.healthcheck.test, single.healthcheck.test, "{name}");
        assert_eq!(replica.depends_on.keys().collect::<Vec<_>>(), ["appliance", "kubectl-proxy", "postgres"]);
        assert!(replica.depends_on.values().all(|d| d.condition == "service_healthy"), "{name}");
        // Only the config file: everything else is in PostgreSQL, no volume for vipwatch.
        assert_eq!(replica.volumes.len(), 1, "{name}: {:?}", replica.volumes);
        let mounted = replica.mount_source(&config_path).expect("a config file over the image's");
        let config = load_config(&pg.file(&mounted), &compose_environment(&pg, name, &compose_host_env()));
        let port = config.server.listen.port().to_string();
        let [published] = replica.ports.as_slice() else { panic!("{name}: one port") };
        let (host_port, container_port) = published.strip_prefix("127.0.0.1:").unwrap().split_once(':').unwrap();
        assert_eq!(container_port, port, "{name}");
        host_ports.insert(host_port.to_owned());
        let mut keys: BTreeSet<String> = single.environment.keys().cloned().collect();
        keys.extend(["VIPWATCH_DATABASE__URL".to_owned(), "VIPWATCH_DATABASE__REPLICA".to_owned()]);
        assert_eq!(replica.environment.keys().cloned().collect::<BTreeSet<_>>(), keys, "{name}");
    }
    assert_eq!(host_ports, BTreeSet::from(["8080".to_owned(), "8081".to_owned()]));
}

#[test]
fn compose_with_postgres_points_both_replicas_at_its_database_by_distinct_names() {
    let pg = Compose::read_file(COMPOSE_POSTGRES);
    let postgres = pg.service("postgres");
    let version = postgres.image.strip_prefix("postgres:").expect("the postgres image");
    let major: u32 = version.split(['.', '-']).next().unwrap().parse().unwrap();
    assert!(major >= 15, "{}", postgres.image);
    assert_eq!(postgres.mount_source("/var/lib/postgresql/data").as_deref(), Some("postgres-data"));
    assert!(pg.volumes.contains_key("postgres-data"));
    let host = compose_host_env();
    let env = |service: &ComposeService, key: &str| {
        let value = service.environment.get(key).cloned().flatten();
        interpolate(&value.unwrap_or_else(|| panic!("{key} is set")), &host).unwrap()
    };
    let (user, database) = (env(postgres, "POSTGRES_USER"), env(postgres, "POSTGRES_DB"));
    assert_eq!(env(postgres, "POSTGRES_PASSWORD"), host["POSTGRES_PASSWORD"]);
    let check = &postgres.healthcheck.test;
    assert_eq!(check[..2], ["CMD", "pg_isready"]);
    for arg in ["--host=127.0.0.1".to_owned(), format!("--username={user}"), format!("--dbname={database}")] {
        assert!(check.contains(&arg), "health check {check:?} lacks {arg}");
    }
    // Required, as the webhook secret is: unset, compose refuses to start anything.
    let unset = BTreeMap::new();
    let required = |service: &ComposeService, key: &str| {
        interpolate(service.environment[key].as_deref().unwrap(), &unset).expect_err("required")
    };
    assert!(required(postgres, "POSTGRES_PASSWORD").contains("POSTGRES_PASSWORD"));
    let mut urls = BTreeSet::new();
    for name in [REPLICA_A, REPLICA_B] {
        let replica = pg.service(name);
        assert!(required(replica, "VIPWATCH_DATABASE__URL").contains("POSTGRES_PASSWORD"));
        let url: url::Url = env(replica, "VIPWATCH_DATABASE__URL").parse().unwrap();
        assert_eq!(url.scheme(), "postgres");
        assert_eq!(url.host_str(), Some("postgres"), "the compose service");
        assert_eq!(url.port(), Some(5432));
        assert_eq!((url.username(), url.password()), (user.as_str(), Some(host["POSTGRES_PASSWORD"].as_str())));
        assert_eq!(url.path(), format!("/{database}"));
        // Its name in the lease and the API: the service's own name, so the two never collide.
        assert_eq!(env(replica, "VIPWATCH_DATABASE__REPLICA"), name);
        urls.insert(env(replica, "VIPWATCH_DATABASE__URL"));
    }
    assert_eq!(urls.len(), 1, "one database for both replicas");
}

#[test]
fn compose_with_postgres_configures_each_replica_as_the_single_one_but_for_the_database() {
    let pg = Compose::read_file(COMPOSE_POSTGRES);
    let root = Compose::read();
    let config_path = Dockerfile::read().env("VIPWATCH_CONFIG");
    let single = effective_config(&compose_check_config(&root, "vipwatch", &config_path));
    for name in [REPLICA_A, REPLICA_B] {
        let stdout = compose_check_config(&pg, name, &config_path);
        let config: Config = toml::from_str(&stdout).unwrap();
        assert!(config.database.url.is_some(), "{name}: database.url from VIPWATCH_DATABASE__URL");
        assert_eq!(config.database.replica.as_deref(), Some(name));
        assert_eq!(effective_config(&stdout), single, "{name}");
    }
}

#[test]
fn every_kubernetes_manifest_is_a_known_kind_with_only_known_fields() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let shared = [
        "Namespace/vipwatch",
        "ServiceAccount/vipwatch",
        "ClusterRole/vipwatch",
        "ClusterRoleBinding/vipwatch",
        "ConfigMap/vipwatch",
        "Secret/vipwatch",
        "Service/vipwatch",
        "Deployment/vipwatch",
    ];
    let objects = |m: &Manifests| m.objects().into_iter().collect::<BTreeSet<_>>();
    let with = |extra: &[&str]| shared.iter().chain(extra).map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(objects(&Manifests::sqlite()), with(&["PersistentVolumeClaim/vipwatch-data"]));
    assert_eq!(objects(&Manifests::postgres()), with(&["Secret/vipwatch-postgres", "PodDisruptionBudget/vipwatch"]));
    for m in Manifests::variants() {
        m.check_all_strictly();
    }
}

#[test]
fn kustomize_renders_every_manifest_file_into_the_vipwatch_namespace() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    // Every YAML file under deploy/kubernetes is a kustomization, or a resource or patch one uses.
    let root = repo(KUSTOMIZE_SQLITE);
    let mut files = BTreeSet::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                files.insert(path.canonicalize().unwrap());
            }
        }
    }
    let mut used = BTreeSet::new();
    let mut pending = vec![repo(KUSTOMIZE_SQLITE), repo(KUSTOMIZE_POSTGRES)];
    while let Some(dir) = pending.pop() {
        let dir = dir.canonicalize().unwrap();
        used.insert(dir.join("kustomization.yaml"));
        let k = kustomization(&dir);
        let named = k.resources.iter().chain(k.patches.iter().filter_map(|p| p.path.as_ref()));
        for path in named.map(|r| dir.join(r).canonicalize().unwrap_or_else(|e| panic!("{r}: {e}"))) {
            if path.is_dir() {
                pending.push(path);
            } else {
                used.insert(path);
            }
        }
    }
    assert_eq!(files, used);
    for m in Manifests::variants() {
        for (label, doc) in &m.docs {
            let cluster_scoped =
                ["Namespace", "ClusterRole", "ClusterRoleBinding"].contains(&doc["kind"].as_str().unwrap());
            let namespace = doc["metadata"]["namespace"].as_str();
            assert_eq!(namespace, (!cluster_scoped).then_some("vipwatch"), "{label}");
        }
    }
}

#[test]
fn the_postgres_variant_keeps_the_base_identity_rbac_api_service_and_secret() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let (sqlite, postgres) = (Manifests::sqlite(), Manifests::postgres());
    let doc = |m: &Manifests, object: &str| {
        let (_, doc) = m.docs.iter().find(|(label, _)| label.ends_with(&format!(": {object}"))).unwrap();
        doc.clone()
    };
    // Leader election takes a lease row in PostgreSQL, not a Kubernetes Lease: no new RBAC.
    let shared = [
        "Namespace/vipwatch",
        "ServiceAccount/vipwatch",
        "ClusterRole/vipwatch",
        "ClusterRoleBinding/vipwatch",
        "Secret/vipwatch",
        "Service/vipwatch",
    ];
    for object in shared {
        assert_eq!(doc(&postgres, object), doc(&sqlite, object), "{object}");
    }
}

#[test]
fn the_deployment_serves_the_configmaps_port_and_mounts_the_claim_at_the_database_dir() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let m = Manifests::sqlite();
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
fn the_postgres_deployment_runs_two_replicas_rolling_one_at_a_time_without_a_volume() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let m = Manifests::postgres();
    let config = configmap_config(&m, &secret_env(&m, true));
    assert!(config.database.url.is_some(), "database.url from the Secret vipwatch-postgres");
    let deployment: Deployment = m.one();
    let spec = &deployment.spec;
    assert_eq!(spec.replicas, Some(2));
    // Safe to overlap, unlike with SQLite: only the lease holder acts. A new pod is Ready (it reads the
    // database) before an old one stops.
    let strategy = spec.strategy.clone().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.unwrap();
    assert_eq!((rolling.max_surge, rolling.max_unavailable), (Some(IntOrString::Int(1)), Some(IntOrString::Int(0))));
    assert!(m.all::<PersistentVolumeClaim>().is_empty(), "no claim");
    let pod = spec.template.spec.clone().unwrap();
    assert!(pod.volumes.iter().flatten().all(|v| v.persistent_volume_claim.is_none()));
    let container = &pod.containers[0];
    let mounts: BTreeMap<&str, &str> =
        container.volume_mounts.iter().flatten().map(|v| (v.name.as_str(), v.mount_path.as_str())).collect();
    assert_eq!(mounts, BTreeMap::from([("config", "/etc/vipwatch"), ("tmp", "/tmp")]));
    let configmap: ConfigMap = m.one();
    let volume = pod.volumes.iter().flatten().find(|v| v.name == "config").unwrap();
    assert_eq!(volume.config_map.clone().unwrap().name, configmap.metadata.name.unwrap());
    let env = container.env.iter().flatten().find(|e| e.name == "VIPWATCH_CONFIG").and_then(|e| e.value.clone());
    assert_eq!(env, Some(format!("{}/vipwatch.toml", mounts["config"])));
    let port = &container.ports.as_ref().unwrap()[0];
    assert_eq!((port.name.as_deref(), port.container_port), (Some("http"), i32::from(config.server.listen.port())));
    // A drain takes one replica at a time; the scheduler prefers one replica per node.
    let labels = spec.template.metadata.clone().unwrap().labels.unwrap();
    let budget = m.one::<PodDisruptionBudget>().spec.unwrap();
    assert_eq!(budget.min_available, Some(IntOrString::Int(1)));
    assert_eq!(budget.selector.and_then(|s| s.match_labels), Some(labels.clone()));
    let anti = pod.affinity.and_then(|a| a.pod_anti_affinity).unwrap();
    assert!(anti.required_during_scheduling_ignored_during_execution.is_none(), "preferred, not required");
    let [term] = anti.preferred_during_scheduling_ignored_during_execution.unwrap().try_into().unwrap();
    assert_eq!(term.pod_affinity_term.topology_key, "kubernetes.io/hostname");
    assert_eq!(term.pod_affinity_term.label_selector.and_then(|s| s.match_labels), Some(labels));
}

#[test]
fn the_postgres_deployment_is_the_sqlite_one_but_for_replicas_storage_and_database() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let actual: Deployment = Manifests::postgres().one();
    let mut expected: Deployment = Manifests::sqlite().one();
    expected.spec.replicas = actual.spec.replicas;
    expected.spec.strategy = actual.spec.strategy.clone();
    let actual_pod = actual.spec.template.spec.as_ref().unwrap();
    let pod = expected.spec.template.spec.as_mut().unwrap();
    pod.affinity = actual_pod.affinity.clone();
    pod.volumes.get_or_insert_default().retain(|v| v.persistent_volume_claim.is_none());
    let container = &mut pod.containers[0];
    container.volume_mounts.get_or_insert_default().retain(|m| m.mount_path != "/var/lib/vipwatch");
    let added = actual_pod.containers[0].env.iter().flatten().filter(|e| e.name.starts_with("VIPWATCH_DATABASE__"));
    container.env.get_or_insert_default().extend(added.cloned());
    // The order of variables does not matter (none refers to another); kustomize puts new ones first.
    let mut actual = actual;
    for d in [&mut actual, &mut expected] {
        let env = d.spec.template.spec.as_mut().unwrap().containers[0].env.get_or_insert_default();
        env.sort_by(|a, b| a.name.cmp(&b.name));
    }
    // Probes, resources, security, grace period, image, service account: the base's.
    assert_eq!(actual, expected);
}

#[test]
fn each_postgres_replica_is_named_after_its_pod_and_reads_the_url_from_its_secret() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let m = Manifests::postgres();
    let deployment: Deployment = m.one();
    let container = deployment.spec.template.spec.unwrap().containers.remove(0);
    let from = |name: &str| {
        let var = container.env.iter().flatten().find(|e| e.name == name).unwrap_or_else(|| panic!("{name}"));
        var.value_from.clone().unwrap_or_else(|| panic!("{name} comes from elsewhere"))
    };
    let replica = from("VIPWATCH_DATABASE__REPLICA").field_ref.expect("the downward API");
    assert_eq!(replica.field_path, "metadata.name");
    let url = from("VIPWATCH_DATABASE__URL").secret_key_ref.expect("a Secret key");
    let secret: Secret = m.named(&url.name);
    assert!(secret.string_data.unwrap().contains_key(&url.key));
    let dir = tempfile::tempdir().unwrap();
    let file = write_configmap_toml(&m, &dir);
    let config = load_config(&file, &pod_env(&m, true, &file));
    assert_eq!(config.database.replica.as_deref(), Some(kubelet::POD_NAME), "the pod's name");
    assert!(config.database.url.is_some());
}

#[test]
fn the_postgres_configmap_is_the_sqlite_one_but_for_the_database() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let effective = |m: &Manifests| {
        let dir = tempfile::tempdir().unwrap();
        let file = write_configmap_toml(m, &dir);
        let output = check_config(&file, &pod_env(m, false, &file));
        assert_eq!(output.status.code(), Some(0), "{}: {}", m.dir, String::from_utf8_lossy(&output.stderr));
        effective_config(&String::from_utf8(output.stdout).unwrap())
    };
    assert_eq!(effective(&Manifests::postgres()), effective(&Manifests::sqlite()));
}

#[test]
fn the_probes_are_real_api_routes_on_the_api_port() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let openapi: serde_json::Value = serde_json::from_str(&vipwatch::api::openapi::document_json()).unwrap();
    for m in Manifests::variants() {
        let deployment: Deployment = m.one();
        let container = &deployment.spec.template.spec.unwrap().containers[0];
        let probes = [
            ("startup", container.startup_probe.clone()),
            ("liveness", container.liveness_probe.clone()),
            ("readiness", container.readiness_probe.clone()),
        ];
        let mut paths = Vec::new();
        for (what, probe) in probes {
            let get = probe.and_then(|p| p.http_get).unwrap_or_else(|| panic!("{what} probe is an HTTP GET"));
            assert_eq!(get.port, IntOrString::String("http".into()), "{}: {what} probe", m.dir);
            let path = get.path.unwrap();
            assert!(openapi["paths"].get(&path).is_some(), "{}: {what} probe: {path} is not an API route", m.dir);
            paths.push(path);
        }
        assert_eq!(paths, ["/healthz", "/healthz", "/readyz"], "{}", m.dir);
        let service: Service = m.one();
        let port = &service.spec.unwrap().ports.unwrap()[0];
        assert_eq!(port.target_port, Some(IntOrString::String("http".into())), "{}", m.dir);
    }
}

#[test]
fn the_secret_holds_exactly_the_variables_the_config_reads() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    for m in Manifests::variants() {
        let secret: Secret = m.named("vipwatch");
        let keys: BTreeSet<String> = secret.string_data.clone().unwrap().into_keys().collect();
        let config = configmap_config(&m, &secret_env(&m, true));
        let mut wanted: BTreeSet<String> = config.webhooks.iter().filter_map(|w| w.secret_env.clone()).collect();
        wanted.insert("VIPWATCH_API_TOKEN".into());
        assert_eq!(keys, wanted, "{}", m.dir);
        assert!(config.server.api_token.is_some(), "VIPWATCH_API_TOKEN reaches server.api_token");
        let deployment: Deployment = m.one();
        let container = &deployment.spec.template.spec.unwrap().containers[0];
        let [from] = container.env_from.clone().unwrap().try_into().unwrap();
        assert_eq!(Some(from.secret_ref.unwrap().name), secret.metadata.name);
        // Every Secret holds exactly the keys the container reads from it.
        let vars = kubelet::container_variables(&m, |_, shipped| shipped.to_owned());
        let read: BTreeSet<(String, String)> = vars.into_iter().filter_map(|v| v.secret).collect();
        let held: BTreeSet<(String, String)> = m
            .all::<Secret>()
            .into_iter()
            .flat_map(|s| {
                let name = s.metadata.name.unwrap();
                s.string_data.unwrap_or_default().into_keys().map(move |k| (name.clone(), k))
            })
            .collect();
        assert_eq!(held, read, "{}", m.dir);
        // The PostgreSQL variant's Secret is the database URL; the SQLite variant has none.
        let postgres = m.dir == KUSTOMIZE_POSTGRES;
        assert_eq!(config.database.url.is_some(), postgres, "{}: database.url", m.dir);
        if postgres {
            let secret: Secret = m.named("vipwatch-postgres");
            assert_eq!(secret.string_data.unwrap().into_keys().collect::<Vec<_>>(), ["url"]);
        }
    }
}

#[test]
fn the_shipped_placeholder_secret_is_refused_until_replaced() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    for m in Manifests::variants() {
        let dir = tempfile::tempdir().unwrap();
        let file = write_configmap_toml(&m, &dir);
        let output = check_config(&file, &secret_env(&m, false));
        assert_eq!(output.status.code(), Some(2), "{}", m.dir);
        assert_eq!(
            String::from_utf8_lossy(&output.stderr).trim_end(),
            "vipwatch: invalid configuration: invalid value for `webhooks.appliance.secret`: not a Standard Webhooks secret (`whsec_` + base64 key)"
        );
    }
}

#[test]
fn the_pod_runs_as_the_images_user_without_privileges() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let uid = Dockerfile::read().args("USER")[0].parse::<i64>().unwrap();
    for m in Manifests::variants() {
        let deployment: Deployment = m.one();
        let pod = deployment.spec.template.spec.unwrap();
        let security = pod.security_context.unwrap();
        let ids = (security.run_as_non_root, security.run_as_user, security.fs_group);
        assert_eq!(ids, (Some(true), Some(uid), Some(uid)), "{}", m.dir);
        let container = pod.containers[0].security_context.clone().unwrap();
        assert_eq!(container.read_only_root_filesystem, Some(true));
        assert_eq!(container.allow_privilege_escalation, Some(false));
        assert_eq!(container.capabilities.unwrap().drop, Some(vec!["ALL".to_owned()]));
        let account: ServiceAccount = m.one();
        assert_eq!(pod.service_account_name, account.metadata.name);
    }
}

#[test]
fn the_cluster_role_grants_what_vipwatch_does_and_is_bound_to_its_account() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    // The PostgreSQL variant has the same (the_postgres_variant_keeps_the_base_identity_rbac_api_service_and_secret).
    let m = Manifests::sqlite();
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
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
        ("discovery.k8s.io", "endpointslices", "watch"),
        ("", "nodes", "watch"),
        ("", "namespaces", "get"),
    ];
    for (group, resource, verb) in needed {
        assert!(allows(group, resource, verb), "{verb} {group}/{resource}");
    }
    assert!(!allows("", "secrets", "get") && !allows("", "services", "delete"));
    assert!(!allows("", "events", "create"), "Events go through events.k8s.io/v1 only");
    let namespaces = role.rules.iter().flatten().find(|r| r.resources.iter().flatten().any(|x| x == "namespaces"));
    let names = namespaces.and_then(|r| r.resource_names.clone());
    assert_eq!(names, Some(vec!["kube-system".to_owned()]), "only kube-system is read, for the cluster's uid");
    // Leader election (PostgreSQL) takes a lease row in the database, not a Kubernetes Lease.
    assert!(!allows("coordination.k8s.io", "leases", "get"));
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
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    for m in Manifests::variants() {
        let deployment: Deployment = m.one();
        let pod = deployment.spec.template.spec.unwrap();
        assert_eq!(pod.enable_service_links, Some(false), "{}", m.dir);
        let config = configmap_config(&m, &secret_env(&m, true));
        let grace = Duration::from_secs(pod.termination_grace_period_seconds.unwrap().try_into().unwrap());
        // After SIGTERM, in-flight deliveries get relay.shutdown_grace, then the database closes; the
        // kubelet's SIGKILL must not come first.
        assert!(
            config.relay.shutdown_grace + Duration::from_secs(5) <= grace,
            "{}: {:?} vs {grace:?}",
            m.dir,
            config.relay.shutdown_grace
        );
    }
}

/// Docker waits 10 s after SIGTERM by default, exactly `relay.shutdown_grace`: a drain that used it
/// all was SIGKILLed before a leader could give its lease up (13–17 s without a leader).
#[test]
fn every_compose_vipwatch_outlasts_the_shutdown_grace() {
    let config_path = Dockerfile::read().env("VIPWATCH_CONFIG");
    for (file, name) in [(COMPOSE, "vipwatch"), (COMPOSE_POSTGRES, REPLICA_A), (COMPOSE_POSTGRES, REPLICA_B)] {
        let compose = Compose::read_file(file);
        let service = compose.service(name);
        let grace =
            service.stop_grace_period.as_deref().unwrap_or_else(|| panic!("{file} {name}: no stop_grace_period"));
        let grace = humantime::parse_duration(grace).unwrap();
        let mounted = compose.file(&service.mount_source(&config_path).unwrap());
        let config = load_config(&mounted, &compose_environment(&compose, name, &compose_host_env()));
        assert!(
            config.relay.shutdown_grace + Duration::from_secs(5) <= grace,
            "{file} {name}: {:?} vs {grace:?}",
            config.relay.shutdown_grace
        );
    }
}

#[test]
fn check_config_reads_the_same_configuration_from_what_a_kubelet_injects() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    for m in Manifests::variants() {
        let dir = tempfile::tempdir().unwrap();
        let file = write_configmap_toml(&m, &dir);
        let mut env = secret_env(&m, true);
        // The variables the container's spec sets itself (the replica's name on PostgreSQL).
        let own = kubelet::container_variables(&m, |var, _| valid_secret_value(var));
        env.extend(
            own.into_iter().filter(|v| v.secret.is_none() && v.name != "VIPWATCH_CONFIG").map(|v| (v.name, v.value)),
        );
        let baseline = check_config(&file, &env);
        assert_eq!(baseline.status.code(), Some(0), "{}: {}", m.dir, String::from_utf8_lossy(&baseline.stderr));
        for links in [false, true] {
            let env = pod_env(&m, links, &file);
            assert_eq!(env.iter().any(|(k, _)| k == "VIPWATCH_PORT_8080_TCP_ADDR"), links);
            let output = vipwatch(&env).arg("check-config").output().unwrap();
            assert_eq!(output.status.code(), Some(0), "{}: {}", m.dir, String::from_utf8_lossy(&output.stderr));
            assert_eq!(String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&baseline.stdout));
        }
    }
}

#[tokio::test]
async fn serve_becomes_ready_on_a_read_only_root_from_what_a_kubelet_injects() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let m = Manifests::sqlite();
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
    let mounted = compose.file(&vipwatch_service.mount_source(&config_path).unwrap());
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
async fn a_postgres_replica_becomes_ready_on_a_read_only_root_without_a_volume_from_what_a_kubelet_injects() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let Some(url) = postgres::fresh_database().await else { return };
    let m = Manifests::postgres();
    let dir = tempfile::tempdir().unwrap();
    let file = write_configmap_toml(&m, &dir);
    let secret_value =
        |var: &str, _: &str| if var == "VIPWATCH_DATABASE__URL" { url.clone() } else { valid_secret_value(var) };
    let mut env = kubelet::environment(&m, true, secret_value);
    for (key, value) in &mut env {
        if key == "VIPWATCH_CONFIG" {
            *value = file.to_str().unwrap().to_owned();
        }
    }
    a_replica_is_ready_with_only_tmp_writable(env).await;
}

#[tokio::test]
async fn a_compose_postgres_replica_becomes_ready_on_a_read_only_root_without_a_volume() {
    let Some(url) = postgres::fresh_database().await else { return };
    let pg = Compose::read_file(COMPOSE_POSTGRES);
    let config_path = Dockerfile::read().env("VIPWATCH_CONFIG");
    let replica = pg.service(REPLICA_A);
    let mut env = compose_environment(&pg, REPLICA_A, &compose_host_env());
    env.push(("HOSTNAME".into(), "3f2a9c1d7b8e".into()));
    env.push((
        "VIPWATCH_CONFIG".into(),
        pg.file(&replica.mount_source(&config_path).unwrap()).to_str().unwrap().into(),
    ));
    // Instead of the compose service `postgres`: the test server (the later value wins).
    env.push(("VIPWATCH_DATABASE__URL".into(), url));
    a_replica_is_ready_with_only_tmp_writable(env).await;
}

/// Serves a PostgreSQL replica with environment `env` against a fresh fake apiserver, with nothing
/// writable but an empty `/tmp` (the pod's emptyDir; no database volume), and asserts it becomes
/// ready and exits 0 on SIGTERM.
async fn a_replica_is_ready_with_only_tmp_writable(mut env: Vec<(String, String)>) {
    let api = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    env.push(("VIPWATCH_KUBERNETES__URL".into(), api.url()));
    env.push(("VIPWATCH_SERVER__LISTEN".into(), "127.0.0.1:0".into()));
    let served = serve::serve_read_only(&env, &tmp, DEADLINE).await;
    assert!(served.ready, "not ready:\n{}", served.stderr);
    assert_eq!(served.status.code(), Some(0), "{}", served.stderr);
}

#[tokio::test]
async fn while_the_first_list_cannot_complete_the_probes_keep_the_pod_alive_but_unready() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let deployment: Deployment = Manifests::sqlite().one();
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

/// The two replicas of the compose file with PostgreSQL.
const REPLICA_A: &str = "vipwatch-a";
const REPLICA_B: &str = "vipwatch-b";

/// What the kubelet injects into the shipped container (see `deploy/kubelet.rs`), with valid secret
/// values and the mounted ConfigMap file at `file` instead of `/etc/vipwatch/vipwatch.toml` (the test
/// cannot write there).
fn pod_env(m: &Manifests, service_links: bool, file: &Path) -> Vec<(String, String)> {
    let mut env = kubelet::environment(m, service_links, |var, _| valid_secret_value(var));
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

/// A valid value for a variable the shipped Secrets or the compose files pass: the API token, the
/// database URL, or a webhook secret.
fn valid_secret_value(key: &str) -> String {
    match key {
        "VIPWATCH_API_TOKEN" => "t0ken",
        "VIPWATCH_DATABASE__URL" => "postgres://vipwatch:s3cret@postgres.vipwatch.svc:5432/vipwatch",
        _ => "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    }
    .to_owned()
}

/// What the shell running `docker compose up` exports, as README says: the webhook secret, the API
/// token and (with PostgreSQL) the database password.
fn compose_host_env() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("APPLIANCE_WEBHOOK_SECRET".to_owned(), valid_secret_value("APPLIANCE_WEBHOOK_SECRET")),
        ("VIPWATCH_API_TOKEN".to_owned(), valid_secret_value("VIPWATCH_API_TOKEN")),
        ("POSTGRES_PASSWORD".to_owned(), "Xk3-q_9vLr2".to_owned()),
    ])
}

/// The environment compose gives `service` of `compose`: its `environment`, interpolated from `host`;
/// a variable without a value is passed through from `host` when set there.
fn compose_environment(compose: &Compose, service: &str, host: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let service = compose.service(service);
    let mut env = Vec::new();
    for (key, value) in &service.environment {
        match value {
            Some(text) => env.push((key.clone(), interpolate(text, host).unwrap_or_else(|e| panic!("{key}: {e}")))),
            None => env.extend(host.get(key).map(|v| (key.clone(), v.clone()))),
        }
    }
    env
}

/// `vipwatch check-config`'s output for `service` of `compose`: its environment with the mounted config
/// file (at `config_path` in the container) from the repository.
fn compose_check_config(compose: &Compose, service: &str, config_path: &str) -> String {
    let mounted = compose.file(&compose.service(service).mount_source(config_path).unwrap());
    let mut env = compose_environment(compose, service, &compose_host_env());
    env.push(("VIPWATCH_CONFIG".into(), mounted.to_str().unwrap().into()));
    let output = vipwatch(&env).arg("check-config").output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{service}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// A `check-config` output without what differs between SQLite and PostgreSQL on purpose: the SQLite
/// file, the database URL and the replica's name.
fn effective_config(check_config_stdout: &str) -> toml::Table {
    let mut config: toml::Table = toml::from_str(check_config_stdout).unwrap();
    let database = config.get_mut("database").and_then(|d| d.as_table_mut()).unwrap();
    for key in ["path", "url", "replica"] {
        database.remove(key);
    }
    config
}

/// The directory of the database file.
fn database_dir(config: &Config) -> String {
    config.database.path.parent().unwrap().to_str().unwrap().to_owned()
}

/// The container's variables from Secrets (every key of `envFrom`, each `secretKeyRef`): as shipped,
/// or (`valid`) with each value replaced by a valid one of its kind.
fn secret_env(m: &Manifests, valid: bool) -> Vec<(String, String)> {
    kubelet::container_variables(m, |var, shipped| if valid { valid_secret_value(var) } else { shipped.to_owned() })
        .into_iter()
        .filter(|v| v.secret.is_some())
        .map(|v| (v.name, v.value))
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
