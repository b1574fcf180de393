//! The statements of one write transaction, sent to SQLite together.
//!
//! sqlx runs each SQLite connection on a thread of its own, and every statement is a round trip to
//! it: the task hands the statement over, the connection's thread wakes, runs it and hands the result
//! back, and the task's worker wakes again. That round trip costs several times the CPU of a small
//! insert itself, and a watch commit runs several statements, so the round trips would be a large
//! share of vipwatch's CPU (see docs/explanation/design-decisions.md).
//!
//! A [`Script`] therefore collects a transaction's small statements on SQLite and sends them as one
//! query when it is [`flush`](Script::flush)ed (sqlx binds a multi-statement query's anonymous `?`
//! parameters in order across its statements). A statement with more than [`JOINED_VALUES`]
//! parameters (a chunk of 8 rows or more) is sent on its own, so a script's text stays small and the
//! texts that recur stay in the connection's statement cache; a batch that large spends its time in
//! SQLite, not in the round trip. On PostgreSQL, whose extended protocol takes one statement per
//! query, each statement runs when it is added.

use std::sync::Arc;

use super::StoreError;
use super::db::{Backend, PerBackend, Query, Row, Tx, values_sql};

/// Most parameters of a statement that joins a script; one with more runs on its own. 32 lets the
/// small pieces of a commit in (up to two event rows: 26; [`super::db::row_chunks`] cuts the rest of a
/// batch into pieces of 8, 32 and 128 rows, which run alone). Each distinct script text is a prepared
/// statement the write connection keeps; with 128 (8-row pieces joined too) there are more texts, so
/// peak RSS is higher, for no CPU saved at a steady rate.
pub(super) const JOINED_VALUES: usize = 32;

/// A parameter of a [`Stmt`]: the types the store binds on both backends, typed so that a NULL keeps
/// its type on PostgreSQL.
#[derive(Debug, Clone)]
pub(super) enum Value {
    Int(i64),
    OptInt(Option<i64>),
    Text(String),
    Shared(Arc<str>),
    OptText(Option<String>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}
impl From<Option<i64>> for Value {
    fn from(v: Option<i64>) -> Self {
        Self::OptInt(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Self::Text(v.to_owned())
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Self::Text(v.clone())
    }
}
impl From<&vipwatch_contract::CompactString> for Value {
    fn from(v: &vipwatch_contract::CompactString) -> Self {
        Self::Text(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Self::Text(v)
    }
}
impl From<Arc<str>> for Value {
    fn from(v: Arc<str>) -> Self {
        Self::Shared(v)
    }
}
impl From<Option<String>> for Value {
    fn from(v: Option<String>) -> Self {
        Self::OptText(v)
    }
}
impl From<&Option<String>> for Value {
    fn from(v: &Option<String>) -> Self {
        Self::OptText(v.clone())
    }
}
impl From<Option<&str>> for Value {
    fn from(v: Option<&str>) -> Self {
        Self::OptText(v.map(str::to_owned))
    }
}

impl Value {
    fn bind(self, q: Query) -> Query {
        match self {
            Self::Int(v) => q.bind(v),
            Self::OptInt(v) => q.bind(v),
            Self::Text(v) => q.bind(v),
            Self::Shared(v) => q.bind(v),
            Self::OptText(v) => q.bind(v),
        }
    }
}

/// One statement of a [`Script`] with its parameters: written with `$N` placeholders (each may
/// recur), or with anonymous `?` bound in order (SQLite's multi-row inserts, [`values_sql`]).
#[derive(Debug)]
#[must_use = "a statement does nothing until added to a script"]
pub(super) struct Stmt {
    sql: String,
    values: Vec<Value>,
}

impl Stmt {
    /// A statement whose text is the same on both backends.
    pub(super) fn new(sql: impl Into<String>) -> Self {
        Self { sql: sql.into(), values: Vec::new() }
    }

    /// The text `sql` has for `backend`.
    pub(super) fn dual(backend: Backend, sql: &PerBackend) -> Self {
        Self::new(backend.pick(sql.lite, sql.pg))
    }

    /// A multi-row insert ([`values_sql`]) of `rows` rows of `columns` values, bound row by row.
    pub(super) fn values(backend: Backend, head: &str, rows: usize, columns: usize, tail: &str) -> Self {
        let mut s = Self::new(values_sql(backend, head, rows, columns, tail));
        s.values.reserve(rows * columns);
        s
    }

    /// Binds the next parameter (`$N` in order of N, or the next `?`).
    pub(super) fn bind(mut self, value: impl Into<Value>) -> Self {
        self.values.push(value.into());
        self
    }

    /// The statement as a [`Query`] of `backend`, to run on its own.
    pub(super) fn into_query(self, backend: Backend) -> Query {
        bound(backend, self.sql, self.values)
    }

    /// Appends this statement to a script's text and parameters: each `$N` becomes `?` with
    /// parameter N bound again at that place, so the script binds anonymous parameters only, in text
    /// order (a `$` not followed by a digit, as in a JSON path `'$.a'`, is kept). A bind count that
    /// does not match the placeholders would shift every later statement's parameters (SQLite binds
    /// a missing one as NULL): debug builds, and so the tests, assert it.
    fn append_to(self, sql: &mut String, values: &mut Vec<Value>) {
        if !sql.is_empty() {
            sql.push_str(";\n");
        }
        let bytes = self.sql.as_bytes();
        if !self.sql.contains('$') {
            debug_assert_eq!(self.sql.matches('?').count(), self.values.len(), "one value per `?`: {}", self.sql);
            sql.push_str(&self.sql);
            values.extend(self.values);
            return;
        }
        debug_assert!(!self.sql.contains('?'), "`$N` and `?` in one statement: {}", self.sql);
        let mut used = vec![false; self.values.len()];
        let mut i = 0;
        while i < bytes.len() {
            let digits = bytes[i + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
            if bytes[i] == b'$' && digits > 0 {
                let n: usize = self.sql[i + 1..i + 1 + digits].parse().unwrap_or(0);
                debug_assert!((1..=self.values.len()).contains(&n), "${n} without a value: {}", self.sql);
                sql.push('?');
                values.push(self.values.get(n.wrapping_sub(1)).cloned().unwrap_or(Value::OptText(None)));
                if let Some(u) = used.get_mut(n.wrapping_sub(1)) {
                    *u = true;
                }
                i += 1 + digits;
            } else {
                let next = self.sql[i + 1..].find('$').map_or(bytes.len(), |k| i + 1 + k);
                sql.push_str(&self.sql[i..next]);
                i = next;
            }
        }
        debug_assert!(used.iter().all(|u| *u), "a value no `$N` uses: {}", self.sql);
    }
}

/// `sql` on `backend` with `values` bound in order.
fn bound(backend: Backend, sql: String, values: Vec<Value>) -> Query {
    values.into_iter().fold(backend.query_dyn(sql), |q, v| v.bind(q))
}

/// A transaction's statements in order: on SQLite the small ones are held and sent together at the
/// next [`Script::flush`] (or before a statement that runs on its own, or at [`Script::commit`]); on
/// PostgreSQL each runs when added.
pub(super) struct Script<'c> {
    tx: Tx<'c>,
    sql: String,
    values: Vec<Value>,
}

impl<'c> Script<'c> {
    /// An empty script on `tx`, which it owns: [`Script::commit`] sends what is held and commits;
    /// dropped, it rolls the transaction back.
    pub(super) fn new(tx: Tx<'c>) -> Self {
        Self { tx, sql: String::new(), values: Vec::new() }
    }

    /// Sends what is held, then commits. Errors: as [`Script::flush`], or the commit failed.
    pub(super) async fn commit(mut self) -> Result<(), StoreError> {
        self.flush().await?;
        self.tx.commit().await
    }

    /// The backend of the transaction.
    pub(super) fn backend(&self) -> Backend {
        self.tx.backend()
    }

    /// Adds `stmt`: held on SQLite when it has at most [`JOINED_VALUES`] parameters, otherwise run
    /// (after what is held). Errors: the statements run now failed ([`StoreError`]); the
    /// transaction is then to be dropped.
    pub(super) async fn run(&mut self, stmt: Stmt) -> Result<(), StoreError> {
        if self.joins(&stmt) {
            stmt.append_to(&mut self.sql, &mut self.values);
            return Ok(());
        }
        self.send(stmt).await?.execute(self.tx.exec()).await?;
        Ok(())
    }

    /// Sends what is held, as one query. Errors: a statement failed ([`StoreError`], the first
    /// one's error; the rest did not run).
    pub(super) async fn flush(&mut self) -> Result<(), StoreError> {
        if self.sql.is_empty() {
            return Ok(());
        }
        self.take().execute(self.tx.exec()).await?;
        Ok(())
    }

    /// Adds `stmt` as the last statement and runs the script: its rows (only `stmt` may return any).
    /// Errors: as [`Script::flush`].
    pub(super) async fn fetch_all(&mut self, stmt: Stmt) -> Result<Vec<Row>, StoreError> {
        self.send(stmt).await?.fetch_all(self.tx.exec()).await
    }

    /// Whether `stmt` joins what is held (SQLite, at most [`JOINED_VALUES`] parameters).
    fn joins(&self, stmt: &Stmt) -> bool {
        self.backend() == Backend::Sqlite && stmt.values.len() <= JOINED_VALUES
    }

    /// The query that runs `stmt` now: what is held with `stmt` last when it joins, else `stmt` alone
    /// once what is held ran. Errors: as [`Script::flush`].
    async fn send(&mut self, stmt: Stmt) -> Result<Query, StoreError> {
        if !self.joins(&stmt) {
            self.flush().await?;
            return Ok(stmt.into_query(self.backend()));
        }
        stmt.append_to(&mut self.sql, &mut self.values);
        Ok(self.take())
    }

    /// What is held as one query, leaving the script empty.
    fn take(&mut self) -> Query {
        bound(self.backend(), std::mem::take(&mut self.sql), std::mem::take(&mut self.values))
    }

    /// The transaction itself, for a statement whose result is needed now: flushes first.
    pub(super) async fn tx(&mut self) -> Result<&mut Tx<'c>, StoreError> {
        self.flush().await?;
        Ok(&mut self.tx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    /// A store on a fresh SQLite file with a scratch table `t (id, a, b)`.
    async fn scratch() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let sql = "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT NOT NULL, b INTEGER)";
        store.execute(store.backend.query(sql)).await.unwrap();
        (dir, store)
    }

    async fn rows(store: &Store) -> Vec<(i64, String, Option<i64>)> {
        let rows = store.read_all(store.backend.query("SELECT id, a, b FROM t ORDER BY id")).await.unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
    }

    #[tokio::test]
    async fn a_script_runs_its_statements_in_order_in_one_transaction() {
        let (_dir, store) = scratch().await;
        let found = store
            .transact(crate::store::owner::job(|s| {
                Box::pin(async move {
                    let rows_in = Stmt::values(Backend::Sqlite, "INSERT INTO t (a, b)", 2, 2, "")
                        .bind("x")
                        .bind(1)
                        .bind("y")
                        .bind(2);
                    s.run(rows_in).await?;
                    s.run(Stmt::new("UPDATE t SET b = b + $1 WHERE a = $2 OR b = $1").bind(10).bind("y")).await?;
                    let big = (0..JOINED_VALUES as i64 / 2 + 1).fold(
                        Stmt::values(Backend::Sqlite, "INSERT INTO t (a, b)", JOINED_VALUES / 2 + 1, 2, ""),
                        |q, i| q.bind(format!("z{i}")).bind(None::<i64>),
                    );
                    s.run(big).await?; // runs alone, after the two held ones
                    let found = s.fetch_all(Stmt::new("SELECT a FROM t WHERE b = $1").bind(12)).await?;
                    Ok(found.iter().map(|r| r.get::<String, _>(0)).collect::<Vec<_>>())
                })
            }))
            .await
            .unwrap();
        assert_eq!(found, vec!["y".to_owned()]);
        let got = rows(&store).await;
        assert_eq!(got.len(), 2 + JOINED_VALUES / 2 + 1);
        assert_eq!(&got[..3], &[(1, "x".into(), Some(1)), (2, "y".into(), Some(12)), (3, "z0".into(), None)]);
    }

    #[tokio::test]
    async fn a_failing_statement_fails_the_script_and_keeps_nothing() {
        let (_dir, store) = scratch().await;
        let err = store
            .transact(crate::store::owner::job(|s| {
                Box::pin(async move {
                    s.run(Stmt::new("INSERT INTO t (id, a) VALUES ($1, $2)").bind(7).bind("kept?")).await?;
                    s.run(Stmt::new("INSERT INTO t (id, a) VALUES ($1, $2)").bind(7).bind("twice")).await?;
                    s.run(Stmt::new("INSERT INTO t (id, a) VALUES ($1, $2)").bind(8).bind("after")).await
                })
            }))
            .await
            .unwrap_err();
        match &err {
            StoreError::Sqlx(sqlx::Error::Database(db)) => assert_eq!(db.message(), "UNIQUE constraint failed: t.id"),
            other => panic!("not the unique violation: {other:?}"),
        }
        assert_eq!(rows(&store).await, vec![]);
    }

    fn appended(stmts: Vec<Stmt>) -> (String, Vec<String>) {
        let (mut sql, mut values) = (String::new(), Vec::new());
        for s in stmts {
            s.append_to(&mut sql, &mut values);
        }
        (sql, values.iter().map(|v| format!("{v:?}")).collect())
    }

    #[test]
    fn numbered_parameters_become_anonymous_bound_where_they_occur() {
        let s = Stmt::new("UPDATE t SET a = $2, b = '$.x' WHERE id >= $1 AND c = $2").bind(7).bind("v");
        let (sql, values) = appended(vec![s]);
        assert_eq!(sql, "UPDATE t SET a = ?, b = '$.x' WHERE id >= ? AND c = ?");
        assert_eq!(values, vec![r#"Text("v")"#, "Int(7)", r#"Text("v")"#]);
    }

    #[test]
    #[should_panic(expected = "$2 without a value")]
    fn a_missing_value_is_caught() {
        appended(vec![Stmt::new("DELETE FROM t WHERE a = $1 AND b = $2").bind(1)]);
    }

    #[test]
    #[should_panic(expected = "a value no `$N` uses")]
    fn a_value_too_many_is_caught() {
        appended(vec![Stmt::new("DELETE FROM t WHERE a = $1").bind(1).bind(2)]);
    }

    #[test]
    fn statements_follow_each_other_with_their_parameters_in_order() {
        let rows = Stmt::values(Backend::Sqlite, "INSERT INTO t (a, b)", 2, 2, "").bind(1).bind(2).bind(3).bind(4);
        let next = Stmt::new("DELETE FROM u WHERE x = $1").bind(Some(5));
        let (sql, values) = appended(vec![rows, next]);
        assert_eq!(sql, "INSERT INTO t (a, b) VALUES (?, ?), (?, ?);\nDELETE FROM u WHERE x = ?");
        assert_eq!(values, vec!["Int(1)", "Int(2)", "Int(3)", "Int(4)", "OptInt(Some(5))"]);
    }
}
