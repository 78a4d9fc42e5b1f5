//! The datastore's connections on both stores: a write transaction dropped before its commit
//! leaves nothing behind and does not hold up the next user of the connection (on SQLite the
//! process has one connection, and the rollback is queued on it, not awaited).

use crate::{on_both_stores, support};

use std::path::PathBuf;

use gsaasd::db::{Backend, Db};
use sqlx::Row;
use support::Store;

async fn migration_rows(db: &Db, version: i64) -> i64 {
    let mut conn = db.conn().await.unwrap();
    sqlx::query("SELECT COUNT(*) FROM revoked_tokens WHERE id = $1")
        .bind(version.to_string())
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0)
}

async fn insert_migration_row(tx: &mut gsaasd::db::WriteTx, version: i64) {
    sqlx::query("INSERT INTO revoked_tokens (id, expires_ms, revoked_ms) VALUES ($1, 0, 0)")
        .bind(version.to_string())
        .execute(&mut **tx)
        .await
        .unwrap();
}

async fn an_uncommitted_transaction_rolls_back_when_dropped(store: Store) {
    let db = support::FreshDb::open(store).await;

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
    let seen: i64 = sqlx::query("SELECT COUNT(*) FROM revoked_tokens WHERE id = '9003'")
        .fetch_one(&mut *tx)
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 1, "the transaction sees its own row");
    drop(tx);
    assert_eq!(migration_rows(&db, 9003).await, 0);
    db.ping().await.unwrap();
}

/// A VM keeps its latest events, in the order they came even within one millisecond, and no
/// more than `EVENTS_PER_VM` of them however many come.
async fn a_vm_keeps_only_its_latest_events_in_order(store: Store) {
    use gsaasd::db::{events_of, insert_event, VmEvent, EVENTS_PER_VM};
    let db = support::FreshDb::open(store).await;
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
}

/// The SQL of the binary's migrations `from..to` (versions, `to` excluded).
fn migrations(from: i64, to: i64) -> Vec<&'static str> {
    gsaasd::db::MIGRATIONS
        .iter()
        .filter(|(version, _, _)| (from..to).contains(version))
        .map(|(_, _, sql)| *sql)
        .collect()
}

/// The migrations a gsaasd of before sqlx's migrator recorded in `schema_migrations` (1-12).
fn legacy() -> Vec<&'static str> {
    migrations(1, 13)
}

/// How many migrations the binary has.
const MIGRATIONS: i64 =
    (gsaasd::db::MIGRATIONS.len() + gsaasd::db::DIALECT_MIGRATIONS.len()) as i64;

async fn count(db: &Db, sql: &str) -> i64 {
    sqlx::query(sql).fetch_one(&mut *db.conn().await.unwrap()).await.unwrap().get(0)
}

/// A database a gsaasd of before sqlx's migrator left behind: `migrations` applied and recorded
/// in `schema_migrations` (versions 1 on), then `data` run. Its URL and the test's directory.
async fn legacy_database(store: Store, migrations: &[&str], data: &str) -> (String, PathBuf) {
    use sqlx::Connection;
    let (config, dir) = support::test_config(store);
    std::fs::create_dir_all(&config.data_dir).unwrap();
    let url = config.database_url();
    sqlx::any::install_default_drivers();
    let mut raw = sqlx::AnyConnection::connect(&url).await.unwrap();
    for sql in migrations {
        sqlx::raw_sql(sql).execute(&mut raw).await.unwrap();
    }
    sqlx::raw_sql(
        "CREATE TABLE schema_migrations \
         (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_ms BIGINT NOT NULL);",
    )
    .execute(&mut raw)
    .await
    .unwrap();
    sqlx::raw_sql(data).execute(&mut raw).await.unwrap();
    for version in 1..=migrations.len() as i64 {
        sqlx::query(
            "INSERT INTO schema_migrations (version, name, applied_ms) VALUES ($1, 'x', 0)",
        )
        .bind(version)
        .execute(&mut raw)
        .await
        .unwrap();
    }
    raw.close().await.unwrap();
    (url, dir)
}

/// A database the old runner migrated is adopted by sqlx's migrator with its data, and a
/// database whose applied migrations differ from the binary's is refused.
async fn a_legacy_database_is_adopted_and_a_changed_migration_refused(store: Store) {
    let data = "INSERT INTO quotas (project, cgpus, updated_ms) VALUES ('kept', 3, 0);";
    let (url, dir) = legacy_database(store, &legacy(), data).await;

    let db = Db::connect(&url).await.unwrap();
    assert_eq!(count(&db, "SELECT COUNT(*) FROM _sqlx_migrations WHERE success").await, MIGRATIONS);
    assert_eq!(count(&db, "SELECT cgpus FROM quotas WHERE project = 'kept'").await, 3);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM vms WHERE created_ms > 0").await, 0);
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM schema_migrations").await,
        12,
        "the legacy history stays for an older gsaasd (a rollback)"
    );
    drop(db);
    // Connecting again changes nothing.
    let db = Db::connect(&url).await.unwrap();
    assert_eq!(count(&db, "SELECT COUNT(*) FROM _sqlx_migrations").await, MIGRATIONS);

    // An applied migration that is not the binary's (edited since) stops the start.
    sqlx::query("UPDATE _sqlx_migrations SET checksum = $1 WHERE version = 7")
        .bind(vec![0u8; 48])
        .execute(&mut *db.conn().await.unwrap())
        .await
        .unwrap();
    drop(db);
    let err = Db::connect(&url).await.unwrap_err();
    let chain = format!("{}", gsaasd::error::ErrorChain(&err));
    assert!(chain.contains('7') && chain.contains("modified"), "{chain}");
    let _ = std::fs::remove_dir_all(dir);
}

/// During a rolling upgrade the older replicas (re)start on a schema a newer gsaasd migrated:
/// migrations this binary does not know are left alone, and it serves (the expand/contract
/// rule of docs/upgrades.md keeps the schema its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_gsaasds_migrations_leave_an_older_one_starting() {
    let (config, dir) = support::test_config(Store::Sqlite);
    std::fs::create_dir_all(&config.data_dir).unwrap();
    let url = config.database_url();
    let db = Db::connect(&url).await.unwrap();
    // What the next version adds: a table, an applied migration this binary does not have.
    sqlx::raw_sql(
        "CREATE TABLE from_the_future (id BIGINT PRIMARY KEY); \
         INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', TRUE, X'00', 0);",
    )
    .execute(&mut *db.conn().await.unwrap())
    .await
    .unwrap();
    drop(db);
    let db = Db::connect(&url).await.expect("starts beside a newer schema");
    assert_eq!(count(&db, "SELECT COUNT(*) FROM _sqlx_migrations").await, MIGRATIONS + 1);
    drop(db);
    let _ = std::fs::remove_dir_all(dir);
}

/// A database where two hosts' GPUs claimed one rCUDA endpoint (before endpoints were unique)
/// still starts: the GPU registered first keeps the endpoint, the later one is quarantined
/// (tainted, its cGPU kept), simulated loopback endpoints claim nothing; and from then on the
/// database itself refuses a second claim, whatever wrote it.
async fn endpoints_claimed_twice_before_are_quarantined_and_never_again(store: Store) {
    // The migrations before 0015, which made rCUDA endpoints unique.
    let migrations = migrations(1, 15);
    let data = "INSERT INTO hosts (name, seq, kind, state, last_seen_ms) VALUES \
           ('gpu2', 2, 'compute-gpu', 'schedulable', 0), \
           ('gpu1', 1, 'compute-gpu', 'schedulable', 0), \
           ('sim1', 3, 'compute-gpu', 'schedulable', 0), \
           ('sim2', 4, 'compute-gpu', 'schedulable', 0); \
         INSERT INTO gpus (id, host, idx, model, memory_mib, rcuda_address, rcuda_port, \
           rcuda_gpu_number) VALUES \
           ('gpu2:0', 'gpu2', 0, 'K20m', 4800, '10.78.0.1', 8308, 0), \
           ('gpu2:1', 'gpu2', 1, 'K20m', 4800, '10.78.0.2', 8308, 0), \
           ('gpu1:0', 'gpu1', 0, 'K20m', 4800, '10.78.0.1', 8308, 0), \
           ('gpu1:1', 'gpu1', 1, 'K20m', 4800, '10.78.0.1', 8308, 1), \
           ('sim1:0', 'sim1', 0, 'K20m', 4800, '127.0.0.1', 8308, 0), \
           ('sim2:0', 'sim2', 0, 'K20m', 4800, '127.0.0.1', 8308, 0);";
    let (url, dir) = legacy_database(store, &migrations, data).await;

    let db = Db::connect(&url).await.unwrap();
    let claimed = "SELECT id FROM gpus WHERE rcuda_claimed = 1 ORDER BY id";
    let rows = sqlx::query(claimed).fetch_all(&mut *db.conn().await.unwrap()).await.unwrap();
    let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(ids, ["gpu1:0", "gpu1:1", "gpu2:1"], "the first registered keeps its endpoint");
    let rows = sqlx::query("SELECT id, taint FROM gpus WHERE taint IS NOT NULL")
        .fetch_all(&mut *db.conn().await.unwrap())
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<String, _>(0), "gpu2:0");
    assert!(rows[0].get::<String, _>(1).contains("10.78.0.1:8308"));

    // gpu2's first GPU cannot claim it back, by any path.
    let mut tx = db.begin().await.unwrap();
    let id = gpgpums::GpuId::new("gpu2:0").unwrap();
    let err = gsaasd::db::claim_rcuda_endpoint(&mut tx, &id).await.unwrap_err();
    assert!(matches!(err, gsaasd::db::Error::Conflict(_)), "{err}");
    drop(tx);
    let mut tx = db.begin().await.unwrap();
    let claim = sqlx::query("UPDATE gpus SET rcuda_claimed = 1 WHERE id = 'gpu2:0'")
        .execute(&mut *tx)
        .await;
    assert!(claim.is_err(), "the database refuses a second claim");
    drop(tx);
    let mut tx = db.begin().await.unwrap();
    let gpu = gsaasd::model::GpuRecord {
        id: gpgpums::GpuId::new("gpu3:0").unwrap(),
        host: gpgpums::HostId::new("gpu1").unwrap(),
        index: 7,
        model: "K20m".into(),
        memory_mib: 4800,
        rcuda_address: "10.78.0.2".parse().unwrap(),
        rcuda_port: 8308,
        rcuda_gpu_number: 0,
        health: None,
        attributes: Default::default(),
        partition: None,
    };
    let err = gsaasd::db::insert_gpu(&mut tx, &gpu).await.unwrap_err();
    assert!(matches!(err, gsaasd::db::Error::Conflict(_)), "{err}");
    drop(tx);
    let _ = std::fs::remove_dir_all(dir);
}

/// On SQLite the one connection never stops a request to copy its log into the database file
/// (its automatic checkpoint is a backstop far above what a pass of the checkpointer leaves): a
/// second connection does it, so committed writes reach the file without it.
#[tokio::test]
async fn sqlite_writes_reach_the_database_file_without_the_connection_checkpointing() {
    let (config, dir) = support::test_config(Store::Sqlite);
    let db = Db::connect(&config.database_url()).await.unwrap();
    let backstop = count(&db, "PRAGMA wal_autocheckpoint").await;
    assert!(backstop >= 10_000, "the one connection checkpoints every {backstop} pages");

    let file = config.data_dir.join("gsaas.sqlite");
    let before = std::fs::metadata(&file).unwrap().len();
    let mut tx = db.begin().await.unwrap();
    let padding = "x".repeat(4_000);
    for i in 0..2_000 {
        sqlx::query("INSERT INTO revoked_tokens (id, expires_ms, revoked_ms) VALUES ($1, 0, 0)")
            .bind(format!("{i}-{padding}"))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    // About 2,000 pages more: past SQLite's default threshold, far below the backstop.
    let grown = before + 4_000_000;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::metadata(&file).unwrap().len() < grown {
        assert!(std::time::Instant::now() < deadline, "the log was never checkpointed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(count(&db, "SELECT COUNT(*) FROM revoked_tokens").await, 2_000);
    drop(db);
    let _ = std::fs::remove_dir_all(dir);
}

/// SQLite is built with the compile-time options `.cargo/config.toml` sets (no memory statistics,
/// whose global mutex every allocation of the one connection's thread took): a build that lost
/// them, such as one whose environment overrides `LIBSQLITE3_FLAGS`, fails here.
#[tokio::test]
async fn sqlite_is_built_with_the_workspace_compile_options() {
    let db = support::FreshDb::open(Store::Sqlite).await;
    let mut conn = db.conn().await.unwrap();
    let options: Vec<String> =
        sqlx::query_scalar("PRAGMA compile_options").fetch_all(&mut *conn).await.unwrap();
    for wanted in
        ["DEFAULT_MEMSTATUS=0", "USE_ALLOCA", "MAX_EXPR_DEPTH=0", "LIKE_DOESNT_MATCH_BLOBS"]
    {
        assert!(options.iter().any(|o| o == wanted), "SQLite built without {wanted}: {options:?}");
    }
    drop(conn);
    drop(db);
}

/// The first pass's read of every host's routes at once gives what the reads per host give: each
/// routed VM's live cGPUs in attach order, one row for a routed VM with none, and nothing of VMs
/// not routed, of detaching or lost cGPUs, or of hosts with nothing to route.
async fn every_table_at_once_matches_the_tables_host_by_host(store: Store) {
    use gpgpums::{HostId, HostKind, VmId};
    use gsaasd::db::{insert_host, routed_cgpus_everywhere, routed_cgpus_on};
    let db = support::FreshDb::open(store).await;
    let mut tx = db.begin().await.unwrap();
    let hosts: Vec<HostId> = ["h1", "h2", "h3"].iter().map(|h| HostId::new(*h).unwrap()).collect();
    for (h, host) in hosts.iter().enumerate() {
        insert_host(&mut tx, host, HostKind::ComputeGpu, None, &Default::default(), 0)
            .await
            .unwrap();
        for idx in 0..2 {
            sqlx::query(
                "INSERT INTO gpus (id, host, idx, model, memory_mib, rcuda_address, rcuda_port, \
                 rcuda_gpu_number) VALUES ($1, $2, $3, 'H100', 98304, $4, $5, $3)",
            )
            .bind(format!("{host}:gpu{idx}"))
            .bind(host.as_str())
            .bind(idx)
            .bind(format!("10.0.{h}.{}", idx + 1))
            .bind(8308 + idx)
            .execute(&mut *tx)
            .await
            .unwrap();
        }
    }
    // (host, routes on, fixed IP, tap, cGPUs as (index, seq, state, GPU))
    type Cgpu = (i64, i64, &'static str, &'static str);
    type Vm = (&'static str, i64, Option<&'static str>, Option<&'static str>, Vec<Cgpu>);
    let vms: [Vm; 6] = [
        (
            "h1",
            1,
            Some("10.1.0.2"),
            Some("tap-a"),
            vec![
                (0, 1, "live", "h2:gpu0"),
                (1, 0, "live", "h1:gpu1"),
                (2, 1, "attaching", "h1:gpu0"),
            ],
        ),
        (
            "h1",
            1,
            Some("10.1.0.3"),
            Some("tap-b"),
            vec![(0, 0, "detaching", "h1:gpu0"), (1, 0, "lost", "h1:gpu1")],
        ),
        ("h1", 1, Some("10.1.0.4"), Some("tap-c"), vec![]),
        ("h2", 1, None, None, vec![(0, 0, "live", "h1:gpu0")]),
        ("h2", 0, Some("10.1.0.6"), Some("tap-e"), vec![(0, 0, "live", "h2:gpu1")]),
        ("h3", 0, Some("10.1.0.7"), Some("tap-f"), vec![(0, 0, "live", "h3:gpu1")]),
    ];
    for (host, routes_on, fixed_ip, tap, cgpus) in vms {
        let vm = VmId::new_random().to_string();
        sqlx::query(
            "INSERT INTO vms (id, project, owner, name, request, policy, state, step, host, \
             fixed_ip, tap, routes_on, timings, created_ms, updated_ms) VALUES \
             ($1, 'p', 'o', 'n', '{}', 'first-fit', 'ready', 'done', $2, $3, $4, $5, '{}', 0, 0)",
        )
        .bind(&vm)
        .bind(host)
        .bind(fixed_ip)
        .bind(tap)
        .bind(routes_on)
        .execute(&mut *tx)
        .await
        .unwrap();
        for (idx, seq, state, gpu) in cgpus {
            sqlx::query(
                "INSERT INTO cgpus (vm, idx, gpu, memory_mib, mode, masked_address, masked_port, \
                 seq, state) VALUES ($1, $2, $3, 1024, 'shared', '100.127.0.1', $4, $5, $6)",
            )
            .bind(&vm)
            .bind(idx)
            .bind(gpu)
            .bind(9000 + idx)
            .bind(seq)
            .bind(state)
            .execute(&mut *tx)
            .await
            .unwrap();
        }
    }
    sqlx::query("UPDATE vms SET remoting = 'lupine' WHERE tap = 'tap-b'")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut conn = db.conn().await.unwrap();
    let at_once = routed_cgpus_everywhere(&mut conn).await.unwrap();
    let mut by_host = routed_cgpus_on(&mut conn, &hosts).await.unwrap();
    by_host.retain(|_, routed| !routed.is_empty());
    assert_eq!(at_once, by_host);
    // What the two agree on: h1's first VM's live and attaching cGPUs in attach order, its second
    // VM's lost cGPU, its third VM without cGPUs, h2's routed VM with no address yet, and nothing
    // on h3.
    let ports = |host: &HostId| -> Vec<Option<u16>> {
        at_once[host].iter().map(|r| r.cgpu.as_ref().map(|c| c.masked.port())).collect()
    };
    assert_eq!(at_once.keys().collect::<Vec<_>>(), vec![&hosts[0], &hosts[1]]);
    let h1 = ports(&hosts[0]);
    assert_eq!(h1.iter().filter(|p| p.is_none()).count(), 1);
    // Each VM's cGPUs in attach order (VMs in id order, which is random here); the second VM's
    // lost cGPU is listed, as lost (its environment says it is missing), its detaching one not.
    let of_tap = |tap: &str| -> Vec<(u16, u32, bool)> {
        at_once[&hosts[0]]
            .iter()
            .filter(|r| r.tap.as_deref() == Some(tap))
            .filter_map(|r| r.cgpu.as_ref().map(|c| (c.masked.port(), c.index, c.lost)))
            .collect()
    };
    assert_eq!(of_tap("tap-a"), vec![(9001, 1, false), (9000, 0, false), (9002, 2, false)]);
    assert_eq!(of_tap("tap-b"), vec![(9001, 1, true)]);
    // Each VM's layer, with or without a routed cGPU.
    for routed in &at_once[&hosts[0]] {
        let lupine = routed.tap.as_deref() == Some("tap-b");
        let layer = if lupine { gpgpums::Remoting::Lupine } else { gpgpums::Remoting::Rcuda };
        assert_eq!(routed.remoting, layer, "{routed:?}");
    }
    assert_eq!(ports(&hosts[1]), vec![Some(9000)]);
    let h2 = &at_once[&hosts[1]][0];
    assert!(h2.fixed_ip.is_none() && h2.tap.is_none());
    drop(conn);
}

/// The first pass's text listing of every VM with a server reads what the rows say, whatever a
/// cloud's server ids hold (spaces, commas, `%` and what looks like its escapes).
async fn every_vm_with_a_server_is_listed_as_stored(store: Store) {
    use gsaasd::cloud::ServerId;
    use gsaasd::db::{vms_on_servers, vms_with_servers};
    let db = support::FreshDb::open(store).await;
    // (server, host, state, step, updated_ms)
    type Vm = (Option<&'static str>, Option<&'static str>, &'static str, &'static str, i64);
    let vms: [Vm; 7] = [
        (Some("3f1c9a52-8d0e-4b7a-9c1e-2a6b5d4e3f21"), Some("h1"), "ready", "done", 10),
        (Some("odd id, with %2C and 100% in it"), Some("h2"), "ready", "routes", 20),
        (Some("%25,%"), None, "creating", "server", 30),
        (Some("deleting-server"), Some("h1"), "deleting", "done", 40),
        (Some("deleted-server"), Some("h1"), "deleted", "done", 50),
        (None, None, "creating", "reserve", 60),
        (Some(" lead and trail "), Some("h3"), "ready", "done", 70),
    ];
    let mut conn = db.conn().await.unwrap();
    for (server, host, state, step, updated_ms) in vms {
        sqlx::query(
            "INSERT INTO vms (id, project, owner, name, request, policy, state, step, host, \
             server_id, timings, created_ms, updated_ms) VALUES \
             ($1, 'p', 'o', 'n', '{}', 'first-fit', $2, $3, $4, $5, '{}', 0, $6)",
        )
        .bind(gpgpums::VmId::new_random().to_string())
        .bind(state)
        .bind(step)
        .bind(host)
        .bind(server)
        .bind(updated_ms)
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    let mut listed = vms_with_servers(&mut conn).await.unwrap();
    let servers: Vec<ServerId> =
        vms.iter().filter_map(|vm| vm.0).map(|s| ServerId(s.to_owned())).collect();
    let mut read = vms_on_servers(&mut conn, &servers).await.unwrap();
    listed.sort_by_key(|vm| vm.updated_ms);
    read.sort_by_key(|vm| vm.updated_ms);
    assert_eq!(listed, read);
    let seen: Vec<(&str, Option<&str>, bool, bool)> = listed
        .iter()
        .map(|vm| {
            (vm.server.0.as_str(), vm.host.as_ref().map(|h| h.as_str()), vm.ready, vm.settled)
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("3f1c9a52-8d0e-4b7a-9c1e-2a6b5d4e3f21", Some("h1"), true, true),
            ("odd id, with %2C and 100% in it", Some("h2"), true, false),
            ("%25,%", None, false, false),
            (" lead and trail ", Some("h3"), true, true),
        ]
    );
    drop(conn);
}

/// The (index, state, GPU) of each cGPU a read holding the VM's cGPUs at `held` got (`None`:
/// unchanged), and the version it read.
async fn read_cgpus_at(
    conn: &mut sqlx::AnyConnection,
    vm: gpgpums::VmId,
    held: Option<i64>,
) -> (Option<Vec<(u32, gsaasd::model::CgpuState, String)>>, i64) {
    let read = gsaasd::db::vms_with_cgpus_by_id(conn, &[(vm, held)]).await.unwrap().pop();
    let read = read.expect("the VM");
    let cgpus = read
        .cgpus
        .map(|cgpus| cgpus.iter().map(|c| (c.index, c.state, c.gpu.to_string())).collect());
    (cgpus, read.cgpus_version)
}

/// Every change of a VM's cGPU rows changes its `cgpus_version`, so a read that holds the cGPUs
/// as of the old version gets them again, changed; a read at the current version gets none.
/// Several of these changes write no VM (a re-home, a lost cGPU, its recovery, a reclaim): with no
/// version of their own they would leave polls showing the cGPUs as they were.
async fn each_change_of_a_vms_cgpus_is_read_again(store: Store) {
    use gpgpums::{GpuId, HostId, HostKind, Mode, VmId};
    use gsaasd::db::{self as store_db, insert_host};
    use gsaasd::model::{CgpuRecord, CgpuState};
    let db = support::FreshDb::open(store).await;
    let host = HostId::new("h1").unwrap();
    let vm = VmId::new_random();
    let mut tx = db.begin().await.unwrap();
    insert_host(&mut tx, &host, HostKind::ComputeGpu, None, &Default::default(), 0).await.unwrap();
    for idx in 0..2 {
        sqlx::query(
            "INSERT INTO gpus (id, host, idx, model, memory_mib, rcuda_address, rcuda_port, \
             rcuda_gpu_number) VALUES ($1, 'h1', $2, 'H100', 98304, '10.0.0.1', 8308, $2)",
        )
        .bind(format!("h1:gpu{idx}"))
        .bind(idx)
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO vms (id, project, owner, name, request, policy, state, step, timings, \
         created_ms, updated_ms) VALUES ($1, 'p', 'o', 'n', $2, 'first-fit', 'ready', 'done', \
         '{}', 0, 0)",
    )
    .bind(vm.to_string())
    .bind(r#"{"vm": {"name": "n", "image": "i", "flavor": "f"}, "gpus": {"ncgpus": 2}}"#)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let cgpu = |index: u32, gpu: &str| CgpuRecord {
        vm,
        index,
        seq: 0,
        state: CgpuState::Live,
        gpu: GpuId::new(gpu).unwrap(),
        host: host.clone(),
        memory_mib: 1024,
        mode: Mode::Shared,
        masked_address: "100.127.0.1".parse().unwrap(),
        masked_port: 9000 + index as u16,
        rcuda_address: "10.0.0.1".parse().unwrap(),
        rcuda_port: 8308,
        rcuda_gpu_number: 0,
        compute_percent: None,
        borrowed_ms: None,
    };
    let mut conn = db.conn().await.unwrap();
    store_db::insert_cgpus(&mut conn, &[cgpu(0, "h1:gpu0"), cgpu(1, "h1:gpu0")]).await.unwrap();
    let mut held = None;
    let (first, version) = read_cgpus_at(&mut conn, vm, held).await;
    let live = |gpu: &str| (CgpuState::Live, gpu.to_owned());
    let with = |first: (CgpuState, String), second: (CgpuState, String)| {
        Some(vec![(0, first.0, first.1), (1, second.0, second.1)])
    };
    assert_eq!(first, with(live("h1:gpu0"), live("h1:gpu0")));
    held = Some(version);
    assert_eq!(
        read_cgpus_at(&mut conn, vm, held).await,
        (None, version),
        "unchanged: not read again"
    );

    store_db::set_cgpu_states(&mut conn, vm, Some(0), CgpuState::Live, CgpuState::Lost)
        .await
        .unwrap();
    let (cgpus, v) = read_cgpus_at(&mut conn, vm, held).await;
    assert_eq!(cgpus, with((CgpuState::Lost, "h1:gpu0".into()), live("h1:gpu0")), "lost");
    held = Some(v);

    store_db::recover_lost_cgpus(&mut conn).await.unwrap();
    let (cgpus, v) = read_cgpus_at(&mut conn, vm, held).await;
    assert_eq!(cgpus, with(live("h1:gpu0"), live("h1:gpu0")), "recovered");
    held = Some(v);

    store_db::move_cgpu(&mut conn, vm, 1, &GpuId::new("h1:gpu1").unwrap()).await.unwrap();
    let (cgpus, v) = read_cgpus_at(&mut conn, vm, held).await;
    assert_eq!(cgpus, with(live("h1:gpu0"), live("h1:gpu1")), "re-homed");
    held = Some(v);

    assert!(store_db::reclaim_cgpu(&mut conn, vm, 0, 1).await.unwrap());
    let (cgpus, v) = read_cgpus_at(&mut conn, vm, held).await;
    assert_eq!(cgpus, with((CgpuState::Detaching, "h1:gpu0".into()), live("h1:gpu1")), "reclaimed");
    held = Some(v);

    store_db::delete_cgpus_in_state(&mut conn, vm, CgpuState::Detaching).await.unwrap();
    let (cgpus, v) = read_cgpus_at(&mut conn, vm, held).await;
    assert_eq!(cgpus, Some(vec![(1, CgpuState::Live, "h1:gpu1".into())]), "detached");
    held = Some(v);

    store_db::insert_cgpus(&mut conn, &[cgpu(2, "h1:gpu0")]).await.unwrap();
    let (cgpus, v) = read_cgpus_at(&mut conn, vm, held).await;
    assert_eq!(
        cgpus,
        Some(vec![(1, CgpuState::Live, "h1:gpu1".into()), (2, CgpuState::Live, "h1:gpu0".into())]),
        "attached"
    );
    held = Some(v);

    // A release, as the bookings write it: the VM's ending write carries the new version, and
    // the cGPUs go after it.
    let ended = store_db::vm(&mut conn, vm).await.unwrap().expect("the VM");
    let mut ending = [store_db::VmWrite { vm: ended, claim: None }];
    let written = store_db::update_vms_releasing_cgpus(&mut conn, &mut ending).await.unwrap();
    assert_eq!(written, vec![store_db::Written::Done { claimed: false }]);
    store_db::delete_cgpus(&mut conn, &[vm]).await.unwrap();
    let (cgpus, v) = read_cgpus_at(&mut conn, vm, held).await;
    assert_eq!(cgpus, Some(vec![]), "released");
    assert_eq!(read_cgpus_at(&mut conn, vm, Some(v)).await, (None, v), "released: read once");
    drop(conn);
}

/// The lookups of live VMs by server (`db::vms_on_servers`, `db::vms_with_servers`) and the quota
/// count (`db::counted_vms`) can read the partial indexes of migration 0019, which hold live VMs
/// only: each plan names one (PostgreSQL asked with sequential scans off, as its planner
/// scans a table this small), over 3,000 VMs of which a third live. The statements are those
/// functions' shapes.
async fn live_vm_lookups_read_their_partial_indexes(store: Store) {
    let db = support::FreshDb::open(store).await;
    let mut conn = db.conn().await.unwrap();
    let (explain, postgres) = match store {
        Store::Sqlite => ("EXPLAIN QUERY PLAN", false),
        Store::Postgres => ("EXPLAIN", true),
    };
    // 3,000 VMs of 50 projects, a third of them live, each with its server; then statistics.
    sqlx::query(
        "WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000) \
         INSERT INTO vms (id, project, owner, name, request, policy, state, step, server_id, \
             timings, created_ms, updated_ms) \
         SELECT 'vm-' || i, 'p' || (i % 50), 'o', 'n', '{}', 'first-fit', \
             CASE WHEN i % 3 = 0 THEN 'ready' ELSE 'deleted' END, 'done', 's' || i, '{}', i, i \
         FROM n",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query("ANALYZE").execute(&mut *conn).await.unwrap();
    if postgres {
        sqlx::query("SET enable_seqscan = off").execute(&mut *conn).await.unwrap();
    }
    let live = "state IN ('creating', 'ready')";
    for (query, indexes) in [
        (
            format!(
                "SELECT project, COUNT(*) FROM vms WHERE project IN (VALUES ('p'), ('q')) \
                 AND {live} GROUP BY project"
            ),
            &["vms_live_by_project"][..],
        ),
        (
            format!("SELECT project, COUNT(*) FROM vms WHERE {live} GROUP BY project"),
            &["vms_live_by_project"],
        ),
        (
            format!(
                "SELECT v.id, v.server_id FROM vms v WHERE v.server_id IN (VALUES ('s'), ('t')) \
                 AND v.{live}"
            ),
            &["vms_by_server"],
        ),
        // Every live VM with a server: either index of live VMs serves.
        (
            format!("SELECT id FROM vms WHERE server_id IS NOT NULL AND {live}"),
            &["vms_by_server", "vms_live_by_project"],
        ),
    ] {
        let rows = sqlx::query(&format!("{explain} {query}")).fetch_all(&mut *conn).await.unwrap();
        let plan: Vec<String> =
            rows.iter().map(|row| row.get::<String, _>(if postgres { 0 } else { 3 })).collect();
        let reads = |index: &&str| plan.iter().any(|line| line.contains(index));
        assert!(indexes.iter().any(reads), "{query}: {plan:#?}");
    }
    drop(conn);
}

/// gsaasd's PostgreSQL sessions cost a random page read as one in memory (see
/// `db::RANDOM_PAGE_COST`: at the default, a small or churned `vms` was scanned whole for batches
/// of 64 keys), and leave the setting alone when the URL sets it. Two reads, as the pool hands out
/// a connection each time (both lanes' pools are built alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sessions_cost_pages_as_in_memory_unless_the_url_says() {
    async fn random_page_cost(db: &Db) -> String {
        let mut conn = db.conn().await.unwrap();
        sqlx::query("SHOW random_page_cost").fetch_one(&mut *conn).await.unwrap().get(0)
    }
    let url = support::postgres::fresh_database();
    let db = Db::connect(&url).await.unwrap();
    assert_eq!(random_page_cost(&db).await, "1.1");
    assert_eq!(random_page_cost(&db).await, "1.1");
    drop(db);
    let db = Db::connect(&format!("{url}?options=-c%20random_page_cost%3D3")).await.unwrap();
    assert_eq!(random_page_cost(&db).await, "3");
}

/// A release finds its VMs' cGPUs by key on PostgreSQL, also when the planner has no statistics
/// and `cgpus` is mostly dead rows (a new or restored database, churn between vacuums): with
/// `vm IN (VALUES ...)` it joined the list to a scan of the whole table, 1-5 ms a release inside
/// the pool's transaction in the cycles bench. And an Idempotency-Key's index holds only the VMs
/// launched with one (0034), while a key stays unique in its project.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_releases_read_cgpus_by_key_and_keys_index_only_keyed_vms() {
    use gpgpums::VmId;
    async fn cgpu_scans(conn: &mut sqlx::AnyConnection) -> (i64, i64) {
        sqlx::query("SELECT pg_stat_force_next_flush()").execute(&mut *conn).await.unwrap();
        let row = sqlx::query(
            "SELECT seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'cgpus'",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        (row.get(0), row.get(1))
    }
    let db = Db::connect(&support::postgres::fresh_database()).await.unwrap();
    let mut conn = db.conn().await.unwrap();
    // 10,000 VMs with a cGPU each, all but the last 100 released (dead rows), none analyzed.
    for sql in [
        "INSERT INTO hosts (name, seq, kind, state, last_seen_ms) \
         VALUES ('h', 1, 'compute-gpu', 'schedulable', 0)",
        "INSERT INTO gpus (id, host, idx, model, memory_mib, rcuda_address, rcuda_port, \
         rcuda_gpu_number) VALUES ('h:0', 'h', 0, 'H100', 98304, '10.0.0.1', 8308, 0)",
        "INSERT INTO vms (id, project, owner, name, request, policy, state, step, timings, \
         created_ms, updated_ms) SELECT '00000000-0000-7000-8000-' || lpad(i::text, 12, '0'), \
         'p', 'o', 'n', '{}', 'first-fit', 'deleted', 'done', '{}', i, i \
         FROM generate_series(1, 10000) AS i",
        "INSERT INTO cgpus (vm, idx, gpu, memory_mib, mode, masked_address, masked_port, seq, \
         state) SELECT id, 0, 'h:0', 64, 'shared', '100.127.0.1', 9000, 0, 'live' FROM vms",
        "DELETE FROM cgpus WHERE vm <= '00000000-0000-7000-8000-000000009900'",
    ] {
        sqlx::query(sql).execute(&mut *conn).await.unwrap();
    }
    let released: Vec<VmId> = (9901..=9964)
        .map(|i| format!("00000000-0000-7000-8000-{i:012}").parse().unwrap())
        .collect();
    let before = cgpu_scans(&mut conn).await;
    gsaasd::db::delete_cgpus(&mut conn, &released).await.unwrap();
    let after = cgpu_scans(&mut conn).await;
    assert_eq!(after.0, before.0, "a release scanned cgpus whole");
    assert!(after.1 > before.1, "a release found its cGPUs by key");
    let left: i64 =
        sqlx::query("SELECT COUNT(*) FROM cgpus").fetch_one(&mut *conn).await.unwrap().get(0);
    assert_eq!(left, 36, "the other VMs' cGPUs stay");

    let index: String = sqlx::query(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'vms' AND indexdef LIKE '%idempotency_key%'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
    .get(0);
    assert!(index.contains("UNIQUE") && index.contains("IS NOT NULL"), "{index}");
    let keyed = "INSERT INTO vms (id, project, owner, name, request, policy, state, step, \
        timings, created_ms, updated_ms, idempotency_key) VALUES ($1, $2, 'o', 'n', '{}', \
        'first-fit', 'ready', 'done', '{}', 0, 0, 'k')";
    for (id, project) in [("keyed-1", "p"), ("keyed-2", "q")] {
        sqlx::query(keyed).bind(id).bind(project).execute(&mut *conn).await.unwrap();
    }
    let again = sqlx::query(keyed).bind("keyed-3").bind("p").execute(&mut *conn).await;
    assert!(
        matches!(&again, Err(sqlx::Error::Database(e)) if e.is_unique_violation()),
        "a key taken in its project: {again:?}"
    );
}

/// Spans the usage triggers of 0027 opened before 0029 replaced them with the usage log end
/// through the log: a VM counting across the upgrade is billed once, to the end of its life, and
/// one launched after is billed from the log alone.
async fn spans_opened_before_the_usage_log_end_through_it(store: Store) {
    let backend = if store == Store::Sqlite { Backend::Sqlite } else { Backend::Postgres };
    let before: Vec<&str> = gsaasd::db::migrations_for(backend)
        .into_iter()
        .filter(|(version, _, _)| *version < 29)
        .map(|(_, _, sql)| sql)
        .collect();
    let vm = |id: &str| {
        format!(
            "INSERT INTO vms (id, project, owner, name, request, policy, state, step, timings, \
             created_ms, updated_ms) VALUES ('{id}', 'p', 'o', 'n', '{{}}', 'first-fit', 'ready', \
             'done', '{{}}', 0, 0); \
             INSERT INTO cgpus (vm, idx, gpu, memory_mib, mode, masked_address, masked_port, seq, \
             state) VALUES ('{id}', 0, 'h:0', 512, 'shared', '100.127.0.1', 9000, 0, 'live');"
        )
    };
    let data = format!(
        "INSERT INTO hosts (name, seq, kind, state, last_seen_ms) VALUES \
           ('h', 1, 'compute-gpu', 'schedulable', 0); \
         INSERT INTO gpus (id, host, idx, model, memory_mib, rcuda_address, rcuda_port, \
           rcuda_gpu_number) VALUES ('h:0', 'h', 0, 'K20m', 4800, '10.78.0.1', 8308, 0); {}",
        vm("old")
    );
    let (url, dir) = legacy_database(store, &before, &data).await;
    let db = Db::connect(&url).await.unwrap();
    let open = "SELECT COUNT(*) FROM cgpu_usage WHERE end_ms IS NULL";
    assert_eq!(count(&db, open).await, 1, "0027's trigger opened the old VM's span");

    sqlx::raw_sql(&vm("new")).execute(&mut *db.conn().await.unwrap()).await.unwrap();
    assert_eq!(count(&db, "SELECT COUNT(*) FROM usage_events").await, 2, "logged, not yet folded");
    assert_eq!(db.fold_usage().await.unwrap(), 2);
    assert_eq!(count(&db, open).await, 2);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM vm_usage WHERE end_ms IS NULL").await, 2);

    let terminate = "UPDATE vms SET state = 'deleting' WHERE id IN ('old', 'new'); \
                     UPDATE cgpus SET state = 'released' WHERE vm IN ('old', 'new');";
    sqlx::raw_sql(terminate).execute(&mut *db.conn().await.unwrap()).await.unwrap();
    // Two VM ends (the releases that follow log nothing: their VMs no longer count).
    assert_eq!(db.fold_usage().await.unwrap(), 2);
    assert_eq!(db.fold_usage().await.unwrap(), 0, "each event is folded once");
    assert_eq!(count(&db, open).await, 0);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM vm_usage WHERE end_ms IS NULL").await, 0);
    let spans = "SELECT COUNT(*) FROM cgpu_usage WHERE end_ms >= start_ms";
    assert_eq!(count(&db, spans).await, 2, "one span each, ended");
    drop(db);
    let _ = std::fs::remove_dir_all(dir);
}

/// A change of one row logs its events at one instant: a cGPU moved to another GPU ends its span
/// when the next begins, and a VM that counts again starts with its cGPUs (PostgreSQL's triggers
/// read the clock once per event before 0032, and CI saw a move leave a 2 ms gap). Moved 300
/// times, as a re-home moves it, so a clock read twice crosses a millisecond at least once.
async fn a_rows_change_logs_its_events_at_one_instant(store: Store) {
    let db = support::FreshDb::open(store).await;
    let mut conn = db.conn().await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO hosts (name, seq, kind, state, last_seen_ms) VALUES \
           ('h', 1, 'compute-gpu', 'schedulable', 0); \
         INSERT INTO gpus (id, host, idx, model, memory_mib, rcuda_address, rcuda_port, \
           rcuda_gpu_number) VALUES ('h:0', 'h', 0, 'K20m', 4800, '10.78.0.1', 8308, 0), \
           ('h:1', 'h', 1, 'K20m', 4800, '10.78.0.1', 8309, 1); \
         INSERT INTO vms (id, project, owner, name, request, policy, state, step, timings, \
           created_ms, updated_ms) VALUES ('v', 'p', 'o', 'n', '{}', 'first-fit', 'ready', \
           'done', '{}', 0, 0); \
         INSERT INTO cgpus (vm, idx, gpu, memory_mib, mode, masked_address, masked_port, seq, \
           state) VALUES ('v', 0, 'h:0', 512, 'shared', '100.127.0.1', 9000, 0, 'live'), \
           ('v', 1, 'h:1', 512, 'shared', '100.127.0.1', 9001, 1, 'live');",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::raw_sql("DELETE FROM usage_events").execute(&mut *conn).await.unwrap();
    const MOVES: usize = 300;
    for i in 0..MOVES {
        let to = if i % 2 == 0 { "h:1" } else { "h:0" };
        sqlx::query("UPDATE cgpus SET gpu = $1 WHERE vm = 'v' AND idx = 0")
            .bind(to)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    for state in ["deleting", "ready"] {
        sqlx::query("UPDATE vms SET state = $1 WHERE id = 'v'")
            .bind(state)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    let events: Vec<(i64, i64)> = sqlx::query("SELECT op, at_ms FROM usage_events ORDER BY seq")
        .fetch_all(&mut *conn)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let ops: Vec<i64> = events.iter().map(|e| e.0).collect();
    let mut expected: Vec<i64> = [1, 2].repeat(MOVES);
    expected.extend([3, 4, 2, 2]);
    assert_eq!(ops, expected, "an end and a start per move; the VM's end, then its starts");
    let moved_apart = events[..2 * MOVES].chunks(2).filter(|pair| pair[0].1 != pair[1].1).count();
    assert_eq!(moved_apart, 0, "moves whose end and next start were logged at different times");
    let restart = &events[2 * MOVES + 1..];
    assert!(restart.iter().all(|e| e.1 == restart[0].1), "the VM and its cGPUs: {restart:?}");
}

/// Statements that write several hosts each, from replicas side by side (new table generations
/// held to their reads, confirmed generations, in-process hosts' heartbeats), never deadlock:
/// each locks the hosts in name order, whatever order it was given them in. (PostgreSQL once
/// ended one of a launch's writes for a deadlock, and the launch failed.)
async fn writes_of_several_hosts_at_once_never_deadlock(store: Store) {
    use gpgpums::{HostId, HostKind};
    use gsaasd::db::insert_host;
    let db = std::sync::Arc::new(support::FreshDb::open(store).await);
    let hosts: Vec<HostId> = (0..12).map(|i| HostId::new(format!("h{i:02}")).unwrap()).collect();
    let mut tx = db.begin().await.unwrap();
    for host in &hosts {
        insert_host(&mut tx, host, HostKind::ComputeGpu, None, &Default::default(), 0)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let writers = (0..6u64).map(|w| {
        let (db, mut hosts) = (db.clone(), hosts.clone());
        tokio::spawn(async move {
            for round in 0..40u64 {
                // Each writer in an order of its own, changing each round.
                hosts.rotate_left(((w * 5 + round) % 12) as usize);
                if (w + round) % 2 == 1 {
                    hosts.reverse();
                }
                let tables = db.next_route_tables(&hosts, false).await;
                tables.map_err(|e| format!("new generations: {e:?}"))?;
                let applied: Vec<(HostId, u64)> =
                    hosts.iter().map(|h| (h.clone(), round + 1)).collect();
                let confirmed = db.set_applied_generations(&applied).await;
                confirmed.map_err(|e| format!("confirmed generations: {e:?}"))?;
                let touched = db.touch_hosts(&hosts, round as i64).await;
                touched.map_err(|e| format!("heartbeats: {e:?}"))?;
            }
            Ok::<(), String>(())
        })
    });
    for writer in support::join_all(writers).await {
        writer.unwrap().unwrap();
    }
    // Every generation taken is there: 6 writers, 40 rounds each.
    for host in &hosts {
        let record = db.host(host).await.unwrap().unwrap();
        assert_eq!(record.routes_generation, 240, "{host}");
        assert_eq!(record.applied_generation, 40, "{host}");
    }
}

on_both_stores!(
    an_uncommitted_transaction_rolls_back_when_dropped,
    live_vm_lookups_read_their_partial_indexes,
    a_vm_keeps_only_its_latest_events_in_order,
    a_legacy_database_is_adopted_and_a_changed_migration_refused,
    endpoints_claimed_twice_before_are_quarantined_and_never_again,
    every_table_at_once_matches_the_tables_host_by_host,
    every_vm_with_a_server_is_listed_as_stored,
    each_change_of_a_vms_cgpus_is_read_again,
    spans_opened_before_the_usage_log_end_through_it,
    a_rows_change_logs_its_events_at_one_instant,
    writes_of_several_hosts_at_once_never_deadlock
);
