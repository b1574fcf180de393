//! What the members are computed from: the Node projections and, per Service, its EndpointSlices
//! (joined on the label `kubernetes.io/service-name`, cached by slice name: endpoints move between
//! slices, so a slice going away never by itself means its addresses are gone).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::node::NodeView;
use super::slice::{ObservedSlice, SliceView};
use crate::model::ServiceKey;

/// The Nodes and the EndpointSlices of every Service, as last observed.
#[derive(Debug, Default)]
pub struct BackendIndex {
    nodes: BTreeMap<String, NodeView>,
    slices: HashMap<ServiceKey, BTreeMap<String, SliceView>>,
    /// The Service each stored slice `(namespace, name)` belongs to.
    owners: HashMap<(String, String), ServiceKey>,
}

impl BackendIndex {
    /// Every Node by name.
    pub fn nodes(&self) -> &BTreeMap<String, NodeView> {
        &self.nodes
    }

    /// The slices of `key`, by slice name.
    pub fn slices(&self, key: &ServiceKey) -> impl Iterator<Item = &SliceView> {
        self.slices.get(key).into_iter().flat_map(|m| m.values())
    }

    /// Stores a Node; returns whether its projection changed (a new Node counts).
    pub fn set_node(&mut self, name: &str, view: NodeView) -> bool {
        match self.nodes.get(name) {
            Some(old) if *old == view => false,
            _ => {
                self.nodes.insert(name.to_owned(), view);
                true
            }
        }
    }

    /// Forgets a Node; returns whether it was known.
    pub fn remove_node(&mut self, name: &str) -> bool {
        self.nodes.remove(name).is_some()
    }

    /// Stores a slice (or forgets it, when it is FQDN or belongs to no Service); returns the Services
    /// whose slices changed: its owner, and its previous owner if the label moved.
    pub fn set_slice(&mut self, obs: ObservedSlice) -> Vec<ServiceKey> {
        let id = (obs.namespace, obs.name);
        let mut touched = Vec::new();
        let previous = self.owners.get(&id).cloned();
        if let Some(old) = previous.as_ref().filter(|o| Some(*o) != obs.service.as_ref()) {
            self.detach(old, &id.1);
            self.owners.remove(&id);
            touched.push(old.clone());
        }
        match (obs.service, obs.view) {
            (Some(service), Some(view)) => {
                let slices = self.slices.entry(service.clone()).or_default();
                if slices.get(&id.1) != Some(&view) {
                    slices.insert(id.1.clone(), view);
                    touched.push(service.clone());
                }
                self.owners.insert(id, service);
            }
            (Some(service), None) => {
                if self.detach(&service, &id.1) {
                    touched.push(service);
                }
                self.owners.remove(&id);
            }
            (None, _) => {}
        }
        touched.dedup();
        touched
    }

    /// Forgets the slice `namespace/name`; returns the Service it belonged to.
    pub fn remove_slice(&mut self, namespace: &str, name: &str) -> Option<ServiceKey> {
        let owner = self.owners.remove(&(namespace.to_owned(), name.to_owned()))?;
        self.detach(&owner, name);
        Some(owner)
    }

    /// Replaces every slice of `namespace` (all namespaces when `None`) with `listed`; returns the
    /// Services whose slices changed.
    pub fn replace_slices(&mut self, namespace: Option<&str>, listed: Vec<ObservedSlice>) -> BTreeSet<ServiceKey> {
        let keep: BTreeSet<(String, String)> = listed.iter().map(|s| (s.namespace.clone(), s.name.clone())).collect();
        let gone: Vec<(String, String)> = self
            .owners
            .keys()
            .filter(|(ns, _)| namespace.is_none_or(|want| want == ns))
            .filter(|id| !keep.contains(*id))
            .cloned()
            .collect();
        let mut touched: BTreeSet<ServiceKey> = gone.iter().filter_map(|(ns, n)| self.remove_slice(ns, n)).collect();
        for slice in listed {
            touched.extend(self.set_slice(slice));
        }
        touched
    }

    /// Replaces every Node with `listed`; returns whether anything changed.
    pub fn replace_nodes(&mut self, listed: Vec<(String, NodeView)>) -> bool {
        let keep: BTreeSet<&String> = listed.iter().map(|(n, _)| n).collect();
        let before = self.nodes.len();
        self.nodes.retain(|n, _| keep.contains(n));
        let mut changed = self.nodes.len() != before;
        for (name, view) in listed {
            changed |= self.set_node(&name, view);
        }
        changed
    }

    /// How many endpoints the stored slices hold (for metrics and benchmarks).
    pub fn endpoint_count(&self) -> usize {
        self.slices.values().flat_map(|m| m.values()).map(|s| s.endpoints.len()).sum()
    }

    fn detach(&mut self, service: &ServiceKey, slice: &str) -> bool {
        let Some(slices) = self.slices.get_mut(service) else { return false };
        let removed = slices.remove(slice).is_some();
        if slices.is_empty() {
            self.slices.remove(service);
        }
        removed
    }
}
