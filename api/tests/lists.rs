//! Lists at cloud scale: VMs and the pool's hosts come in pages that continue by marker, with
//! filters; deleted VMs are left out unless asked for, and an operator purges them. On both
//! stores.

use crate::{on_both_stores, support};

use serde_json::Value;
use support::{shared_launch, Store, TestService};

on_both_stores!(
    vm_lists_page_by_marker_filter_and_leave_deleted_vms_out,
    vm_list_queries_are_checked_and_markers_do_not_cross_projects,
    admins_page_the_pool_per_host_and_members_see_totals_only,
    a_purge_removes_only_vms_deleted_before_its_cutoff
);

fn launch_named(name: &str) -> Value {
    let mut body = shared_launch(1, 256);
    body["name"] = Value::from(name);
    body
}

/// Launches VMs `vm-0`..`vm-{n-1}` (in that order) for `token`, each ready.
async fn ready_vms(t: &TestService, token: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = t.launch(token, &launch_named(&format!("vm-{i}"))).await;
        t.wait_state(token, &id, "ready").await;
        ids.push(id);
    }
    ids
}

fn ids(list: &Value) -> Vec<String> {
    list["vms"].as_array().unwrap().iter().map(|vm| vm["id"].as_str().unwrap().to_owned()).collect()
}

/// Every page from `first` on, following `next` links as given: the items under `key`, and the
/// number of pages.
async fn walk(t: &TestService, token: &str, first: &str, key: &str) -> (Vec<Value>, usize) {
    let (mut items, mut pages, mut path) = (Vec::new(), 0, Some(first.to_owned()));
    while let Some(page) = path.take() {
        let (status, body) = t.get(token, &page).await;
        assert_eq!(status, 200, "{page}: {body}");
        items.extend(body[key].as_array().cloned().unwrap_or_default());
        pages += 1;
        assert!(pages <= 100, "the pages do not end");
        path = body["next"].as_str().map(str::to_owned);
    }
    (items, pages)
}

async fn vm_lists_page_by_marker_filter_and_leave_deleted_vms_out(store: Store) {
    let t = TestService::start(store).await;
    let member = t.member();
    let vms = ready_vms(&t, &member, 5).await;
    for id in &vms[1..3] {
        assert_eq!(t.delete(&member, &format!("/v1/vms/{id}")).await.0, 202);
        t.wait_state(&member, id, "deleted").await;
    }
    let newest_first: Vec<String> = vms.iter().rev().cloned().collect();
    let live: Vec<String> =
        newest_first.iter().filter(|id| !vms[1..3].contains(id)).cloned().collect();

    let (status, list) = t.get(&member, "/v1/vms").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(ids(&list), live, "deleted VMs are left out, newest first");
    assert!(list.get("next").is_none(), "one page: {list}");
    let (_, all) = t.get(&member, "/v1/vms?deleted=true").await;
    assert_eq!(ids(&all), newest_first);

    // Pages of two, by following `next`: every VM once, in order, the filters kept.
    let (paged, pages) = walk(&t, &member, "/v1/vms?limit=2&deleted=true", "vms").await;
    let paged: Vec<String> = paged.iter().map(|vm| vm["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!((paged, pages), (newest_first.clone(), 3));
    let (paged, pages) = walk(&t, &member, "/v1/vms?limit=1&state=deleted", "vms").await;
    assert_eq!(pages, 2);
    assert!(paged.iter().all(|vm| vm["state"] == "deleted"), "{paged:?}");

    // A VM launched between pages comes before the marker: the walk neither repeats nor skips.
    let (_, first) = t.get(&member, "/v1/vms?limit=2").await;
    let next = first["next"].as_str().unwrap().to_owned();
    let newer = t.launch(&member, &launch_named("late")).await;
    let (_, second) = t.get(&member, &next).await;
    assert_eq!([ids(&first), ids(&second)].concat(), live);
    assert!(!ids(&second).contains(&newer));

    // Filters.
    t.wait_state(&member, &newer, "ready").await;
    let (_, ready) = t.get(&member, "/v1/vms?state=ready").await;
    assert_eq!(ids(&ready), [vec![newer.clone()], live].concat());
    let (_, named) = t.get(&member, "/v1/vms?name=vm-3").await;
    assert_eq!(ids(&named), [vms[3].clone()]);
    let (_, gone) = t.get(&member, "/v1/vms?name=vm-1").await;
    assert_eq!(ids(&gone), Vec::<String>::new(), "vm-1 is deleted");
    let (_, gone) = t.get(&member, "/v1/vms?name=vm-1&deleted=true").await;
    assert_eq!(ids(&gone), [vms[1].clone()]);

    // Another project sees none of them; an admin sees them by project.
    let other = t.token("other", gsaasd::auth::Role::Member);
    let (_, theirs) = t.get(&other, "/v1/vms?deleted=true").await;
    assert_eq!(ids(&theirs), Vec::<String>::new());
    let (_, admin) = t.get(&t.admin(), "/v1/vms?project=alpha&deleted=true&limit=1000").await;
    let mut expected = vec![newer];
    expected.extend(newest_first);
    assert_eq!(ids(&admin), expected);
}

async fn vm_list_queries_are_checked_and_markers_do_not_cross_projects(store: Store) {
    let t = TestService::start(store).await;
    let member = t.member();
    let mine = ready_vms(&t, &member, 1).await;
    let other = t.token("other", gsaasd::auth::Role::Member);

    let (status, problem) = t.get(&member, "/v1/vms?limit=0&marker=nope").await;
    assert_eq!(status, 422, "{problem}");
    let fields = support::fields_at_fault(&problem);
    assert_eq!(fields, ["limit", "marker"], "every field at once: {problem}");
    for (query, field) in [
        ("limit=1001", "limit"),
        ("limit=-1", "query"),
        ("state=sleeping", "query"),
        ("deleted=maybe", "query"),
        ("colour=red", "query"),
        ("name=%07", "name"),
    ] {
        let (status, problem) = t.get(&member, &format!("/v1/vms?{query}")).await;
        assert_eq!((status, problem["field"].as_str()), (422, Some(field)), "{query}: {problem}");
    }
    // Another project's VM is no marker: refused as if it did not exist, naming nothing of it.
    let (status, problem) = t.get(&other, &format!("/v1/vms?marker={}", mine[0])).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("marker")), "{problem}");
    let unknown = uuid::Uuid::new_v4().to_string();
    let (_, unknown_problem) = t.get(&other, &format!("/v1/vms?marker={unknown}")).await;
    let detail = |p: &Value, id: &str| p["detail"].as_str().unwrap().replace(id, "ID");
    assert_eq!(detail(&problem, &mine[0]), detail(&unknown_problem, &unknown));
    let (status, _) = t.get(&member, &format!("/v1/vms?marker={}", mine[0])).await;
    assert_eq!(status, 200);
}

async fn admins_page_the_pool_per_host_and_members_see_totals_only(store: Store) {
    let t = TestService::start(store).await;
    let (admin, member) = (t.admin(), t.member());
    let vm = ready_vms(&t, &member, 1).await.remove(0);

    let (status, whole) = t.get(&admin, "/v1/pool?limit=1000").await;
    assert_eq!(status, 200, "{whole}");
    let hosts = whole["hosts"].as_array().unwrap().clone();
    assert!(hosts.len() >= 2 && whole.get("next").is_none(), "{whole}");
    let (paged, pages) = walk(&t, &admin, "/v1/pool?limit=1", "hosts").await;
    assert_eq!((paged, pages), (hosts.clone(), hosts.len()), "one host a page, all of them");
    let holders: Vec<&Value> = hosts
        .iter()
        .flat_map(|h| h["gpus"].as_array().unwrap())
        .filter(|g| g["vms"].get(&vm).is_some())
        .collect();
    assert_eq!(holders.len(), 1, "the VM's one cGPU shows on its GPU: {hosts:?}");
    assert_eq!(holders[0]["vms"][&vm], 1);

    let (_, first) = t.get(&admin, "/v1/pool?limit=1").await;
    assert_eq!(first["totals"], whole["totals"], "every page has the whole pool's totals");
    let (_, totals) = t.get(&member, "/v1/pool?limit=1").await;
    assert_eq!(totals["totals"], whole["totals"]);
    assert!(totals.get("hosts").is_none() && totals.get("next").is_none(), "{totals}");
    assert_eq!(totals["totals"]["cgpus"], 1);

    for query in ["limit=0", "limit=1001", "marker=no-such-host", "marker=bad%20name", "x=1"] {
        let (status, problem) = t.get(&admin, &format!("/v1/pool?{query}")).await;
        assert_eq!(status, 422, "{query}: {problem}");
    }
}

async fn a_purge_removes_only_vms_deleted_before_its_cutoff(store: Store) {
    let t = TestService::start(store).await;
    let member = t.member();
    let vms = ready_vms(&t, &member, 3).await;
    for id in &vms[..2] {
        assert_eq!(t.delete(&member, &format!("/v1/vms/{id}")).await.0, 202);
        t.wait_state(&member, id, "deleted").await;
    }
    let (ok, out, err) = t.gsaasd(&["db", "purge", "--older-than", "1h"]);
    assert!(ok, "{err}");
    assert_eq!(out, "purged 0 deleted VMs", "none is an hour old");
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let (ok, out, err) = t.gsaasd(&["db", "purge", "--older-than", "0s", "--dry-run"]);
    assert_eq!((ok, out.as_str()), (true, "would purge 2 deleted VMs"), "{err}");
    let (_, before) = t.get(&member, "/v1/vms?deleted=true").await;
    assert_eq!(ids(&before).len(), 3, "a dry run deletes nothing");
    let (ok, out, err) = t.gsaasd(&["db", "purge", "--older-than", "0s", "--batch", "1"]);
    assert_eq!((ok, out.as_str()), (true, "purged 2 deleted VMs"), "{err}");

    let (_, after) = t.get(&member, "/v1/vms?deleted=true").await;
    assert_eq!(ids(&after), [vms[2].clone()], "the live VM stays");
    for id in &vms[..2] {
        assert_eq!(t.get(&member, &format!("/v1/vms/{id}")).await.0, 404);
    }
    for bad in ["30", "30x", "-1d", "99999999999999d"] {
        let (ok, _, err) = t.gsaasd(&["db", "purge", "--older-than", bad]);
        assert!(!ok && err.contains("--older-than"), "{bad}: {err}");
    }
}
