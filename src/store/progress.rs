//! Watch bookkeeping: per scope, the last resourceVersion, the last full list and the relist count.

use super::script::{Script, Stmt};
use super::{Store, StoreError};

/// Progress of one watch scope to record with a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchProgress {
    /// `*` for the cluster-wide watch, else the namespace.
    pub scope: String,
    /// Last resourceVersion seen on that scope, if any.
    pub resource_version: Option<String>,
    /// Set when this batch completes a full list; `Some(true)` when it was a re-list (not the first
    /// list since the process started), which increments `relist_count`.
    pub listed: Option<bool>,
}

impl WatchProgress {
    /// Folds `later`, the same scope's progress planned after this one, into this one (the writer
    /// merges plans that arrive within one group commit): its resourceVersion when it saw one, else
    /// ours; a completed list when either completed one, a re-list when either was one. Taking
    /// `later` whole would forget a re-list followed by a watch event in the same commit
    /// (`relist_count` and `last_list_at` not updated), or a resourceVersion followed by a re-list.
    /// Two re-lists in one commit count once (a list takes longer than a commit interval).
    pub fn absorb(&mut self, later: WatchProgress) {
        if later.resource_version.is_some() {
            self.resource_version = later.resource_version;
        }
        self.listed = match (self.listed, later.listed) {
            (Some(a), Some(b)) => Some(a || b),
            (a, b) => b.or(a),
        };
    }
}

/// One stored `watch_progress` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressRow {
    /// `*` or a namespace.
    pub scope: String,
    /// Last resourceVersion seen.
    pub resource_version: Option<String>,
    /// When the last full list was stored (Unix ms).
    pub last_list_at: Option<i64>,
    /// Number of re-lists (full lists after the first of a process start), over the database's life.
    pub relist_count: i64,
}

pub(super) async fn write_progress(s: &mut Script<'_>, now: i64, p: &WatchProgress) -> Result<(), StoreError> {
    let listed_at = p.listed.map(|_| now);
    let relist = i64::from(p.listed == Some(true));
    let sql = "INSERT INTO watch_progress (scope, resource_version, last_list_at, relist_count, updated_at) \
               VALUES ($1, $2, $3, $4, $5) ON CONFLICT (scope) DO UPDATE SET \
               resource_version = COALESCE(excluded.resource_version, watch_progress.resource_version), \
               last_list_at = COALESCE(excluded.last_list_at, watch_progress.last_list_at), \
               relist_count = watch_progress.relist_count + excluded.relist_count, updated_at = excluded.updated_at";
    s.run(Stmt::new(sql).bind(&p.scope).bind(&p.resource_version).bind(listed_at).bind(relist).bind(now)).await
}

impl Store {
    /// Whether some leader has stored its first full lists in this database: a scope's
    /// `last_list_at` is set. The recorder writes the progress of every first list in the last
    /// transaction of the batch that stores them all, so one is set only once all are. Followers
    /// are ready from then on (`/readyz`): what they serve is a complete picture, if perhaps an old
    /// one. Errors: [`StoreError`] from the read.
    pub async fn lists_stored(&self) -> Result<bool, StoreError> {
        let sql = "SELECT EXISTS (SELECT 1 FROM watch_progress WHERE last_list_at IS NOT NULL)";
        Ok(self.read_one(self.backend.query(sql)).await?.get::<bool, _>(0))
    }

    /// Every `watch_progress` row ordered by scope.
    pub async fn watch_progress(&self) -> Result<Vec<ProgressRow>, StoreError> {
        let sql = "SELECT scope, resource_version, last_list_at, relist_count FROM watch_progress ORDER BY scope";
        let rows = self.read_all(self.backend.query(sql)).await?;
        Ok(rows
            .iter()
            .map(|r| ProgressRow {
                scope: r.get("scope"),
                resource_version: r.get("resource_version"),
                last_list_at: r.get("last_list_at"),
                relist_count: r.get("relist_count"),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::WatchProgress;

    fn progress(rv: Option<&str>, listed: Option<bool>) -> WatchProgress {
        WatchProgress { scope: "*".into(), resource_version: rv.map(str::to_owned), listed }
    }

    /// A re-list and a later watch event in one commit keep both: the re-list and the newer
    /// resourceVersion; a resourceVersion is not lost to a later list that carries none.
    #[test]
    fn absorbing_later_progress_keeps_what_each_saw() {
        let mut p = progress(None, Some(true));
        p.absorb(progress(Some("120"), None));
        assert_eq!(p, progress(Some("120"), Some(true)));

        let mut p = progress(Some("120"), None);
        p.absorb(progress(None, Some(true)));
        assert_eq!(p, progress(Some("120"), Some(true)));

        let mut p = progress(Some("120"), Some(false));
        p.absorb(progress(Some("130"), Some(true)));
        assert_eq!(p, progress(Some("130"), Some(true)));
    }
}
