//! The name of the cluster a vipwatch serves, when `cluster.name` does not give it: derived from
//! the cluster (the uid of its `kube-system` namespace, unique per cluster and as old as it), else
//! from vipwatch's event log. Both are DNS-1123 labels.

/// How many hex digits of an id a derived name keeps: 48 bits, so two clusters sharing one appliance
/// collide with a chance of about one in 10^14.
const DIGITS: usize = 12;

/// `k8s-` and the first 12 hex digits of the `kube-system` namespace's uid (dashes dropped).
pub fn from_namespace_uid(uid: &str) -> String {
    format!("k8s-{}", hex_prefix(uid))
}

/// `vipwatch-` and the first 12 hex digits of the event log's id: the fallback when the cluster
/// cannot be asked (stable for as long as the database is).
pub fn from_log_id(log_id: &str) -> String {
    format!("vipwatch-{}", hex_prefix(log_id))
}

fn hex_prefix(id: &str) -> String {
    id.chars().filter(char::is_ascii_hexdigit).map(|c| c.to_ascii_lowercase()).take(DIGITS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_are_dns_labels_from_the_id() {
        assert_eq!(from_namespace_uid("3F2A9C1E-77d4-4b3e-9a0c-5d6e7f809a1b"), "k8s-3f2a9c1e77d4");
        assert_eq!(from_log_id("0b7c2d4e-1f3a-4c5b-8d9e-aabbccddeeff"), "vipwatch-0b7c2d4e1f3a");
        assert!(crate::config::is_dns1123_label(&from_namespace_uid("ffffffff-ffff-ffff-ffff-ffffffffffff")));
    }
}
