//! A fresh database for the tests that run `vipwatch serve` on PostgreSQL, on the throwaway server of
//! `VIPWATCH_TEST_PG_URL` (`scripts/pg-test.sh start DIR` prints one; `.ci/run` starts one). Without
//! it those tests skip with a `SKIPPED` line, except under CI, where they fail
//! ([`crate::require::require_pg`]).

/// The URL of a new, empty database on the test server, or `None` (after a `SKIPPED` line) when there
/// is none.
pub async fn fresh_database() -> Option<String> {
    let server = crate::require::require_pg()?;
    use sqlx::Connection as _;
    let name = format!("vw_deploy_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&server).await.expect("PostgreSQL test server reachable");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.unwrap();
    let mut url: url::Url = server.parse().unwrap();
    url.set_path(&format!("/{name}"));
    Some(url.to_string())
}
