//! Address pools: parsed ranges (ipnet for CIDR parsing and address iteration), membership, order.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4AddrRange, Ipv6AddrRange};

use crate::config::PoolConfig;
use crate::model::LabelSelector;

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: &IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }

    /// `IPv4` / `IPv6`, as `spec.ipFamilies` spells them.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

/// An inclusive address range of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrRange {
    /// First address.
    pub start: IpAddr,
    /// Last address (inclusive).
    pub end: IpAddr,
}

impl AddrRange {
    /// Parses `a.b.c.d/len`, `start-end` (inclusive, same family) or a single address. Errors: a
    /// message saying what is malformed.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some((a, b)) = s.split_once('-') {
            let start: IpAddr =
                a.trim().parse().map_err(|_| format!("`{}` in `{s}` is not an IP address", a.trim()))?;
            let end: IpAddr = b.trim().parse().map_err(|_| format!("`{}` in `{s}` is not an IP address", b.trim()))?;
            if Family::of(&start) != Family::of(&end) {
                return Err(format!("range `{s}` mixes IPv4 and IPv6"));
            }
            if start > end {
                return Err(format!("range `{s}` ends before it starts"));
            }
            return Ok(Self { start, end });
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Self { start: ip, end: ip });
        }
        let net: IpNet = s.parse().map_err(|_| format!("`{s}` is not a CIDR, a range `a-b` or an IP address"))?;
        if net.trunc() != net {
            return Err(format!("`{s}` has host bits set (did you mean `{}`?)", net.trunc()));
        }
        Ok(Self { start: net.network(), end: net.broadcast() })
    }

    /// The family of both ends.
    pub fn family(&self) -> Family {
        Family::of(&self.start)
    }

    /// Whether `ip` lies in the range.
    pub fn contains(&self, ip: &IpAddr) -> bool {
        *ip >= self.start && *ip <= self.end
    }

    /// Whether the two ranges share an address.
    pub fn overlaps(&self, other: &AddrRange) -> bool {
        self.family() == other.family() && self.start <= other.end && other.start <= self.end
    }

    /// Number of addresses (saturating at `u128::MAX`).
    pub fn size(&self) -> u128 {
        match (self.start, self.end) {
            (IpAddr::V4(a), IpAddr::V4(b)) => u128::from(u32::from(b) - u32::from(a)) + 1,
            (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(b) - u128::from(a)).saturating_add(1),
            _ => 0,
        }
    }

    /// The addresses from `from` (clamped to the range) to the end, in ascending order, lazily.
    pub fn iter_from(&self, from: IpAddr) -> Box<dyn Iterator<Item = IpAddr> + '_> {
        let from = from.max(self.start);
        match (from, self.end) {
            (IpAddr::V4(a), IpAddr::V4(b)) => Box::new(Ipv4AddrRange::new(a, b).map(IpAddr::V4)),
            (IpAddr::V6(a), IpAddr::V6(b)) => Box::new(Ipv6AddrRange::new(a, b).map(IpAddr::V6)),
            _ => Box::new(std::iter::empty()),
        }
    }
}

/// A pool config entry that cannot be used: `pool` names it, `reason` says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address pool `{pool}`: {reason}")]
pub struct PoolError {
    /// The pool's name (or its position, `#2`, when it has none).
    pub pool: String,
    /// What is wrong.
    pub reason: String,
}

/// One validated pool.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Unique name.
    pub name: String,
    /// Ranges sorted ascending (IPv4 before IPv6), never overlapping.
    pub ranges: Vec<AddrRange>,
    /// See [`PoolConfig::auto_assign`].
    pub auto_assign: bool,
    /// See [`PoolConfig::namespaces`].
    pub namespaces: Vec<String>,
    selector: LabelSelector,
    /// See [`PoolConfig::avoid_buggy_ips`].
    pub avoid_buggy_ips: bool,
}

impl Pool {
    /// Parses one entry (ranges, selector). Errors: [`PoolError`] for an empty name or address list, a
    /// malformed range, ranges overlapping each other, or a bad selector.
    pub fn new(cfg: &PoolConfig, position: usize) -> Result<Self, PoolError> {
        let name = if cfg.name.trim().is_empty() { format!("#{position}") } else { cfg.name.clone() };
        let err = |reason: String| PoolError { pool: name.clone(), reason };
        if cfg.name.trim().is_empty() {
            return Err(err("`name` must not be empty".into()));
        }
        if !cfg.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_')) {
            return Err(err("`name` may hold only letters, digits, `-` and `_`".into()));
        }
        if let Some(ns) = cfg.namespaces.iter().find(|n| !crate::config::is_dns1123_label(n)) {
            return Err(err(format!("`{ns}` in `namespaces` is not a valid namespace name (DNS-1123 label)")));
        }
        if cfg.addresses.is_empty() {
            return Err(err("`addresses` is empty: a pool needs at least one CIDR, range or address".into()));
        }
        let mut ranges =
            cfg.addresses.iter().map(|s| AddrRange::parse(s)).collect::<Result<Vec<_>, _>>().map_err(err)?;
        ranges.sort_by_key(|r| r.start);
        if let Some(w) = ranges.windows(2).find(|w| w[0].overlaps(&w[1])) {
            return Err(err(format!("ranges {}-{} and {}-{} overlap", w[0].start, w[0].end, w[1].start, w[1].end)));
        }
        let selector =
            LabelSelector::parse(&cfg.service_selector).map_err(|e| err(format!("service_selector: {e}")))?;
        let pool = Self {
            name: cfg.name.clone(),
            ranges,
            auto_assign: cfg.auto_assign,
            namespaces: cfg.namespaces.clone(),
            selector,
            avoid_buggy_ips: cfg.avoid_buggy_ips,
        };
        if pool.size() == 0 {
            return Err(err("every address is excluded by `avoid_buggy_ips`".into()));
        }
        Ok(pool)
    }

    /// Whether `ip` is one of the pool's usable addresses (in a range, and not a `.0`/`.255` when
    /// `avoid_buggy_ips` is set).
    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip)) && self.usable(ip)
    }

    /// Whether a Service in `namespace` with `labels` may use the pool.
    pub fn accepts(&self, namespace: &str, labels: &vipwatch_contract::StringMap) -> bool {
        self.allows_namespace(namespace) && self.selector.matches_pairs(labels)
    }

    /// Whether `namespaces` is empty or lists `namespace`.
    pub fn allows_namespace(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// Whether the pool has addresses of `family`.
    pub fn has(&self, family: Family) -> bool {
        self.ranges.iter().any(|r| r.family() == family)
    }

    /// Usable addresses of `family` from `from` upwards, ascending.
    pub fn addresses_from(&self, family: Family, from: IpAddr) -> impl Iterator<Item = IpAddr> + '_ {
        self.ranges
            .iter()
            .filter(move |r| r.family() == family && r.end >= from)
            .flat_map(move |r| r.iter_from(from))
            .filter(|ip| self.usable(ip))
    }

    /// The lowest address of `family` (whether usable or not), the start of a scan.
    pub fn first(&self, family: Family) -> Option<IpAddr> {
        self.ranges.iter().find(|r| r.family() == family).map(|r| r.start)
    }

    /// Number of usable addresses (saturating).
    pub fn size(&self) -> u128 {
        let total = self.ranges.iter().fold(0u128, |n, r| n.saturating_add(r.size()));
        if !self.avoid_buggy_ips {
            return total;
        }
        // Only IPv4 ranges can hold buggy addresses; count them exactly (IPv4 ranges are small).
        let buggy = self
            .ranges
            .iter()
            .filter(|r| r.family() == Family::V4)
            .flat_map(|r| r.iter_from(r.start))
            .filter(|ip| !self.usable(ip))
            .count();
        total - buggy as u128
    }

    fn usable(&self, ip: &IpAddr) -> bool {
        !(self.avoid_buggy_ips && matches!(ip, IpAddr::V4(v4) if is_buggy(v4)))
    }
}

fn is_buggy(ip: &Ipv4Addr) -> bool {
    matches!(ip.octets()[3], 0 | 255)
}

/// Every configured pool, validated together: names unique, no address in two pools.
#[derive(Debug, Clone, Default)]
pub struct Pools(pub Vec<Pool>);

impl Pools {
    /// Parses and cross-checks `[[pools]]`. Errors: [`PoolError`] naming the pool and the reason
    /// (duplicate name, overlap with another pool, or anything [`Pool::new`] rejects).
    pub fn new(configs: &[PoolConfig]) -> Result<Self, PoolError> {
        let mut pools: Vec<Pool> = Vec::new();
        for (i, cfg) in configs.iter().enumerate() {
            let pool = Pool::new(cfg, i + 1)?;
            let err = |reason: String| PoolError { pool: pool.name.clone(), reason };
            if pools.iter().any(|p| p.name == pool.name) {
                return Err(err("the name is used by another pool".into()));
            }
            for other in &pools {
                if let Some((a, b)) = overlap(&pool, other) {
                    return Err(err(format!(
                        "{}-{} overlaps {}-{} of pool `{}`",
                        a.start, a.end, b.start, b.end, other.name
                    )));
                }
            }
            pools.push(pool);
        }
        Ok(Self(pools))
    }
}

fn overlap<'a>(a: &'a Pool, b: &'a Pool) -> Option<(&'a AddrRange, &'a AddrRange)> {
    a.ranges.iter().flat_map(|x| b.ranges.iter().map(move |y| (x, y))).find(|(x, y)| x.overlaps(y))
}

/// The unspecified address of a family, below every other (scan start when a pool has no hint).
pub fn lowest(family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(name: &str, addresses: &[&str]) -> PoolConfig {
        PoolConfig {
            name: name.into(),
            addresses: addresses.iter().map(|s| s.to_string()).collect(),
            auto_assign: true,
            namespaces: vec![],
            service_selector: String::new(),
            avoid_buggy_ips: false,
        }
    }

    fn reason(configs: &[PoolConfig]) -> String {
        Pools::new(configs).unwrap_err().to_string()
    }

    #[test]
    fn parses_cidrs_ranges_and_addresses() {
        let p = Pool::new(
            &cfg("lab", &["2001:db8::/120", "198.51.100.10-198.51.100.20", "192.0.2.0/24", "203.0.113.9"]),
            1,
        )
        .unwrap();
        assert_eq!(p.size(), 256 + 11 + 256 + 1);
        assert_eq!(p.first(Family::V4), Some("192.0.2.0".parse().unwrap()));
        assert!(p.contains(&"198.51.100.20".parse().unwrap()));
        assert!(!p.contains(&"198.51.100.21".parse().unwrap()));
    }

    #[test]
    fn rejects_bad_pools_naming_pool_and_reason() {
        assert_eq!(
            reason(&[cfg("a", &["192.0.2.0/24"]), cfg("b", &["192.0.2.128-192.0.2.130"])]),
            "invalid address pool `b`: 192.0.2.128-192.0.2.130 overlaps 192.0.2.0-192.0.2.255 of pool `a`"
        );
        assert_eq!(
            reason(&[cfg("a", &["192.0.2.10-192.0.2.1"])]),
            "invalid address pool `a`: range `192.0.2.10-192.0.2.1` ends before it starts"
        );
        assert_eq!(
            reason(&[cfg("a", &["192.0.2.0/33"])]),
            "invalid address pool `a`: `192.0.2.0/33` is not a CIDR, a range `a-b` or an IP address"
        );
        assert_eq!(
            reason(&[cfg("a", &[])]),
            "invalid address pool `a`: `addresses` is empty: a pool needs at least one CIDR, range or address"
        );
        assert_eq!(
            reason(&[cfg("a", &["192.0.2.1/24"])]),
            "invalid address pool `a`: `192.0.2.1/24` has host bits set (did you mean `192.0.2.0/24`?)"
        );
        assert_eq!(
            reason(&[cfg("a", &["10.0.0.0/30", "10.0.0.2"])]),
            "invalid address pool `a`: ranges 10.0.0.0-10.0.0.3 and 10.0.0.2-10.0.0.2 overlap"
        );
        assert_eq!(
            reason(&[cfg("a", &["10.0.0.1"]), cfg("a", &["10.0.0.2"])]),
            "invalid address pool `a`: the name is used by another pool"
        );
    }

    #[test]
    fn avoid_buggy_ips_skips_dot_zero_and_dot_255() {
        let mut c = cfg("a", &["192.0.2.0/24"]);
        c.avoid_buggy_ips = true;
        let p = Pool::new(&c, 1).unwrap();
        assert_eq!(p.size(), 254);
        let first: Vec<IpAddr> = p.addresses_from(Family::V4, lowest(Family::V4)).take(1).collect();
        assert_eq!(first, vec!["192.0.2.1".parse::<IpAddr>().unwrap()]);
        assert!(!p.contains(&"192.0.2.255".parse().unwrap()));
    }
}
