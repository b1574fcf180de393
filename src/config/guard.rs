//! `[guard]`: the mass-deletion guard (docs/explanation/recording.md). One list that would delete more
//! than `max_share` of the known in-scope Services, and more than `min_deletions` of them, holds those
//! deletions instead of recording them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[guard]` table.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    /// Hold bulk disappearances (the mass-deletion guard); `false` records every deletion at once.
    pub enabled: bool,
    /// One list may delete at most this share of the tracked, not yet held Services it covers; more is held
    /// (`deletions > max_share × tracked`). Above 0, at most 1.
    pub max_share: f64,
    /// A list may always delete this many: held only when `deletions > min_deletions` (small namespaces churn).
    pub min_deletions: usize,
    /// Held deletions are recorded by themselves once a list at least this long after they were held still misses
    /// them. At least `1s`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub confirm_after: Duration,
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self { enabled: true, max_share: 0.5, min_deletions: 5, confirm_after: Duration::from_secs(600) }
    }
}

impl GuardConfig {
    /// Whether a list deleting `deletions` of `known` in-scope Services trips the guard.
    pub fn trips(&self, deletions: usize, known: usize) -> bool {
        self.enabled && deletions > self.min_deletions && deletions as f64 > self.max_share * known as f64
    }

    /// Checks the values. Errors: [`ConfigError::Value`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.max_share > 0.0 && self.max_share <= 1.0) {
            let reason = format!("{} is not a share above 0 and at most 1 (e.g. 0.5)", self.max_share);
            return Err(ConfigError::Value { key: "guard.max_share", reason });
        }
        if self.confirm_after < Duration::from_secs(1) {
            return Err(ConfigError::Value { key: "guard.confirm_after", reason: "must be at least 1s".into() });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_trips_above_both_the_share_and_the_minimum() {
        let g = GuardConfig::default();
        assert!(g.trips(45, 50));
        assert!(g.trips(6, 11));
        assert!(!g.trips(6, 12), "exactly half is not more than half");
        assert!(!g.trips(5, 5), "5 deletions are always allowed");
        assert!(!g.trips(6, 50));
        assert!(!GuardConfig { enabled: false, ..g.clone() }.trips(50, 50));
        assert!(GuardConfig { max_share: 1.0, ..g }.trips(50, 49));
    }

    #[test]
    fn bad_values_name_their_key() {
        for share in [0.0, -0.1, 1.5, f64::NAN] {
            let e = GuardConfig { max_share: share, ..GuardConfig::default() }.validate().unwrap_err();
            assert!(e.to_string().starts_with("invalid value for `guard.max_share`"), "{e}");
        }
        let e = GuardConfig { confirm_after: Duration::from_millis(10), ..GuardConfig::default() }.validate();
        assert!(e.unwrap_err().to_string().contains("guard.confirm_after"));
    }
}
