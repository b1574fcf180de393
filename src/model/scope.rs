//! Which Services are vipwatch's to announce: the `service_types`, `load_balancer_class` and
//! `manage_classless` keys of the `[kubernetes]` config table.

use super::ServiceView;

/// The in-scope rule, built from the `[kubernetes]` config table. Namespaces and the label selector
/// are applied server-side by the watch and are not repeated here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// Accepted `spec.type` values; `["*"]` accepts every type.
    pub service_types: Vec<String>,
    /// The `spec.loadBalancerClass` that marks a Service as ours.
    pub load_balancer_class: String,
    /// Whether a `LoadBalancer` Service with no class is ours too.
    pub manage_classless: bool,
}

impl Scope {
    /// True when vipwatch owns this Service: its type is accepted and, for type `LoadBalancer`, its class
    /// is ours (or absent and `manage_classless` is set), and it is not being deleted (a
    /// `deletionTimestamp` ends its life for the appliance at once: one DELETED, even though the object
    /// stays until its finalizers are gone). A class set to another controller's value
    /// (e.g. `service.k8s.aws/nlb`) is never ours, per the Kubernetes `loadBalancerClass` contract
    /// ("the default load balancer implementation ... must ignore Services that set this field").
    pub fn contains(&self, view: &ServiceView) -> bool {
        let type_ok = self.service_types.iter().any(|t| t == "*" || *t == view.service_type);
        let class_ok = match &view.load_balancer_class {
            Some(class) => *class == self.load_balancer_class,
            None => self.manage_classless || view.service_type != "LoadBalancer",
        };
        type_ok && class_ok && !view.deleting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ty: &str, class: Option<&str>) -> ServiceView {
        let json = serde_json::json!({"metadata": {"name": "a"},
            "spec": {"type": ty, "loadBalancerClass": class}});
        ServiceView::from_service(&serde_json::from_value(json).unwrap())
    }

    fn scope(types: &[&str], classless: bool) -> Scope {
        Scope {
            service_types: types.iter().map(|s| s.to_string()).collect(),
            load_balancer_class: "vipwatch.io/lb".into(),
            manage_classless: classless,
        }
    }

    #[test]
    fn class_and_type_decide_ownership() {
        let lb = scope(&["LoadBalancer"], true);
        assert!(lb.contains(&svc("LoadBalancer", None)));
        assert!(lb.contains(&svc("LoadBalancer", Some("vipwatch.io/lb"))));
        assert!(!lb.contains(&svc("LoadBalancer", Some("service.k8s.aws/nlb"))));
        assert!(!lb.contains(&svc("ClusterIP", None)));
        assert!(!scope(&["LoadBalancer"], false).contains(&svc("LoadBalancer", None)));
        assert!(scope(&["*"], false).contains(&svc("NodePort", None)));
    }
}
