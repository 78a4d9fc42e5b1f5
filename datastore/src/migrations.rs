//! Schema migrations, applied by sqlx's migrator: it records each migration's checksum and
//! refuses a database whose applied migrations were since changed (but not one with migrations
//! of a newer gsaasd, which an upgrade's older replicas must live with), holds PostgreSQL's advisory
//! lock while it migrates (replicas starting together apply each migration once), and refuses a
//! database a failed migration left half-done. The migrations are embedded in the binary.
//!
//! Databases created before gsaasd used it recorded their migrations in `schema_migrations`;
//! they are adopted once, under the same lock: each recorded migration is entered as applied in
//! sqlx's `_sqlx_migrations`. The old table stays, so an older gsaasd (a rollback, or a replica
//! not yet upgraded) still finds its history and starts.

use std::borrow::Cow;

use sqlx::migrate::{Migrate, MigrateError, Migration, MigrationType, Migrator};
use sqlx::{AnyConnection, Row};

use super::Backend;
use crate::error::Error;

fn migrator(migrations: &[(i64, &'static str, &'static str)]) -> Migrator {
    let migrations: Vec<Migration> = migrations
        .iter()
        .map(|&(version, name, sql)| {
            let (name, sql) = (Cow::Borrowed(name), Cow::Borrowed(sql));
            Migration::new(version, name, MigrationType::Simple, sql, false)
        })
        .collect();
    // A newer gsaasd's migrations, applied before this one (re)starts, are left alone: during a
    // rolling upgrade the older replicas keep starting on the newer schema, which the
    // expand/contract rule (docs/upgrades.md) keeps readable and writable for them.
    Migrator { migrations: Cow::Owned(migrations), ignore_missing: true, ..Migrator::DEFAULT }
}

fn migration_error(e: MigrateError) -> Error {
    Error::unavailable("database migrations", e)
}

/// Brings the schema up to date.
pub(super) async fn run(
    conn: &mut AnyConnection,
    backend: Backend,
    migrations: &[(i64, &'static str, &'static str)],
) -> Result<(), Error> {
    let migrator = migrator(migrations);
    conn.lock().await.map_err(migration_error)?;
    let adopted = adopt_legacy_history(conn, backend, &migrator).await;
    let unlocked = conn.unlock().await.map_err(migration_error);
    adopted?;
    unlocked?;
    migrator.run(&mut *conn).await.map_err(migration_error)
}

/// Enters the migrations recorded in a legacy `schema_migrations` table as applied, once: not
/// when sqlx's table has any.
async fn adopt_legacy_history(
    conn: &mut AnyConnection,
    backend: Backend,
    migrator: &Migrator,
) -> Result<(), Error> {
    let exists = match backend {
        Backend::Sqlite => {
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
        }
        Backend::Postgres => {
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name = 'schema_migrations'"
        }
    };
    let count: i64 = sqlx::query(exists).fetch_one(&mut *conn).await?.try_get(0)?;
    if count == 0 {
        return Ok(());
    }
    conn.ensure_migrations_table().await.map_err(migration_error)?;
    let applied: i64 = sqlx::query("SELECT COUNT(*) FROM _sqlx_migrations")
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
    if applied > 0 {
        return Ok(());
    }
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let recorded = sqlx::query("SELECT version FROM schema_migrations ORDER BY version")
        .fetch_all(&mut *tx)
        .await?;
    for row in recorded {
        let version: i64 = row.try_get(0)?;
        let migration = migrator.iter().find(|m| m.version == version).ok_or_else(|| {
            Error::internal(format!(
                "the database records migration {version}, which this gsaasd does not know: \
                 it was migrated by a newer gsaasd"
            ))
        })?;
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES ($1, $2, TRUE, $3, 0) ON CONFLICT (version) DO NOTHING",
        )
        .bind(version)
        .bind(migration.description.as_ref())
        .bind(migration.checksum.to_vec())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    tracing::info!("adopted the database's migration history");
    Ok(())
}
