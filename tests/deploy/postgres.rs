//! A fresh database for the tests that run `vipwatch serve` on PostgreSQL, on the throwaway server of
//! `VIPWATCH_TEST_PG_URL` (`scripts/pg-test.sh start DIR` prints one; `.ci/run` starts one). Without
//! it those tests pass with a note, except under CI, where they fail (as tests/postgres.rs does).

use std::io::Write as _;

/// The URL of a new, empty database on the test server, or `None` (after a note) when there is none.
pub async fn fresh_database() -> Option<String> {
    let server = match std::env::var("VIPWATCH_TEST_PG_URL") {
        Ok(url) if !url.is_empty() => url,
        _ if std::env::var_os("CI").is_some() => {
            panic!("VIPWATCH_TEST_PG_URL is not set but CI is: start one with scripts/pg-test.sh (see .ci/run)")
        }
        _ => {
            // Straight to stderr: the test harness captures `eprintln!`.
            let note = "SKIPPED: serving on PostgreSQL needs VIPWATCH_TEST_PG_URL (`scripts/pg-test.sh start DIR`)";
            let _ = writeln!(std::io::stderr(), "{note}");
            return None;
        }
    };
    use sqlx::Connection as _;
    let name = format!("vw_deploy_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&server).await.expect("PostgreSQL test server reachable");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.unwrap();
    let mut url: url::Url = server.parse().unwrap();
    url.set_path(&format!("/{name}"));
    Some(url.to_string())
}
