//! The datastore's connections on both stores: a write transaction dropped before its commit
//! leaves nothing behind and does not hold up the next user of the connection (on SQLite the
//! process has one connection, and the rollback is queued on it, not awaited).

mod support;

use gsaasd::db::Db;
use sqlx::Row;
use support::Store;

async fn migration_rows(db: &Db, version: i64) -> i64 {
    let mut conn = db.conn().await.unwrap();
    sqlx::query("SELECT COUNT(*) FROM schema_migrations WHERE version = $1")
        .bind(version)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0)
}

async fn insert_migration_row(tx: &mut gsaasd::db::WriteTx, version: i64) {
    sqlx::query("INSERT INTO schema_migrations (version, name, applied_ms) VALUES ($1, 'test', 0)")
        .bind(version)
        .execute(&mut **tx)
        .await
        .unwrap();
}

async fn an_uncommitted_transaction_rolls_back_when_dropped(store: Store) {
    let (config, dir) = support::test_config(store);
    let db = Db::connect(&config.database_url()).await.unwrap();

    let mut tx = db.begin().await.unwrap();
    insert_migration_row(&mut tx, 9001).await;
    drop(tx);
    assert_eq!(migration_rows(&db, 9001).await, 0, "a dropped transaction's row is gone");

    // The connection serves the next transaction, which commits.
    let mut tx = db.begin().await.unwrap();
    insert_migration_row(&mut tx, 9002).await;
    tx.commit().await.unwrap();
    assert_eq!(migration_rows(&db, 9002).await, 1);
    assert_eq!(migration_rows(&db, 9001).await, 0);

    // Dropped between two statements, with a read in between.
    let mut tx = db.begin().await.unwrap();
    insert_migration_row(&mut tx, 9003).await;
    let seen: i64 = sqlx::query("SELECT COUNT(*) FROM schema_migrations WHERE version = 9003")
        .fetch_one(&mut *tx)
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 1, "the transaction sees its own row");
    drop(tx);
    assert_eq!(migration_rows(&db, 9003).await, 0);
    db.ping().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

on_both_stores!(an_uncommitted_transaction_rolls_back_when_dropped);
