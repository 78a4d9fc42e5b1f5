//! Notifications on a real RabbitMQ (Debian's `rabbitmq-server`, one per test): a consumer
//! receives every event of a launch, an attach, a re-home, a detach and a termination, in order
//! per VM, in oslo.messaging's envelope, naming no host or GPU; with RabbitMQ stopped during
//! launches and started again, none is missing. On both stores (the triggers that write the
//! outbox are each store's own).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::{on_both_stores, support};

use gsaasd::auth::Role;
use serde_json::{json, Value};
use support::rabbitmq::Rabbit;
use support::{shared_launch, shared_launch_with, Store, TestService};

on_both_stores!(
    every_life_of_a_vm_is_notified_in_order_and_an_outage_loses_nothing,
    without_a_broker_nothing_is_written,
);

/// The oslo.messaging message inside an envelope.
fn message(envelope: &Value) -> Value {
    assert_eq!(envelope["oslo.version"], "2.0", "{envelope}");
    serde_json::from_str(envelope["oslo.message"].as_str().expect("oslo.message is text"))
        .expect("oslo.message is JSON")
}

/// Each VM's events, in the order they arrived, each once (a message sent again after an outage
/// keeps its `message_id`).
fn by_vm(envelopes: &[Value]) -> BTreeMap<String, Vec<Value>> {
    let mut seen = BTreeSet::new();
    let mut vms: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for m in envelopes.iter().map(message) {
        if seen.insert(m["message_id"].as_str().unwrap().to_owned()) {
            vms.entry(m["payload"]["vm_id"].as_str().unwrap().to_owned()).or_default().push(m);
        }
    }
    vms
}

fn event_types(messages: &[Value]) -> Vec<&str> {
    messages.iter().map(|m| m["event_type"].as_str().unwrap()).collect()
}

fn has_event(envelopes: &[Value], vm: &str, event: &str) -> bool {
    by_vm(envelopes).get(vm).is_some_and(|m| event_types(m).contains(&event))
}

async fn waiting(t: &TestService) -> i64 {
    gsaasd::db::waiting_notification_count(&mut t.service().app.db.conn().await.unwrap())
        .await
        .unwrap()
}

async fn every_life_of_a_vm_is_notified_in_order_and_an_outage_loses_nothing(store: Store) {
    let rabbit = Rabbit::start().await;
    let url = rabbit.transport_url();
    let t = TestService::start_with(store, |c| {
        c.notifications.transport_url = Some(url.into());
        c.notifications.poll_ms = 20;
    })
    .await;
    let (member, admin) = (t.member(), t.admin());
    let inbox = rabbit.consume("notifications.info").await;

    // A VM's whole life: launched on two GPUs, grown by one, one cGPU re-homed, one detached,
    // terminated.
    let launch =
        shared_launch_with(2, 1024, json!({"name": "notified", "policy": "least-load-fit"}));
    let a = t.launch(&member, &launch).await;
    t.wait_state(&member, &a, "ready").await;
    t.attach_one_and_wait(&member, &a, 2048, 3).await;
    let cgpus = t.admin_cgpus(&a).await;
    let hidden = support::cgpu_locations(&cgpus);
    let leaving = cgpus[1]["gpu"].as_str().unwrap().to_owned();
    let (status, moved) = t.post(&admin, &format!("/v1/gpus/{leaving}/evacuate"), &json!({})).await;
    assert_eq!((status, &moved["moved"]), (200, &json!(1)), "{moved}");
    t.detach_and_wait(&member, &a, 0, 2).await;
    t.terminate_and_wait(&member, &a).await;

    let received =
        inbox.wait_for(Duration::from_secs(20), |m| has_event(m, &a, "gpu.vm.delete.end")).await;
    let events = by_vm(&received).remove(&a).unwrap();
    assert_eq!(
        event_types(&events),
        [
            "gpu.vm.create.start",
            "gpu.vm.create.end",
            "gpu.cgpu.attach.end",
            "gpu.cgpu.rehome.end",
            "gpu.cgpu.detach.end",
            "gpu.vm.delete.start",
            "gpu.vm.delete.end",
        ],
        "{events:#?}"
    );
    for m in &events {
        let p = &m["payload"];
        assert_eq!(
            (p["project_id"].as_str(), p["vm_name"].as_str()),
            (Some("alpha"), Some("notified"))
        );
        assert_eq!(m["priority"], "INFO");
        assert!(m["publisher_id"].as_str().unwrap().starts_with("gsaas."), "{m}");
        assert!(m["timestamp"].as_str().unwrap().contains(' '), "oslo's timestamp form: {m}");
        let text = m.to_string();
        for secret in &hidden {
            assert!(!text.contains(secret.as_str()), "a notification names {secret}: {m}");
        }
    }
    let count = |i: usize| events[i]["payload"]["ncgpus"].as_u64();
    assert_eq!((count(1), count(2), count(4)), (Some(2), Some(3), Some(2)), "{events:#?}");
    assert_eq!(events[1]["payload"]["gpu_memory_mib"], 2048);
    assert_eq!(events[2]["payload"]["cgpu"]["memory_mib"], 2048, "the attached cGPU");
    assert_eq!(events[3]["payload"]["cgpu"]["index"], 1, "the re-homed cGPU");
    assert!(events[3]["payload"]["previous_model"].is_string());
    assert_eq!(events[4]["payload"]["cgpu"]["index"], 0, "the detached cGPU");
    let models: Vec<&Value> =
        events[1]["payload"]["cgpus"].as_array().unwrap().iter().map(|c| &c["model"]).collect();
    assert!(models.iter().all(|m| m.is_string()), "{events:#?}");

    // An outage: RabbitMQ stops while VMs launch and one is terminated; everything waits in the
    // outbox, and goes out once it is back.
    rabbit.stop().await;
    let b = t.launch(&member, &shared_launch(1, 512)).await;
    let c = t.launch(&t.token("beta", Role::Member), &shared_launch(1, 512)).await;
    t.wait_state(&member, &b, "ready").await;
    let (status, _) = t.delete(&member, &format!("/v1/vms/{b}")).await;
    assert_eq!(status, 202);
    t.wait_state(&member, &b, "deleted").await;
    t.wait_state(&admin, &c, "ready").await;
    assert!(waiting(&t).await >= 6, "the outbox keeps them meanwhile");
    rabbit.start_again().await;
    let inbox = rabbit.consume("notifications.info").await;
    let received = inbox
        .wait_for(Duration::from_secs(60), |m| {
            has_event(m, &b, "gpu.vm.delete.end") && has_event(m, &c, "gpu.vm.create.end")
        })
        .await;
    let vms = by_vm(&received);
    assert_eq!(
        event_types(&vms[&b]),
        ["gpu.vm.create.start", "gpu.vm.create.end", "gpu.vm.delete.start", "gpu.vm.delete.end"]
    );
    assert_eq!(event_types(&vms[&c]), ["gpu.vm.create.start", "gpu.vm.create.end"]);
    assert_eq!(vms[&c][0]["payload"]["project_id"], "beta");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while waiting(&t).await > 0 {
        assert!(std::time::Instant::now() < deadline, "the outbox empties once confirmed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Without `[notifications]` nothing is written: the outbox costs nothing where nobody publishes
/// (its triggers are off: disabled on PostgreSQL, dropped on SQLite).
async fn without_a_broker_nothing_is_written(store: Store) {
    let t = TestService::start(store).await;
    let member = t.member();
    let id = t.launch(&member, &shared_launch(1, 512)).await;
    t.wait_state(&member, &id, "ready").await;
    assert_eq!(waiting(&t).await, 0);
    use sqlx::Row;
    let off_query = match store {
        Store::Postgres => {
            "SELECT COUNT(*) FROM pg_trigger WHERE tgname LIKE '%notify%' AND tgenabled = 'D'"
        }
        // SQLite cannot disable a trigger: gsaasd dropped them.
        Store::Sqlite => {
            "SELECT 4 - COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND name LIKE '%notify%'"
        }
    };
    let conn = &mut *t.service().app.db.conn().await.unwrap();
    let off: i64 = sqlx::query(off_query).fetch_one(conn).await.unwrap().get(0);
    assert_eq!(off, 4, "the outbox's triggers are off");
}

/// A preemption: the queue takes a cGPU back from a best-effort VM for a higher-priority launch.
/// Its owner's metering hears `gpu.vm.preempt` and then the cGPU's release, and the cGPU stops
/// counting when the preemption begins, not when its detach ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemption_is_notified_and_stops_the_cgpus_count() {
    use sqlx::Row;
    let rabbit = Rabbit::start().await;
    let url = rabbit.transport_url();
    let t = TestService::start_with(Store::Sqlite, |c| {
        c.notifications.transport_url = Some(url.into());
        c.notifications.poll_ms = 20;
        c.quotas.max_priority = 100;
    })
    .await;
    let inbox = rabbit.consume("notifications.info").await;
    let (member, other) = (t.member(), t.token("beta", Role::Member));
    let best_effort = t.preempt_one_cgpu(&member, &other).await.best_effort;

    let received = inbox
        .wait_for(Duration::from_secs(20), |m| has_event(m, &best_effort, "gpu.cgpu.detach.end"))
        .await;
    let events = by_vm(&received).remove(&best_effort).unwrap();
    let kinds = event_types(&events);
    assert_eq!(
        kinds,
        ["gpu.vm.create.start", "gpu.vm.create.end", "gpu.vm.preempt", "gpu.cgpu.detach.end"],
        "{events:#?}"
    );
    let taken = &events[2]["payload"]["cgpu"];
    assert_eq!(events[3]["payload"]["cgpu"]["index"], taken["index"], "the one taken is released");
    assert_eq!(events[3]["payload"]["ncgpus"], 1);

    // The taken cGPU's span ended at the preemption (its state left `live`), before its release.
    t.service().app.fold_usage().await.unwrap();
    let mut conn = t.service().app.db.conn().await.unwrap();
    let spans = sqlx::query("SELECT end_ms FROM cgpu_usage WHERE vm = $1 AND idx = $2")
        .bind(&best_effort)
        .bind(taken["index"].as_i64().unwrap())
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    assert_eq!(spans.len(), 1);
    let ended: Option<i64> = spans[0].get(0);
    let preempted_at = events[2]["timestamp"].as_str().unwrap().to_owned();
    let released_at = events[3]["timestamp"].as_str().unwrap().to_owned();
    let ended = ended.expect("the taken cGPU stopped counting");
    assert_eq!(
        gsaasd::notifier::oslo_timestamp(ended),
        preempted_at,
        "it stopped counting in the preemption's own change"
    );
    assert!(preempted_at < released_at, "{preempted_at} {released_at}");
}
