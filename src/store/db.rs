//! One statement API over both backends: SQLite (the embedded default) and PostgreSQL (shared by
//! replicas). The store's modules write each statement once with `$1`-style placeholders (SQLite
//! reads `$N` as parameter N too) and run it through [`Query`] on a [`Exec`]; where the dialects
//! differ (`json_each` against `jsonb_to_recordset`, `INDEXED BY`, scalar `MAX`/`GREATEST`) they
//! pick one text per backend with [`Backend::pick`].
//!
//! Not sqlx's `Any` driver (it has no JSON or typed values, and no `LISTEN`): values are bound and
//! decoded with each backend's own types, so a Rust type used here must encode and decode on both
//! (i64, strings, options of them, bool).

use futures::TryStreamExt;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnection, PgPool, PgRow};
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{ColumnIndex, Connection as _, Decode, Encode, Postgres, SqlSafeStr, Sqlite, Transaction, Type};

use super::StoreError;

/// Which database a [`super::Store`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file (`database.path`): one process.
    Sqlite,
    /// A PostgreSQL database (`database.url`): shared by replicas.
    Postgres,
}

impl Backend {
    /// `lite` on SQLite, `pg` on PostgreSQL.
    pub(super) fn pick<T>(self, lite: T, pg: T) -> T {
        match self {
            Self::Sqlite => lite,
            Self::Postgres => pg,
        }
    }

    /// A statement for this backend; bind its parameters in placeholder order.
    pub(super) fn query(self, sql: impl SqlSafeStr) -> Query {
        match self {
            Self::Sqlite => Query::Lite(sqlx::query(sql)),
            Self::Postgres => Query::Pg(sqlx::query(sql)),
        }
    }

    /// The statement `sql` has for this backend.
    pub(super) fn dual(self, sql: &PerBackend) -> Query {
        self.query(self.pick(sql.lite, sql.pg))
    }

    /// [`Backend::query`] for SQL assembled at run time (filters, multi-row VALUES, literal LIMITs):
    /// callers only ever splice in fixed fragments, placeholders and integers, never a value.
    pub(super) fn query_dyn(self, sql: String) -> Query {
        self.query(sqlx::AssertSqlSafe(sql))
    }

    /// The backend's name as logs and the API show it: `sqlite` or `postgres`.
    pub fn as_str(self) -> &'static str {
        self.pick("sqlite", "postgres")
    }
}

/// A statement whose text differs between the backends.
pub(super) struct PerBackend {
    /// The SQLite text.
    pub lite: &'static str,
    /// The PostgreSQL text.
    pub pg: &'static str,
}

/// The connection pools of a store: `read` for queries, `write` (one connection) for every write.
#[derive(Debug, Clone)]
pub(super) enum Pools {
    Lite { read: SqlitePool, write: SqlitePool },
    Pg { read: PgPool, write: PgPool, lease: PgPool },
}

/// A connection taken from one of the [`Pools`]; back to its pool when dropped.
pub(super) enum Pooled {
    Lite(PoolConnection<Sqlite>),
    Pg(PoolConnection<Postgres>),
}

impl Pools {
    /// A read connection. Errors: no connection within the pool's acquire timeout, or it cannot open.
    pub(super) async fn read(&self) -> Result<Pooled, sqlx::Error> {
        Ok(match self {
            Self::Lite { read, .. } => Pooled::Lite(read.acquire().await?),
            Self::Pg { read, .. } => Pooled::Pg(read.acquire().await?),
        })
    }

    /// The write connection (its owner's, see `store::owner`).
    pub(super) async fn write(&self) -> Result<Pooled, sqlx::Error> {
        Ok(match self {
            Self::Lite { write, .. } => Pooled::Lite(write.acquire().await?),
            Self::Pg { write, .. } => Pooled::Pg(write.acquire().await?),
        })
    }

    /// Closes every connection (waits for running statements).
    pub(super) async fn close(&self) {
        match self {
            Self::Lite { read, write } => {
                write.close().await;
                read.close().await;
            }
            Self::Pg { read, write, lease } => {
                write.close().await;
                read.close().await;
                lease.close().await;
            }
        }
    }
}

impl Pooled {
    /// The connection, to run statements on.
    pub(super) fn exec(&mut self) -> Exec<'_> {
        match self {
            Self::Lite(c) => Exec::Lite(c),
            Self::Pg(c) => Exec::Pg(c),
        }
    }

    /// Starts a write transaction that holds the write lock from its first statement: SQLite's
    /// `BEGIN IMMEDIATE` (so a lock held by another process shows at `BEGIN`, which the readiness
    /// probe relies on); on PostgreSQL, whose writers lock rows, a plain `BEGIN` (read committed).
    pub(super) async fn begin(&mut self) -> Result<Tx<'_>, StoreError> {
        Ok(match self {
            Self::Lite(c) => Tx::Lite(c.begin_with("BEGIN IMMEDIATE").await?),
            Self::Pg(c) => Tx::Pg(c.begin().await?),
        })
    }

    /// Closes the connection instead of returning it to the pool (after a failed write).
    pub(super) fn close_on_drop(&mut self) {
        match self {
            Self::Lite(c) => c.close_on_drop(),
            Self::Pg(c) => c.close_on_drop(),
        }
    }
}

/// A value that binds on both backends.
pub(super) trait Bind:
    for<'t> Encode<'t, Sqlite> + Type<Sqlite> + for<'t> Encode<'t, Postgres> + Type<Postgres>
{
}
impl<T> Bind for T where T: for<'t> Encode<'t, Sqlite> + Type<Sqlite> + for<'t> Encode<'t, Postgres> + Type<Postgres> {}

/// A statement with its bound parameters, for one backend.
#[must_use = "a query does nothing until run"]
pub(super) enum Query {
    Lite(sqlx::query::Query<'static, Sqlite, SqliteArguments>),
    Pg(sqlx::query::Query<'static, Postgres, PgArguments>),
}

/// A connection (or a transaction on one) to run a [`Query`] on.
pub(super) enum Exec<'c> {
    Lite(&'c mut SqliteConnection),
    Pg(&'c mut PgConnection),
}

/// A result row of either backend; [`Row::get`] decodes a column as `sqlx::Row::get` does (and, like
/// it, panics on a type the column cannot decode to: a bug in the statement, caught by the tests on
/// both backends).
pub(super) enum Row {
    Lite(SqliteRow),
    Pg(PgRow),
}

/// A transaction of either backend; dropped without [`Tx::commit`] it rolls back.
pub(super) enum Tx<'c> {
    Lite(Transaction<'c, Sqlite>),
    Pg(Transaction<'c, Postgres>),
}

impl Query {
    /// Binds the next parameter.
    pub(super) fn bind<T: Bind>(self, value: T) -> Self {
        match self {
            Self::Lite(q) => Self::Lite(q.bind(value)),
            Self::Pg(q) => Self::Pg(q.bind(value)),
        }
    }

    /// Runs it; returns the rows affected.
    pub(super) async fn execute(self, exec: Exec<'_>) -> Result<u64, StoreError> {
        Ok(match (self, exec) {
            (Self::Lite(q), Exec::Lite(c)) => q.execute(c).await?.rows_affected(),
            (Self::Pg(q), Exec::Pg(c)) => q.execute(c).await?.rows_affected(),
            _ => unreachable!("a query runs on the backend it was made for"),
        })
    }

    /// Every row.
    pub(super) async fn fetch_all(self, exec: Exec<'_>) -> Result<Vec<Row>, StoreError> {
        Ok(match (self, exec) {
            (Self::Lite(q), Exec::Lite(c)) => q.fetch_all(c).await?.into_iter().map(Row::Lite).collect(),
            (Self::Pg(q), Exec::Pg(c)) => q.fetch_all(c).await?.into_iter().map(Row::Pg).collect(),
            _ => unreachable!("a query runs on the backend it was made for"),
        })
    }

    /// The first row, if any.
    pub(super) async fn fetch_optional(self, exec: Exec<'_>) -> Result<Option<Row>, StoreError> {
        Ok(match (self, exec) {
            (Self::Lite(q), Exec::Lite(c)) => q.fetch_optional(c).await?.map(Row::Lite),
            (Self::Pg(q), Exec::Pg(c)) => q.fetch_optional(c).await?.map(Row::Pg),
            _ => unreachable!("a query runs on the backend it was made for"),
        })
    }

    /// Exactly one row. Errors: `sqlx::Error::RowNotFound` when there is none.
    pub(super) async fn fetch_one(self, exec: Exec<'_>) -> Result<Row, StoreError> {
        self.fetch_optional(exec).await?.ok_or(StoreError::Sqlx(sqlx::Error::RowNotFound))
    }

    /// Streams the rows into `visit`, one at a time (nothing buffered beyond the driver's own).
    pub(super) async fn for_each(
        self,
        exec: Exec<'_>,
        mut visit: impl FnMut(Row) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        match (self, exec) {
            (Self::Lite(q), Exec::Lite(c)) => {
                let mut rows = q.fetch(c);
                while let Some(r) = rows.try_next().await? {
                    visit(Row::Lite(r))?;
                }
            }
            (Self::Pg(q), Exec::Pg(c)) => {
                let mut rows = q.fetch(c);
                while let Some(r) = rows.try_next().await? {
                    visit(Row::Pg(r))?;
                }
            }
            _ => unreachable!("a query runs on the backend it was made for"),
        }
        Ok(())
    }
}

impl Row {
    /// Column `index` (a name or a position) decoded as `T`.
    pub(super) fn get<'r, T, I>(&'r self, index: I) -> T
    where
        T: Decode<'r, Sqlite> + Type<Sqlite> + Decode<'r, Postgres> + Type<Postgres>,
        I: ColumnIndex<SqliteRow> + ColumnIndex<PgRow> + std::fmt::Debug,
    {
        match self {
            Self::Lite(r) => sqlx::Row::get(r, index),
            Self::Pg(r) => sqlx::Row::get(r, index),
        }
    }
}

impl<'c> Tx<'c> {
    /// Which backend the transaction runs on.
    pub(super) fn backend(&self) -> Backend {
        match self {
            Self::Lite(_) => Backend::Sqlite,
            Self::Pg(_) => Backend::Postgres,
        }
    }

    /// The transaction's connection, to run statements in it.
    pub(super) fn exec(&mut self) -> Exec<'_> {
        match self {
            Self::Lite(tx) => Exec::Lite(tx),
            Self::Pg(tx) => Exec::Pg(tx),
        }
    }

    /// Commits.
    pub(super) async fn commit(self) -> Result<(), StoreError> {
        match self {
            Self::Lite(tx) => tx.commit().await?,
            Self::Pg(tx) => tx.commit().await?,
        }
        Ok(())
    }

    /// Rolls back.
    pub(super) async fn rollback(self) -> Result<(), StoreError> {
        match self {
            Self::Lite(tx) => tx.rollback().await?,
            Self::Pg(tx) => tx.rollback().await?,
        }
        Ok(())
    }
}

/// `rows` cut for multi-row statements: chunks of `most` rows while that many are left, then of the
/// largest of `most / 4`, `most / 16`, … (and 1) that fits (`most` = 128: 300 rows → 128, 128, 32, 8,
/// 2, 2), so a table's inserts use at most `log4(most) + 2` distinct statement texts, each prepared
/// once and kept on the connection. Halving instead would keep eight per table with 128, and the
/// large ones cost much memory each on SQLite (see docs/explanation/design-decisions.md); this
/// costs at most three more statements for a tail of fewer than `most` rows (127 rows: 10
/// statements, where halving takes 7).
pub(super) fn row_chunks<T>(rows: &[T], most: usize) -> impl Iterator<Item = &[T]> {
    let mut rest = rows;
    std::iter::from_fn(move || {
        let n = match rest.len() {
            0 => return None,
            len => {
                let mut n = most;
                while n > len {
                    n /= 4;
                }
                n.max(1)
            }
        };
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        Some(chunk)
    })
}

/// `INSERT INTO ... (columns) VALUES (…), (…), ...` for `rows` rows of `columns` values each,
/// followed by `tail` (e.g. ` RETURNING id`): the text of a multi-row insert whose parameters are
/// bound row by row. PostgreSQL numbers them (`$1, $2, …`); SQLite gets anonymous `?`, which it
/// numbers in order itself: sqlx looks up each numbered parameter's name by a linear scan of the
/// statement's parameter list, so `$N` would make binding a 128-change chunk (about 1,300
/// parameters) quadratic.
pub(super) fn values_sql(backend: Backend, head: &str, rows: usize, columns: usize, tail: &str) -> String {
    let mut sql = String::with_capacity(head.len() + tail.len() + rows * columns * 5 + 8);
    sql.push_str(head);
    sql.push_str(" VALUES ");
    for r in 0..rows {
        sql.push_str(if r == 0 { "(" } else { ", (" });
        for c in 0..columns {
            if c > 0 {
                sql.push_str(", ");
            }
            match backend {
                Backend::Sqlite => sql.push('?'),
                Backend::Postgres => {
                    sql.push('$');
                    sql.push_str(&(r * columns + c + 1).to_string());
                }
            }
        }
        sql.push(')');
    }
    sql.push_str(tail);
    sql
}

/// SQL conditions with their parameters, assembled at run time (the API's filters). Conditions are
/// fixed fragments; values only travel as parameters.
#[derive(Default)]
pub(super) struct Filter {
    sql: String,
    binds: Vec<Value>,
}

/// A parameter of a [`Filter`].
enum Value {
    Int(i64),
    Text(String),
}

impl Filter {
    /// Adds ` AND <column> <op> $n` with `value` as parameter n.
    pub(super) fn int(&mut self, column: &str, op: &str, value: i64) -> &mut Self {
        self.binds.push(Value::Int(value));
        self.push(column, op)
    }

    /// [`Filter::int`] for a text value.
    pub(super) fn text(&mut self, column: &str, op: &str, value: &str) -> &mut Self {
        self.binds.push(Value::Text(value.to_owned()));
        self.push(column, op)
    }

    /// `column = value` when `value` is set.
    pub(super) fn eq_opt(&mut self, column: &str, value: &Option<String>) -> &mut Self {
        if let Some(v) = value {
            self.text(column, "=", v);
        }
        self
    }

    /// Adds ` AND (<first>, <second>) > ($n, $n+1)`: keyset paging after a two-column key.
    pub(super) fn pair_after(&mut self, first: &str, second: &str, a: &str, b: &str) -> &mut Self {
        use std::fmt::Write as _;
        self.binds.push(Value::Text(a.to_owned()));
        self.binds.push(Value::Text(b.to_owned()));
        let n = self.binds.len();
        let _ = write!(self.sql, " AND ({first}, {second}) > (${}, ${n})", n - 1);
        self
    }

    /// Adds ` AND (<first>, <second>) IN (($n, $n+1), …)`, one pair of parameters per pair of `pairs`.
    pub(super) fn pair_in(&mut self, first: &str, second: &str, pairs: &[(&str, &str)]) -> &mut Self {
        use std::fmt::Write as _;
        let mut list = Vec::with_capacity(pairs.len());
        for (a, b) in pairs {
            self.binds.push(Value::Text((*a).to_owned()));
            self.binds.push(Value::Text((*b).to_owned()));
            let n = self.binds.len();
            list.push(format!("(${}, ${n})", n - 1));
        }
        let _ = write!(self.sql, " AND ({first}, {second}) IN ({})", list.join(", "));
        self
    }

    fn push(&mut self, column: &str, op: &str) -> &mut Self {
        use std::fmt::Write as _;
        let _ = write!(self.sql, " AND {column} {op} ${}", self.binds.len());
        self
    }

    /// `head WHERE true <conditions> tail` on `backend`, parameters bound.
    pub(super) fn query(self, backend: Backend, head: &str, tail: &str) -> Query {
        let mut q = backend.query_dyn(format!("{head} WHERE true{}{tail}", self.sql));
        for v in self.binds {
            q = match v {
                Value::Int(i) => q.bind(i),
                Value::Text(s) => q.bind(s),
            };
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_sql_numbers_parameters_row_by_row_on_postgresql() {
        assert_eq!(
            values_sql(Backend::Postgres, "INSERT INTO t (a, b)", 2, 2, " RETURNING id"),
            "INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4) RETURNING id"
        );
    }

    #[test]
    fn values_sql_leaves_parameters_anonymous_on_sqlite() {
        assert_eq!(
            values_sql(Backend::Sqlite, "INSERT INTO t (a, b)", 2, 2, " RETURNING id"),
            "INSERT INTO t (a, b) VALUES (?, ?), (?, ?) RETURNING id"
        );
    }

    #[test]
    fn rows_are_cut_into_few_distinct_chunk_sizes() {
        let sizes = |n: usize| row_chunks(&vec![0u8; n], 128).map(<[u8]>::len).collect::<Vec<_>>();
        assert_eq!(sizes(300), vec![128, 128, 32, 8, 2, 2]);
        assert_eq!(sizes(127), vec![32, 32, 32, 8, 8, 8, 2, 2, 2, 1]);
        assert_eq!((sizes(1), sizes(0)), (vec![1], vec![]));
        let distinct: std::collections::BTreeSet<usize> = (0..=1000).flat_map(sizes).collect();
        assert_eq!(distinct.into_iter().collect::<Vec<_>>(), vec![1, 2, 8, 32, 128]);
    }

    #[test]
    fn a_filter_numbers_its_parameters_in_order() {
        let mut f = Filter::default();
        f.int("id", ">", 7).eq_opt("namespace", &Some("shop".into())).eq_opt("name", &None);
        assert_eq!(f.sql, " AND id > $1 AND namespace = $2");
    }
}
