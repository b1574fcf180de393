//! The collections the fake serves and everything that differs between them: names, group/version and
//! scope, whether there is a `status` subresource, what a create does with `status`, the field labels a
//! `fieldSelector` may use, and the per-kind admission checks of HTTP writes. The store, lists, watches and
//! the write rules are shared by all of them (`state.rs`, `list.rs`, `watch.rs`, `objects.rs`).
//!
//! | [`Resource`]     | kind            | apiVersion             | scope          | `status` subresource |
//! |------------------|-----------------|------------------------|----------------|----------------------|
//! | `Services`       | `Service`       | `v1`                   | namespaced     | yes                  |
//! | `Nodes`          | `Node`          | `v1`                   | cluster-scoped | yes                  |
//! | `EndpointSlices` | `EndpointSlice` | `discovery.k8s.io/v1`  | namespaced     | no                   |
//!
//! Cluster-scoped objects are keyed with namespace `""` and never carry `metadata.namespace` (the
//! apiserver clears one given in a body, as here).

use serde_json::{Value, json};

use super::errors::ApiError;
use super::meta::{meta_mut, meta_str};

/// A collection of the fake apiserver (see the module table for kinds, versions and scope).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// core/v1 `services`: namespaced, with a `status` subresource.
    Services,
    /// core/v1 `nodes`: cluster-scoped (no namespace), with a `status` subresource.
    Nodes,
    /// discovery.k8s.io/v1 `endpointslices`: namespaced, no subresource.
    EndpointSlices,
}

/// The `discovery.k8s.io` API group.
pub(crate) const DISCOVERY_GROUP: &str = "discovery.k8s.io";

impl Resource {
    /// Every resource, in the order of [`Resource::index`].
    pub(crate) const ALL: [Resource; 3] = [Resource::Services, Resource::Nodes, Resource::EndpointSlices];

    /// The object kind: `"Service"`, `"Node"` or `"EndpointSlice"`.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Services => "Service",
            Resource::Nodes => "Node",
            Resource::EndpointSlices => "EndpointSlice",
        }
    }

    /// The objects' `apiVersion`: `"v1"` or `"discovery.k8s.io/v1"`.
    pub fn api_version(self) -> &'static str {
        match self {
            Resource::Services | Resource::Nodes => "v1",
            Resource::EndpointSlices => "discovery.k8s.io/v1",
        }
    }

    /// The URL plural: `"services"`, `"nodes"` or `"endpointslices"`.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Services => "services",
            Resource::Nodes => "nodes",
            Resource::EndpointSlices => "endpointslices",
        }
    }

    /// Whether objects live in a namespace (`false` only for Nodes).
    pub fn namespaced(self) -> bool {
        self != Resource::Nodes
    }

    /// The API group: `""` (core) or `"discovery.k8s.io"`.
    pub(crate) fn group(self) -> &'static str {
        match self {
            Resource::Services | Resource::Nodes => "",
            Resource::EndpointSlices => DISCOVERY_GROUP,
        }
    }

    /// The resource as the apiserver names it in messages: `"services"`, `"nodes"`,
    /// `"endpointslices.discovery.k8s.io"`.
    pub(crate) fn qualified(self) -> &'static str {
        match self {
            Resource::Services => "services",
            Resource::Nodes => "nodes",
            Resource::EndpointSlices => "endpointslices.discovery.k8s.io",
        }
    }

    /// The kind as named in 422 messages: `"Service"`, `"Node"`, `"EndpointSlice.discovery.k8s.io"`.
    pub(crate) fn qualified_kind(self) -> &'static str {
        match self {
            Resource::Services => "Service",
            Resource::Nodes => "Node",
            Resource::EndpointSlices => "EndpointSlice.discovery.k8s.io",
        }
    }

    /// The kind of a list: `"ServiceList"`, `"NodeList"`, `"EndpointSliceList"`.
    pub(crate) fn list_kind(self) -> &'static str {
        match self {
            Resource::Services => "ServiceList",
            Resource::Nodes => "NodeList",
            Resource::EndpointSlices => "EndpointSliceList",
        }
    }

    /// Whether `status` is a subresource: main-resource writes keep it, `/status` writes change only it.
    pub(crate) fn has_status(self) -> bool {
        self != Resource::EndpointSlices
    }

    /// Position in [`Resource::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The resource served at `/{api|apis/group}/v1/.../{plural}` (`group` `""` = core); `None` if none.
    pub(crate) fn lookup(group: &str, plural: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.group() == group && r.plural() == plural)
    }

    /// The resource of a seed object, by its `kind` (absent = `Service`). Errors: a message naming the kind.
    pub(crate) fn of_object(obj: &Value) -> Result<Resource, String> {
        match obj.get("kind").and_then(Value::as_str) {
            None | Some("Service") => Ok(Resource::Services),
            Some("Node") => Ok(Resource::Nodes),
            Some("EndpointSlice") => Ok(Resource::EndpointSlices),
            Some(other) => Err(format!(
                "unsupported kind {other:?}: the fake apiserver stores Service, Node and EndpointSlice objects"
            )),
        }
    }

    /// The namespace part of a key: `ns` for namespaced resources, `""` for Nodes (any `ns` is ignored).
    pub(crate) fn key_ns(self, ns: &str) -> &str {
        if self.namespaced() { ns } else { "" }
    }

    /// The JSON pointer of a `fieldSelector` label (`None` = "field label not supported"):
    /// `metadata.name` and `metadata.namespace` everywhere (a Node's namespace is `""`), plus
    /// `spec.type` and `spec.clusterIP` for Services.
    pub(crate) fn field_pointer(self, field: &str) -> Option<&'static str> {
        match (self, field) {
            (_, "metadata.name") => Some("/metadata/name"),
            (_, "metadata.namespace") => Some("/metadata/namespace"),
            (Resource::Services, "spec.type") => Some("/spec/type"),
            (Resource::Services, "spec.clusterIP") => Some("/spec/clusterIP"),
            _ => None,
        }
    }

    /// What `status` an HTTP create stores: `Some(s)` replaces the body's (a Service starts with
    /// `{"loadBalancer":{}}`); `None` keeps it (a Node may be created with its status, as kubelet does).
    pub(crate) fn create_status(self) -> Option<Value> {
        match self {
            Resource::Services => Some(json!({ "loadBalancer": {} })),
            Resource::Nodes | Resource::EndpointSlices => None,
        }
    }

    /// Make `obj` (a JSON object; panics otherwise) an object of this resource: fill in `kind` and
    /// `apiVersion` if absent, default `metadata.namespace` to `"default"` (namespaced) or remove it
    /// (cluster-scoped), and return the key `(namespace, name)` (`name` `""` if missing or not a string).
    pub(crate) fn normalise(self, obj: &mut Value) -> (String, String) {
        let map = obj.as_object_mut().expect("an API object must be a JSON object");
        map.entry("kind").or_insert_with(|| json!(self.kind()));
        map.entry("apiVersion").or_insert_with(|| json!(self.api_version()));
        let name = meta_str(obj, "name").unwrap_or("").to_string();
        let ns = match meta_str(obj, "namespace") {
            Some(ns) if self.namespaced() => ns.to_string(),
            _ if self.namespaced() => "default".to_string(),
            _ => String::new(),
        };
        self.set_key(obj, &ns, &name);
        (ns, name)
    }

    /// Write the key into `metadata`: `name`, and `namespace` (namespaced) or no namespace at all.
    pub(crate) fn set_key(self, obj: &mut Value, ns: &str, name: &str) {
        let meta = meta_mut(obj);
        meta.insert("name".into(), json!(name));
        if self.namespaced() {
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
    }

    /// Check a request body's (or patched object's) `kind`/`apiVersion`: each may be absent or empty,
    /// otherwise it must be this resource's. Errors: 400 `BadRequest`.
    pub(crate) fn check_type(self, obj: &Value) -> Result<(), ApiError> {
        let field = |f: &str| obj.get(f).and_then(Value::as_str).unwrap_or("");
        let (kind, version) = (field("kind"), field("apiVersion"));
        if (kind.is_empty() || kind == self.kind()) && (version.is_empty() || version == self.api_version()) {
            return Ok(());
        }
        Err(ApiError::bad_request(format!(
            "the API version in the data ({version}) does not match the expected API version ({}), or the kind ({kind}) is not {}",
            self.api_version(),
            self.kind()
        )))
    }

    /// Per-kind validation of an HTTP create (`current: None`) or update. Only EndpointSlices are checked:
    /// `addressType` is required, one of `IPv4`, `IPv6`, `FQDN`, and immutable. Errors: 422 `Invalid`.
    pub(crate) fn validate(self, new: &Value, current: Option<&Value>) -> Result<(), ApiError> {
        if self != Resource::EndpointSlices {
            return Ok(());
        }
        let name = meta_str(new, "name").unwrap_or("");
        let invalid = |cause: &str, detail: String| {
            Err(ApiError::invalid(self.qualified_kind(), name, "addressType", cause, &detail))
        };
        let given = new.get("addressType").and_then(Value::as_str).unwrap_or("");
        match current.map(|c| c.get("addressType").and_then(Value::as_str).unwrap_or("")) {
            Some(old) if old != given => {
                invalid("FieldValueInvalid", format!("Invalid value: {given:?}: field is immutable"))
            }
            _ if given.is_empty() => invalid("FieldValueRequired", "Required value".into()),
            _ if !matches!(given, "IPv4" | "IPv6" | "FQDN") => invalid(
                "FieldValueNotSupported",
                format!("Unsupported value: {given:?}: supported values: \"FQDN\", \"IPv4\", \"IPv6\""),
            ),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_and_kinds() {
        assert_eq!(Resource::lookup("", "nodes"), Some(Resource::Nodes));
        assert_eq!(Resource::lookup(DISCOVERY_GROUP, "endpointslices"), Some(Resource::EndpointSlices));
        assert_eq!(Resource::lookup("", "endpointslices"), None);
        assert_eq!(Resource::of_object(&json!({"metadata": {}})), Ok(Resource::Services));
        assert_eq!(Resource::of_object(&json!({"kind": "Node"})), Ok(Resource::Nodes));
        assert!(Resource::of_object(&json!({"kind": "Pod"})).unwrap_err().contains("\"Pod\""));
        assert!(Resource::ALL.iter().enumerate().all(|(i, r)| r.index() == i));
    }

    #[test]
    fn normalise_by_scope() {
        let mut node = json!({"metadata": {"name": "w1", "namespace": "x"}});
        assert_eq!(Resource::Nodes.normalise(&mut node), (String::new(), "w1".to_string()));
        assert_eq!(node, json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "w1"}}));
        let mut slice = json!({"metadata": {"name": "s"}});
        assert_eq!(Resource::EndpointSlices.normalise(&mut slice), ("default".to_string(), "s".to_string()));
        assert_eq!(slice["apiVersion"], "discovery.k8s.io/v1");
    }

    #[test]
    fn type_and_address_type_checks() {
        let svc = json!({"kind": "Service", "apiVersion": "v1"});
        assert!(Resource::Services.check_type(&svc).is_ok());
        assert_eq!(Resource::EndpointSlices.check_type(&svc).unwrap_err().code, 400);
        assert!(Resource::Nodes.check_type(&json!({"kind": "Node"})).is_ok());
        let es = |t: &str| json!({"metadata": {"name": "s"}, "addressType": t});
        let check = |new: &Value, cur: Option<&Value>| Resource::EndpointSlices.validate(new, cur);
        assert!(check(&es("IPv4"), None).is_ok() && check(&es("IPv4"), Some(&es("IPv4"))).is_ok());
        let err = check(&es("IPv6"), Some(&es("IPv4"))).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(
            err.message.starts_with("EndpointSlice.discovery.k8s.io \"s\" is invalid: addressType:"),
            "{}",
            err.message
        );
        assert_eq!(check(&es(""), None).unwrap_err().code, 422);
        assert_eq!(check(&es("IPv5"), None).unwrap_err().code, 422);
    }
}
