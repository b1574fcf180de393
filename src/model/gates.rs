//! Which endpoints' acknowledgements a write to Kubernetes waits for.

/// The endpoints whose acknowledgements gate a write to Kubernetes (a status, a finalizer's removal,
/// a pool address's release), in appliances: the write waits until every appliance has the change
/// from at least one of its endpoints. An endpoint on its own is an appliance of one; the hosts of a
/// load-balancer pair (`[[webhooks]] appliance`) are one appliance, since the host that lags catches
/// up before it takes the VIPs, and waiting for it would leave new Services `<pending>` while the
/// other host serves them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gates {
    appliances: Vec<Vec<String>>,
}

impl Gates {
    /// Gates of `appliances`, each the names of its endpoints.
    pub fn new(appliances: Vec<Vec<String>>) -> Self {
        Self { appliances }
    }

    /// Whether endpoint `webhook` gates anything.
    pub fn contains(&self, webhook: &str) -> bool {
        self.appliances.iter().flatten().any(|w| w == webhook)
    }

    /// Whether every appliance has the change, given `has(endpoint)`: `Some(true)` when the endpoint
    /// acknowledged it, `Some(false)` when it has not yet, `None` when it got no delivery of it (a
    /// selector left it out). An appliance none of whose endpoints got a delivery has nothing to wait for.
    pub fn done(&self, has: impl Fn(&str) -> Option<bool>) -> bool {
        self.appliances.iter().all(|endpoints| {
            let seen: Vec<bool> = endpoints.iter().filter_map(|w| has(w)).collect();
            seen.is_empty() || seen.contains(&true)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Gates;

    fn gates() -> Gates {
        Gates::new(vec![vec!["f5".into()], vec!["lb1".into(), "lb2".into()]])
    }

    #[test]
    fn one_host_of_a_pair_is_enough_but_every_appliance_is_needed() {
        let has = |acked: &[&str], sent: &[&str]| {
            let (acked, sent) = (acked.to_vec(), sent.to_vec());
            gates().done(move |w| sent.contains(&w).then(|| acked.contains(&w)))
        };
        let all = ["f5", "lb1", "lb2"];
        assert!(has(&["f5", "lb1"], &all));
        assert!(has(&["f5", "lb2"], &all));
        assert!(!has(&["lb1", "lb2"], &all), "the F5 is an appliance of its own");
        assert!(!has(&["f5"], &all), "neither host of the pair has it");
        assert!(has(&["f5"], &["f5"]), "the pair got no delivery: nothing to wait for");
        assert!(!has(&[], &["lb2"]), "the one host that got a delivery has not acknowledged it");
    }

    #[test]
    fn an_endpoint_outside_the_gates_counts_for_nothing() {
        let gates = gates();
        assert!(!gates.contains("declare"));
        assert!(gates.contains("lb2"));
        assert!(Gates::default().done(|_| Some(false)), "no gating endpoint: nothing to wait for");
    }
}
