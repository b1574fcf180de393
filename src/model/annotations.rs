//! The annotations vipwatch reads on a Service, in one place: the code reads them through these
//! constants, and the annotations reference (docs/reference/annotations.md) is generated from
//! [`ANNOTATIONS`].

use super::REQUESTED_IP_ANNOTATIONS;
use super::backends::MODE_ANNOTATION;

/// The annotation naming the pool to allocate from (`[[pools]] name`); the pool need not be
/// `auto_assign`.
pub const POOL_ANNOTATION: &str = "vipwatch.io/address-pool";

/// The annotation carrying a sharing key: Services with the same key and no port and protocol in
/// common may share one address.
pub const SHARED_IP_ANNOTATION: &str = "vipwatch.io/allow-shared-ip";

/// One annotation vipwatch reads, for the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Annotation {
    /// Its key.
    pub key: &'static str,
    /// Other keys read for the same purpose, in precedence order after `key` (other controllers'
    /// spellings, so migrated Services keep their addresses).
    pub also: &'static [&'static str],
    /// What its value is, e.g. "a pool name".
    pub value: &'static str,
    /// What it does.
    pub meaning: &'static str,
}

/// Every annotation vipwatch reads on a Service.
pub const ANNOTATIONS: &[Annotation] = &[
    Annotation {
        key: REQUESTED_IP_ANNOTATIONS[0],
        also: REQUESTED_IP_ANNOTATIONS.split_at(1).1,
        value: "comma-separated IP addresses: at most one IPv4 and one IPv6",
        meaning: "The VIPs the Service asks for; the first of these keys present wins. They must lie in a pool \
                  that accepts the Service and be free (or shared under the same sharing key). Without any of \
                  them the deprecated `spec.loadBalancerIP` is honoured. An impossible request leaves the Service \
                  without a VIP, with a `Warning AllocationFailed` Event saying why.",
    },
    Annotation {
        key: POOL_ANNOTATION,
        also: &[],
        value: "a `[[pools]]` name",
        meaning: "Allocate from this pool (it need not be `auto_assign`, but must accept the Service's \
                  namespace and labels). An unknown pool leaves the Service without a VIP.",
    },
    Annotation {
        key: SHARED_IP_ANNOTATION,
        also: &[],
        value: "a sharing key (any string)",
        meaning: "Services with the same key and no port and protocol in common may share one address (e.g. \
                  DNS over TCP and UDP on one VIP).",
    },
    Annotation {
        key: MODE_ANNOTATION,
        also: &[],
        value: "`nodePort`, `pod` or `none`",
        meaning: "This Service's backend mode for every endpoint, over the endpoint's `backend_mode` and \
                  `[backends] mode`. Another value is ignored, with a `Warning InvalidBackendMode` Event.",
    },
];
