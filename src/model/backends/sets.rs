//! A Service's members in every mode some endpoint uses ([`BackendSets`]), their revisions, and the
//! diff between two revisions.

use std::collections::BTreeMap;

use vipwatch_contract::{BackendMode, Backends, BackendsDiff, CompactString, MemberChange, MemberState};

use super::index::BackendIndex;
use super::members::{MemberRules, compute};
use crate::model::{ServiceKey, ServiceView};

/// A Service's members per mode, a vector sorted by mode ([`litemap::LiteMap`]). Serialized as an
/// object keyed by mode (`{"nodePort": {...}}`); where it may be empty, with
/// [`vipwatch_contract::object`].
///
/// The members are boxed and the map is a vector: a B-tree node has room for 11 entries whatever the
/// map holds, so a B-tree map (boxed or not) takes room for 11 modes per Service where a Service has
/// one or two; a vector holds just its (mode, box) pairs (see docs/explanation/design-decisions.md,
/// "Views without spare room").
pub type BackendSets = litemap::LiteMap<BackendMode, Box<Backends>>;

/// The members of `sets` in `mode`, if it has that mode (`None`: no mode, nothing).
pub fn in_mode(sets: &BackendSets, mode: Option<BackendMode>) -> Option<&Backends> {
    sets.get(&mode?).map(Box::as_ref)
}

/// The members of `key` in each of `modes`, numbered against `current`: a mode keeps its revision
/// while its hash is unchanged; a changed or new one gets the Service's next revision, one above the
/// highest of `current` (revisions grow across modes, so an endpoint whose mode switches never sees
/// its revision go back; it may skip numbers another mode took — `backendsDiff.fromRevision` tells a
/// receiver whether it holds the revision a diff starts from).
pub fn compute_sets(
    key: &ServiceKey,
    view: &ServiceView,
    modes: &[BackendMode],
    rules: &MemberRules,
    index: &BackendIndex,
    current: &BackendSets,
) -> BackendSets {
    let next = current.values().map(|c| c.revision).max().unwrap_or(0) + 1;
    let sets = modes.iter().map(|&mode| {
        let mut b = compute(key, view, mode, rules, index);
        b.revision = match current.get(&mode) {
            Some(c) if c.hash == b.hash => c.revision,
            _ => next,
        };
        (mode, Box::new(b))
    });
    exact(sets.collect())
}

/// `sets` in an allocation of exactly its entries (none when empty). The mirror keeps one per
/// Service, and a map collected or read from JSON reserves room for 4 modes where Services have one
/// or two (64 bytes where 16 do).
pub fn shrink(sets: BackendSets) -> BackendSets {
    exact(sets.into_tuple_vec())
}

/// A [`BackendSets`] of `entries` in any order (the last of a repeated mode wins, as an insert's
/// would), in a vector of exactly their number.
fn exact(mut entries: Vec<(BackendMode, Box<Backends>)>) -> BackendSets {
    // Stable: of equal modes the last stays last, and dedup keeps the first of a run, so reverse first.
    entries.reverse();
    entries.sort_by_key(|(mode, _)| *mode);
    entries.dedup_by_key(|(mode, _)| *mode);
    entries.shrink_to_fit();
    litemap::LiteMap::from_sorted_store_unchecked(entries)
}

/// Per mode whose members differ between `old` and `new` (a changed hash, or a mode new in `new`),
/// what changed. Empty when nothing did, except that a mode only in `old` makes [`changed`] true.
pub fn diffs(old: &BackendSets, new: &BackendSets) -> BTreeMap<BackendMode, BackendsDiff> {
    new.iter()
        .filter(|(mode, b)| old.get(mode).is_none_or(|o| o.hash != b.hash))
        .map(|(mode, b)| (*mode, diff(in_mode(old, Some(*mode)), b)))
        .collect()
}

/// Whether the members of any mode changed, appeared or went away.
pub fn changed(old: &BackendSets, new: &BackendSets) -> bool {
    old.keys().ne(new.keys()) || old.iter().any(|(mode, b)| new.get(mode).is_none_or(|n| n.hash != b.hash))
}

/// What changed from `old` (none: everything is added) to `new`.
pub fn diff(old: Option<&Backends>, new: &Backends) -> BackendsDiff {
    let before = keyed(old);
    let after = keyed(Some(new));
    let change = |(k, (state, _)): (&Key, &(MemberState, Extra))| MemberChange {
        service_port: k.0,
        protocol: k.1.clone(),
        address: k.2.clone(),
        port: k.3,
        state: *state,
    };
    BackendsDiff {
        from_revision: old.map_or(0, |o| o.revision),
        to_revision: new.revision,
        added: after.iter().filter(|(k, _)| !before.contains_key(*k)).map(change).collect(),
        removed: before.iter().filter(|(k, _)| !after.contains_key(*k)).map(change).collect(),
        changed: after.iter().filter(|(k, v)| before.get(*k).is_some_and(|b| b != *v)).map(change).collect(),
    }
}

/// `(service port, protocol, address, member port)`.
type Key = (i32, CompactString, CompactString, i32);
/// `(node, zone)`.
type Extra = (Option<CompactString>, Option<CompactString>);

fn keyed(b: Option<&Backends>) -> BTreeMap<Key, (MemberState, Extra)> {
    b.into_iter()
        .flat_map(|b| b.members())
        .map(|(p, m)| {
            let key = (p.port, p.protocol.clone(), m.address.clone(), m.port);
            (key, (m.state, (m.node_name.clone(), m.zone.clone())))
        })
        .collect()
}
