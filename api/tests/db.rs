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

/// A VM keeps its latest events, in the order they came even within one millisecond, and no
/// more than `EVENTS_PER_VM` of them however many come.
async fn a_vm_keeps_only_its_latest_events_in_order(store: Store) {
    use gsaasd::db::{events_of, insert_event, VmEvent, EVENTS_PER_VM};
    let (config, dir) = support::test_config(store);
    let db = Db::connect(&config.database_url()).await.unwrap();
    let (vm, other) = (gpgpums::VmId::new_random(), gpgpums::VmId::new_random());
    let many = EVENTS_PER_VM + 25;
    let mut tx = db.begin().await.unwrap();
    for i in 0..many {
        // Every event in the same millisecond: only their order tells them apart.
        let event = VmEvent { at_ms: 7, kind: "attached".into(), detail: format!("event {i}") };
        insert_event(&mut tx, vm, &event).await.unwrap();
    }
    let event = VmEvent { at_ms: 7, kind: "preempted".into(), detail: "other".into() };
    insert_event(&mut tx, other, &event).await.unwrap();
    tx.commit().await.unwrap();
    let mut conn = db.conn().await.unwrap();
    let details: Vec<String> =
        events_of(&mut conn, vm).await.unwrap().into_iter().map(|e| e.detail).collect();
    let expected: Vec<String> =
        (many - EVENTS_PER_VM..many).map(|i| format!("event {i}")).collect();
    assert_eq!(details, expected);
    let stored: i64 = sqlx::query("SELECT COUNT(*) FROM vm_events WHERE vm = $1")
        .bind(vm.to_string())
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, EVENTS_PER_VM, "older events are forgotten");
    assert_eq!(events_of(&mut conn, other).await.unwrap().len(), 1);
    drop(conn);
    let _ = std::fs::remove_dir_all(dir);
}

on_both_stores!(
    an_uncommitted_transaction_rolls_back_when_dropped,
    a_vm_keeps_only_its_latest_events_in_order
);
