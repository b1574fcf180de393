//! What a kubelet puts into the environment of the shipped Deployment's container, derived from the
//! rendered manifests themselves: the service-link variables of the Services in the pod's namespace
//! (`deploy/kubernetes/base/service.yaml`) and of the master Service `default/kubernetes`, the
//! container's `env` (values, Secret keys and the pod's name through the downward API), and every key
//! of the Secrets named in its `envFrom`. Rules from the kubelet (`pkg/kubelet/envvars/envvars.go`,
//! `FromServices` and `makeLinkVariables`; `pkg/kubelet/kubelet_pods.go`, `makeEnvironmentVariables`).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::deploy_files::Manifests;

/// The ClusterIP the test pretends the apiserver gave the Service `vipwatch`.
pub const CLUSTER_IP: &str = "10.96.12.34";

/// The pod's name the test pretends the ReplicaSet gave it: its `HOSTNAME` and `metadata.name`.
pub const POD_NAME: &str = "vipwatch-6d9c7b8f5-x2x7q";

/// The kubelet's environment for the shipped container: service links (when `service_links`, i.e. with
/// `enableServiceLinks` left at its default `true`), the master Service's variables (always), and the
/// container's own variables (see [`container_variables`]; Secret values from `secret_value`).
pub fn environment(
    m: &Manifests,
    service_links: bool,
    secret_value: impl Fn(&str, &str) -> String,
) -> Vec<(String, String)> {
    let mut env = vec![("HOSTNAME".to_owned(), POD_NAME.to_owned())];
    env.extend(links(&master_service()));
    if service_links {
        let mut service: Service = m.one();
        service.spec.get_or_insert_with(Default::default).cluster_ip = Some(CLUSTER_IP.into());
        env.extend(links(&service));
        // Every Service of the namespace gets links; a name may hold `--` (DNS-1035), which gives
        // `VIPWATCH_RELAY__BLUE_*`: the `VIPWATCH_<TABLE>__<KEY>` form, yet not configuration.
        let mut neighbour = service.clone();
        neighbour.metadata.name = Some("vipwatch-relay--blue".into());
        env.extend(links(&neighbour));
    }
    env.extend(container_variables(m, secret_value).into_iter().map(|v| (v.name, v.value)));
    env
}

/// One variable of the container and where it comes from.
pub struct Variable {
    pub name: String,
    pub value: String,
    /// `Some((Secret, key))` when the value comes from a Secret (`envFrom` or `secretKeyRef`).
    pub secret: Option<(String, String)>,
}

/// The variables the container's own spec gives it, in the kubelet's order: every key of the Secrets
/// of its `envFrom`, then its `env` (a literal `value`; a `secretKeyRef`; a `fieldRef` to
/// `metadata.name`, the pod's name). A value from a Secret is `secret_value(variable, shipped value)`.
/// Panics when a Secret or key it names is not in the manifests.
pub fn container_variables(m: &Manifests, secret_value: impl Fn(&str, &str) -> String) -> Vec<Variable> {
    let deployment: Deployment = m.one();
    let container = deployment.spec.template.spec.unwrap().containers.remove(0);
    let shipped = |secret: &str, key: &str| -> String {
        let data = m.named::<Secret>(secret).string_data.unwrap_or_default();
        data.get(key).cloned().unwrap_or_else(|| panic!("{}: Secret {secret} has no key {key}", m.dir))
    };
    let mut vars = Vec::new();
    for source in container.env_from.into_iter().flatten() {
        let name = source.secret_ref.expect("envFrom a Secret").name;
        for key in m.named::<Secret>(&name).string_data.unwrap_or_default().into_keys() {
            let value = secret_value(&key, &shipped(&name, &key));
            vars.push(Variable { name: key.clone(), value, secret: Some((name.clone(), key)) });
        }
    }
    for var in container.env.into_iter().flatten() {
        let (value, secret) = match var.value_from {
            None => (var.value.unwrap_or_default(), None),
            Some(from) => match (from.secret_key_ref, from.field_ref) {
                (Some(r), None) => (secret_value(&var.name, &shipped(&r.name, &r.key)), Some((r.name, r.key))),
                (None, Some(f)) if f.field_path == "metadata.name" => (POD_NAME.to_owned(), None),
                _ => panic!("{}: {}: a valueFrom the test does not know", m.dir, var.name),
            },
        };
        vars.push(Variable { name: var.name, value, secret });
    }
    vars
}

/// `default/kubernetes`, whose variables every pod gets whatever `enableServiceLinks` says.
fn master_service() -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("kubernetes".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("10.96.0.1".into()),
            ports: Some(vec![ServicePort {
                name: Some("https".into()),
                port: 443,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The kubelet's `FromServices` for one Service with a ClusterIP.
fn links(service: &Service) -> Vec<(String, String)> {
    let spec = service.spec.as_ref().expect("a spec");
    let ip = spec.cluster_ip.clone().expect("a ClusterIP");
    let ports = spec.ports.clone().unwrap_or_default();
    let prefix = env_name(service.metadata.name.as_deref().unwrap());
    let mut out = vec![
        (format!("{prefix}_SERVICE_HOST"), ip.clone()),
        (format!("{prefix}_SERVICE_PORT"), ports[0].port.to_string()),
    ];
    for p in ports.iter().filter(|p| p.name.as_deref().is_some_and(|n| !n.is_empty())) {
        out.push((format!("{prefix}_SERVICE_PORT_{}", env_name(p.name.as_deref().unwrap())), p.port.to_string()));
    }
    for (i, p) in ports.iter().enumerate() {
        let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let url = format!("{}://{ip}:{}", protocol.to_lowercase(), p.port);
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, protocol.to_uppercase());
        out.push((port_prefix.clone(), url));
        out.push((format!("{port_prefix}_PROTO"), protocol.to_lowercase()));
        out.push((format!("{port_prefix}_PORT"), p.port.to_string()));
        out.push((format!("{port_prefix}_ADDR"), ip.clone()));
    }
    out
}

/// The kubelet's `makeEnvVariableName`: upper case, `-` → `_`.
fn env_name(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}
