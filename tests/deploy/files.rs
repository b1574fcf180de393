//! Readers for the deployment files of tests/deploy.rs: the Dockerfile's final stage, the compose files
//! (typed, with compose's `${VAR}` interpolation), the Kubernetes manifests of each kustomize variant
//! (rendered by `kubectl kustomize`, checked strictly against k8s-openapi), and config files loaded by
//! `vipwatch check-config`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use k8s_openapi::Resource;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use vipwatch::config::Config;

/// A path inside the repository.
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Runs `vipwatch check-config --config FILE` with `env` and no other `VIPWATCH_*` variable.
pub fn check_config<K: AsRef<str>, V: AsRef<str>>(file: &Path, env: &[(K, V)]) -> Output {
    let mut cmd = vipwatch(env);
    cmd.arg("check-config").arg("--config").arg(file);
    cmd.output().expect("vipwatch runs")
}

/// The `vipwatch` binary in the temp directory with `env` and no other `VIPWATCH_*` variable.
pub fn vipwatch<K: AsRef<str>, V: AsRef<str>>(env: &[(K, V)]) -> Command {
    command(env!("CARGO_BIN_EXE_vipwatch"), env)
}

/// `program` in the temp directory with `env` and no other `VIPWATCH_*` variable.
pub fn command<K: AsRef<str>, V: AsRef<str>>(program: &str, env: &[(K, V)]) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(std::env::temp_dir());
    for (key, _) in std::env::vars().filter(|(k, _)| k.to_ascii_uppercase().starts_with("VIPWATCH_")) {
        cmd.env_remove(key);
    }
    for (key, value) in env {
        cmd.env(key.as_ref(), value.as_ref());
    }
    cmd
}

/// The effective configuration of `file` with `env`, as the normal loader sees it (secrets redacted).
/// Panics with the loader's message when it is invalid.
pub fn load_config<K: AsRef<str>, V: AsRef<str>>(file: &Path, env: &[(K, V)]) -> Config {
    let output = check_config(file, env);
    assert!(output.status.success(), "{}: {}", file.display(), String::from_utf8_lossy(&output.stderr));
    toml::from_str(&String::from_utf8(output.stdout).unwrap()).expect("check-config prints the config")
}

/// The instructions of the Dockerfile's final stage: `(INSTRUCTION, arguments)`, continuation lines
/// joined, comments dropped.
pub struct Dockerfile(Vec<(String, String)>);

impl Dockerfile {
    pub fn read() -> Self {
        let mut all = Vec::new();
        let mut current = String::new();
        for line in read("Dockerfile").lines().map(str::trim) {
            if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
                continue;
            }
            if let Some(start) = line.strip_suffix('\\') {
                current.push_str(start);
                continue;
            }
            current.push_str(line);
            let (instruction, args) = current.split_once(' ').expect("instruction with arguments");
            all.push((instruction.to_ascii_uppercase(), args.trim().to_owned()));
            current.clear();
        }
        let last_from = all.iter().rposition(|(i, _)| i == "FROM").expect("a FROM");
        Self(all.split_off(last_from))
    }

    /// The arguments of every `instruction` of the final stage, in order.
    pub fn args(&self, instruction: &str) -> Vec<String> {
        self.0.iter().filter(|(i, _)| i == instruction).map(|(_, a)| a.clone()).collect()
    }

    /// The exec-form (JSON array) arguments of the only `instruction`.
    pub fn json(&self, instruction: &str) -> Vec<String> {
        let args = self.args(instruction);
        assert_eq!(args.len(), 1, "one {instruction}");
        serde_json::from_str(&args[0]).unwrap_or_else(|e| panic!("{instruction} {}: {e}", args[0]))
    }

    /// The value the final stage's `ENV` gives `name` (`ENV NAME=value`).
    pub fn env(&self, name: &str) -> String {
        let prefix = format!("{name}=");
        self.args("ENV")
            .iter()
            .find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
            .unwrap_or_else(|| panic!("ENV {name}"))
    }

    /// The exec-form command of `HEALTHCHECK [options] CMD [...]`.
    pub fn healthcheck(&self) -> Vec<String> {
        let args = self.args("HEALTHCHECK");
        let (_, cmd) = args[0].split_once("CMD ").expect("HEALTHCHECK ... CMD [...]");
        serde_json::from_str(cmd).expect("exec form")
    }
}

/// The compose file at the repository root: vipwatch on SQLite.
pub const COMPOSE: &str = "docker-compose.yml";

/// The compose file of two replicas on PostgreSQL.
pub const COMPOSE_POSTGRES: &str = "deploy/compose/docker-compose.postgres.yml";

/// A compose file, the parts the tests compare (as written: `${VAR}` not interpolated).
#[derive(Debug, Deserialize)]
pub struct Compose {
    /// The file's directory, relative to the repository: compose resolves relative paths from it.
    #[serde(skip)]
    pub dir: PathBuf,
    pub services: BTreeMap<String, ComposeService>,
    pub volumes: BTreeMap<String, Option<Value>>,
}

/// One service of [`Compose`].
#[derive(Debug, Deserialize)]
pub struct ComposeService {
    /// `build` in short form (the context directory).
    pub build: Option<String>,
    pub image: String,
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub depends_on: BTreeMap<String, DependsOn>,
    #[serde(default)]
    pub environment: BTreeMap<String, Option<String>>,
    #[serde(default)]
    pub volumes: Vec<String>,
    #[serde(default)]
    pub ports: Vec<String>,
    pub healthcheck: Healthcheck,
    /// How long `docker compose stop` waits after SIGTERM before SIGKILL (docker's default: 10 s).
    pub stop_grace_period: Option<String>,
}

/// `depends_on.NAME` in long form.
#[derive(Debug, Deserialize)]
pub struct DependsOn {
    pub condition: String,
}

/// `healthcheck` of a service.
#[derive(Debug, Deserialize)]
pub struct Healthcheck {
    pub test: Vec<String>,
}

impl Compose {
    /// docker-compose.yml.
    pub fn read() -> Self {
        Self::read_file(COMPOSE)
    }

    /// The compose file at `path` (relative to the repository).
    pub fn read_file(path: &str) -> Self {
        let mut compose: Self = serde_norway::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        compose.dir = Path::new(path).parent().unwrap().to_owned();
        compose
    }

    /// The file a relative path of this compose file (a bind mount's source, a build context) names.
    pub fn file(&self, relative: &str) -> PathBuf {
        let path = repo(&self.dir.to_string_lossy()).join(relative);
        path.canonicalize().unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The file as plain YAML, for comparing whole services.
    pub fn raw(path: &str) -> Value {
        serde_norway::from_str(&read(path)).unwrap()
    }

    pub fn service(&self, name: &str) -> &ComposeService {
        self.services.get(name).unwrap_or_else(|| panic!("service {name}"))
    }
}

/// `text` with compose's interpolation applied: `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
/// `${VAR:?error}`, `${VAR?error}` and `$$`, variables from `env`. Err: the message of a required
/// variable that is unset (or empty, for `:?`).
pub fn interpolate(text: &str, env: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            out.push('$');
            rest = after;
            continue;
        }
        let inner = rest.strip_prefix('{').expect("only the ${VAR} form is used");
        let end = inner.find('}').expect("a closing brace");
        let (expr, after) = (&inner[..end], &inner[end + 1..]);
        rest = after;
        let name_end = expr.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(expr.len());
        let (name, op) = expr.split_at(name_end);
        let value = env.get(name).cloned();
        let set_non_empty = value.clone().filter(|v| !v.is_empty());
        let resolved = match op {
            "" => value.unwrap_or_default(),
            _ if op.starts_with(":-") => set_non_empty.unwrap_or_else(|| op[2..].to_owned()),
            _ if op.starts_with('-') => value.unwrap_or_else(|| op[1..].to_owned()),
            _ if op.starts_with(":?") => set_non_empty.ok_or_else(|| op[2..].to_owned())?,
            _ if op.starts_with('?') => value.ok_or_else(|| op[1..].to_owned())?,
            _ => panic!("unsupported interpolation ${{{expr}}}"),
        };
        out.push_str(&resolved);
    }
    out.push_str(rest);
    Ok(out)
}

impl ComposeService {
    /// The source of the volume mounted at `target` (`SOURCE:TARGET[:ro]`), with `./` dropped.
    pub fn mount_source(&self, target: &str) -> Option<String> {
        self.volumes.iter().find_map(|v| {
            let mut parts = v.split(':');
            let (source, at) = (parts.next()?, parts.next()?);
            (at == target).then(|| source.trim_start_matches("./").to_owned())
        })
    }
}

/// The kustomization of vipwatch on SQLite (one replica, a PersistentVolumeClaim): the shared base as it
/// is.
pub const KUSTOMIZE_SQLITE: &str = "deploy/kubernetes";

/// The kustomization of vipwatch on PostgreSQL (two replicas, no volume): the base, patched.
pub const KUSTOMIZE_POSTGRES: &str = "deploy/kubernetes/postgres";

/// What `kubectl kustomize DIR` renders for one variant, as `(DIR: Kind/name, JSON)` in its order.
#[derive(Clone)]
pub struct Manifests {
    /// The kustomization directory, relative to the repository.
    pub dir: &'static str,
    pub docs: Vec<(String, Value)>,
}

/// kustomization.yaml, the parts that name files.
#[derive(Debug, Deserialize)]
pub struct Kustomization {
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub patches: Vec<KustomizePatch>,
}

/// One entry of `patches`: a file (`path`) or inline (`patch`).
#[derive(Debug, Deserialize)]
pub struct KustomizePatch {
    pub path: Option<String>,
}

impl Manifests {
    /// vipwatch on SQLite (`kubectl apply -k deploy/kubernetes`).
    pub fn sqlite() -> Self {
        static RENDERED: OnceLock<Manifests> = OnceLock::new();
        RENDERED.get_or_init(|| Self::render(KUSTOMIZE_SQLITE)).clone()
    }

    /// vipwatch on PostgreSQL (`kubectl apply -k deploy/kubernetes/postgres`).
    pub fn postgres() -> Self {
        static RENDERED: OnceLock<Manifests> = OnceLock::new();
        RENDERED.get_or_init(|| Self::render(KUSTOMIZE_POSTGRES)).clone()
    }

    /// Both variants.
    pub fn variants() -> [Self; 2] {
        [Self::sqlite(), Self::postgres()]
    }

    fn render(dir: &'static str) -> Self {
        let docs = kustomize(dir)
            .into_iter()
            .map(|d| {
                let name = d["metadata"]["name"].as_str().unwrap_or("?").to_owned();
                (format!("{dir}: {}/{name}", d["kind"].as_str().unwrap_or("?")), d)
            })
            .collect();
        Self { dir, docs }
    }

    /// The only object of type `T`, checked strictly (see [`strict`]).
    pub fn one<T: Resource + DeserializeOwned + Serialize>(&self) -> T {
        let mut found = self.all::<T>().into_iter();
        let one = found.next().unwrap_or_else(|| panic!("{}: no {}", self.dir, T::KIND));
        assert!(found.next().is_none(), "{}: more than one {}", self.dir, T::KIND);
        one
    }

    /// The object of type `T` named `name`, checked strictly.
    pub fn named<T: Resource + DeserializeOwned + Serialize>(&self, name: &str) -> T {
        let (label, doc) = self
            .docs
            .iter()
            .find(|(_, d)| d["apiVersion"] == T::API_VERSION && d["kind"] == T::KIND && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{}: no {} {name}", self.dir, T::KIND));
        strict(label, doc)
    }

    /// Every object of type `T`, checked strictly.
    pub fn all<T: Resource + DeserializeOwned + Serialize>(&self) -> Vec<T> {
        self.docs
            .iter()
            .filter(|(_, d)| d["apiVersion"] == T::API_VERSION && d["kind"] == T::KIND)
            .map(|(label, doc)| strict(label, doc))
            .collect()
    }

    /// `Kind/name` of every object, in rendering order.
    pub fn objects(&self) -> Vec<String> {
        self.docs.iter().map(|(label, _)| label.split_once(": ").unwrap().1.to_owned()).collect()
    }

    /// Parses every document into its k8s-openapi type, failing on an unknown kind or field.
    pub fn check_all_strictly(&self) {
        for (file, doc) in &self.docs {
            let known = parse_as::<Namespace>(file, doc)
                || parse_as::<ServiceAccount>(file, doc)
                || parse_as::<ClusterRole>(file, doc)
                || parse_as::<ClusterRoleBinding>(file, doc)
                || parse_as::<ConfigMap>(file, doc)
                || parse_as::<Secret>(file, doc)
                || parse_as::<PersistentVolumeClaim>(file, doc)
                || parse_as::<Deployment>(file, doc)
                || parse_as::<PodDisruptionBudget>(file, doc)
                || parse_as::<Service>(file, doc);
            assert!(known, "{file}: unknown kind {} {}", doc["apiVersion"], doc["kind"]);
        }
    }
}

/// `true` (after a strict parse) when `doc` is a `T`.
fn parse_as<T: Resource + DeserializeOwned + Serialize>(file: &str, doc: &Value) -> bool {
    let is = doc["apiVersion"] == T::API_VERSION && doc["kind"] == T::KIND;
    if is {
        strict::<T>(file, doc);
    }
    is
}

/// `doc` as a `T`. k8s-openapi ignores unknown fields, so the object is serialized back and must equal
/// what was written: a misspelt or misplaced field fails here.
pub fn strict<T: DeserializeOwned + Serialize>(file: &str, doc: &Value) -> T {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{file}: {}: {e}", doc["kind"]));
    let understood = serde_json::to_value(&typed).unwrap();
    if let Some(path) = first_difference(doc, &understood, String::new()) {
        panic!("{file}: {} {path}: not a field k8s-openapi knows (misspelt or misplaced?)", doc["kind"]);
    }
    typed
}

/// The JSON path of the first place where `written` and `understood` differ, if any.
fn first_difference(written: &Value, understood: &Value, path: String) -> Option<String> {
    match (written, understood) {
        (Value::Object(w), Value::Object(u)) => w.iter().find_map(|(k, v)| match u.get(k) {
            Some(uv) => first_difference(v, uv, format!("{path}.{k}")),
            None => Some(format!("{path}.{k}")),
        }),
        (Value::Array(w), Value::Array(u)) if w.len() == u.len() => {
            w.iter().zip(u).enumerate().find_map(|(i, (wv, uv))| first_difference(wv, uv, format!("{path}[{i}]")))
        }
        _ => (written != understood).then_some(path),
    }
}

/// The non-empty documents of a multi-document YAML text, as JSON.
pub fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("YAML parses"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// `kubectl kustomize DIR` (relative to the repository), as JSON documents.
pub fn kustomize(dir: &str) -> Vec<Value> {
    let output = Command::new("kubectl").arg("kustomize").arg(repo(dir)).output().expect("kubectl on PATH");
    assert!(output.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&output.stderr));
    documents(&String::from_utf8(output.stdout).unwrap())
}

/// The kustomization.yaml of the directory `dir`.
pub fn kustomization(dir: &Path) -> Kustomization {
    let path = dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
