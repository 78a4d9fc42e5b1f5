//! Cohorts (issue [5/5]): admins put projects in a cohort on their terms; a project that asks to
//! borrow runs past its quota on what the others leave unused, within its borrowing limit and
//! their lending limits; its cGPUs past the quota say `borrowed`; a lender keeps its whole
//! guarantee; tenants can neither set cohorts nor read them; bad input changes nothing; on both
//! stores, and the ledger a restarted replica loads holds the same loans.

use crate::{on_both_stores, support};

use gsaasd::auth::Role;
use serde_json::{json, Value};
use support::{shared_launch, shared_launch_with, Store, TestService};

on_both_stores!(a_project_borrows_what_its_cohort_leaves_unused_and_its_loans_are_marked);
on_both_stores!(cohorts_are_the_operators_and_bad_terms_change_nothing);
on_both_stores!(a_lender_within_its_quota_takes_back_the_youngest_loan_by_shrinking);
on_both_stores!(a_loan_back_within_its_projects_quota_loses_its_mark);
on_both_stores!(admins_changing_one_cohort_at_once_never_undo_each_other);

/// Waits until the VM has `n` cGPUs, all live.
async fn wait_live(t: &TestService, token: &str, vm: &str, n: usize) -> Value {
    t.wait_vm(token, vm, |v| {
        let cgpus = v["cgpus"].as_array().unwrap();
        cgpus.len() == n && cgpus.iter().all(|c| c["state"] == "live")
    })
    .await
}

/// A launch of `ncgpus` whole GPUs, with `extra` fields.
fn exclusive(ncgpus: u32, extra: Value) -> Value {
    let mut body = shared_launch_with(ncgpus, 0, extra);
    body["mode"] = json!("exclusive");
    body["gpu_memory_mib"] = Value::Null;
    body
}

/// Which of the VM's cGPUs (by index) are borrowed.
fn borrowed(vm: &Value) -> Vec<bool> {
    let cgpus = vm["cgpus"].as_array().expect("cgpus");
    cgpus.iter().map(|c| c["borrowed"].as_bool().expect("borrowed is a bool")).collect()
}

fn refusal(problem: &Value) -> (u64, u64, u64, Option<&str>) {
    let q = &problem["quota"];
    let n = |k: &str| q[k].as_u64().unwrap_or(u64::MAX);
    (n("limit"), n("in_use"), n("requested"), q["cohort"].as_str())
}

async fn a_project_borrows_what_its_cohort_leaves_unused_and_its_loans_are_marked(store: Store) {
    let mut t = TestService::start(store).await;
    let (admin, alpha) = (t.admin(), t.member());
    let beta = t.token("beta", Role::Member);
    for (project, cgpus) in [("alpha", 2), ("beta", 4)] {
        let (status, _) =
            t.put(&admin, &format!("/v1/quotas/{project}"), &json!({"cgpus": cgpus})).await;
        assert_eq!(status, 200);
    }
    let lab = json!({"members": {
        "alpha": {"borrowing_limit": {"cgpus": 3}},
        "beta": {"lending_limit": {"cgpus": 2}},
    }});
    let (status, cohort) = t.put(&admin, "/v1/cohorts/lab", &lab).await;
    assert_eq!(status, 200, "{cohort}");
    assert_eq!(cohort["lendable"]["cgpus"], 4, "alpha's 2 unused and beta's 2 lent: {cohort}");
    assert_eq!(cohort["members"]["beta"]["terms"]["lending_limit"]["cgpus"], 2, "{cohort}");

    // Past the quota without asking to borrow: refused as before, naming no cohort.
    let (status, problem) = t.post(&alpha, "/v1/vms", &shared_launch(3, 1024)).await;
    assert_eq!((status, refusal(&problem)), (403, (2, 0, 3, None)), "{problem}");
    // Asking: admitted, the third cGPU on loan.
    let vm = t.launch(&alpha, &shared_launch_with(3, 1024, json!({"borrow": true}))).await;
    let ready = t.wait_state(&alpha, &vm, "ready").await;
    assert_eq!(borrowed(&ready), [false, false, true], "{ready}");
    let (_, quota) = t.get(&alpha, "/v1/quotas/alpha").await;
    assert_eq!((quota["cohort"].as_str(), &quota["borrowed"]["cgpus"]), (Some("lab"), &json!(1)));

    // Two more would be 3 past the quota: beta lends only 2 (limit 2 + 2).
    let attach =
        |n: u32| json!({"ncgpus": n, "gpu_memory_mib": 1024, "mode": "shared", "borrow": true});
    let path = format!("/v1/vms/{vm}/cgpus");
    let (status, problem) = t.post(&alpha, &path, &attach(2)).await;
    assert_eq!((status, refusal(&problem)), (403, (4, 3, 2, Some("lab"))), "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("cohort lab"), "{problem}");
    let (status, _) = t.post(&alpha, &path, &attach(1)).await;
    assert_eq!(status, 202);
    let vm_now = wait_live(&t, &alpha, &vm, 4).await;
    assert_eq!(borrowed(&vm_now), [false, false, true, true], "{vm_now}");
    let (_, list) = t.get(&alpha, "/v1/vms").await;
    let listed = list["vms"].as_array().unwrap().iter().find(|v| v["id"] == vm.as_str()).unwrap();
    assert_eq!(borrowed(listed), [false, false, true, true], "{listed}");

    // Beta's guarantee is whole, loans or not: its 4 cGPUs are its own.
    let beta_vm = t.launch(&beta, &shared_launch(4, 1024)).await;
    let beta_ready = t.wait_state(&beta, &beta_vm, "ready").await;
    assert_eq!(borrowed(&beta_ready), [false; 4], "{beta_ready}");
    // Now nobody lends: alpha borrows nothing more.
    let (status, problem) = t.post(&alpha, &path, &attach(1)).await;
    assert_eq!((status, refusal(&problem)), (403, (2, 4, 1, Some("lab"))), "{problem}");
    let (_, cohort) = t.get(&admin, "/v1/cohorts/lab").await;
    assert_eq!(
        (&cohort["borrowed"]["cgpus"], &cohort["lendable"]["cgpus"]),
        (&json!(2), &json!(0))
    );
    assert_eq!(cohort["members"]["alpha"]["borrowed"]["cgpus"], 2, "{cohort}");

    // Tenants see their own cGPUs' marks, never the cohort's members.
    for token in [&alpha, &beta] {
        for path in ["/v1/cohorts", "/v1/cohorts/lab"] {
            let (status, body) = t.get(token, path).await;
            assert!(matches!(status, 403 | 404), "{path}: {status} {body}");
        }
    }

    // A restarted service loads the same loans and terms: alpha still may not borrow more.
    t.restart().await;
    let (status, problem) = t.post(&alpha, &path, &attach(1)).await;
    assert_eq!((status, refusal(&problem).3), (403, Some("lab")), "{problem}");
    let (_, vm_after) = t.get(&alpha, &format!("/v1/vms/{vm}")).await;
    assert_eq!(borrowed(&vm_after), [false, false, true, true], "{vm_after}");
    let (status, _) = t.delete(&beta, &format!("/v1/vms/{beta_vm}")).await;
    assert_eq!(status, 202);
    t.wait_state(&beta, &beta_vm, "deleted").await;
    // Beta's VM gone, it still lends at most 2; lending 3, alpha's next cGPU is on loan too.
    let (status, problem) = t.post(&alpha, &path, &attach(1)).await;
    assert_eq!((status, refusal(&problem)), (403, (4, 4, 1, Some("lab"))), "{problem}");
    let more = json!({"members": {
        "alpha": {"borrowing_limit": {"cgpus": 3}},
        "beta": {"lending_limit": {"cgpus": 3}},
    }});
    let (status, _) = t.put(&admin, "/v1/cohorts/lab", &more).await;
    assert_eq!(status, 200);
    let (status, _) = t.post(&alpha, &path, &attach(1)).await;
    assert_eq!(status, 202, "beta lends 3");

    // The cohort ended: alpha keeps what it holds and borrows no more.
    let (status, _) = t.delete(&admin, "/v1/cohorts/lab").await;
    assert_eq!(status, 204);
    let (status, _) = t.get(&admin, "/v1/cohorts/lab").await;
    assert_eq!(status, 404);
    let (_, quota) = t.get(&alpha, "/v1/quotas/alpha").await;
    assert_eq!(
        (&quota["cohort"], &quota["borrowed"]["cgpus"]),
        (&Value::Null, &json!(3)),
        "{quota}"
    );
    wait_live(&t, &alpha, &vm, 5).await;
    let (status, problem) = t.post(&alpha, &path, &attach(1)).await;
    assert_eq!((status, refusal(&problem).3), (403, None), "{problem}");
}

async fn cohorts_are_the_operators_and_bad_terms_change_nothing(store: Store) {
    let t = TestService::start(store).await;
    let (admin, alpha) = (t.admin(), t.member());
    let lab = json!({"members": {"alpha": {}, "beta": {"borrow_by_default": true}}});
    for (method, token) in [("put", &alpha), ("delete", &alpha)] {
        let (status, body) = match method {
            "put" => t.put(token, "/v1/cohorts/lab", &lab).await,
            _ => t.delete(token, "/v1/cohorts/lab").await,
        };
        assert!(matches!(status, 403 | 404), "a tenant's {method}: {status} {body}");
    }
    let (status, cohort) = t.put(&admin, "/v1/cohorts/lab", &lab).await;
    assert_eq!(status, 200, "{cohort}");
    assert_eq!(cohort["members"]["beta"]["terms"]["borrow_by_default"], true);

    for (path, body, field) in [
        ("/v1/cohorts/lab", json!({"members": {}}), "members"),
        ("/v1/cohorts/lab", json!({"members": {"bad name": {}}}), "members.bad name"),
        (
            "/v1/cohorts/lab",
            json!({"members": {"alpha": {"lending_limit": {"cgpus": 1u64 << 60}}}}),
            "members.alpha.lending_limit.cgpus",
        ),
        ("/v1/cohorts/lab", json!({"members": {"alpha": {"borrow": true}}}), "members"),
        (
            "/v1/cohorts/lab",
            json!({"members": {"alpha": {"borrowing_limit": {"cgpus": -1}}}}),
            "members",
        ),
        ("/v1/cohorts/bad%20name", lab.clone(), "name"),
    ] {
        let (status, problem) = t.put(&admin, path, &body).await;
        assert!(matches!(status, 400 | 422), "{body}: {status} {problem}");
        let named = problem["field"].as_str().unwrap_or_default();
        assert!(named.starts_with(field), "{body}: {problem}");
    }
    // A project is in one cohort: another claiming it is a conflict.
    let (status, problem) =
        t.put(&admin, "/v1/cohorts/other", &json!({"members": {"alpha": {}}})).await;
    assert_eq!(status, 409, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("cohort lab"), "{problem}");
    let (status, _) = t.get(&admin, "/v1/cohorts/other").await;
    assert_eq!(status, 404);
    let (_, list) = t.get(&admin, "/v1/cohorts").await;
    let names: Vec<&str> =
        list["cohorts"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["lab"]);
    let (_, cohort) = t.get(&admin, "/v1/cohorts/lab").await;
    assert_eq!(cohort["members"].as_object().unwrap().len(), 2, "{cohort}");
    let (status, _) = t.delete(&admin, "/v1/cohorts/nothing").await;
    assert_eq!(status, 404);
}

async fn a_lender_within_its_quota_takes_back_the_youngest_loan_by_shrinking(store: Store) {
    let t = TestService::start(store).await;
    let (admin, alpha) = (t.admin(), t.member());
    let beta = t.token("beta", Role::Member);
    for (project, gpus) in [("alpha", 1), ("beta", 3)] {
        let limits = json!({"exclusive_gpus": gpus});
        let (status, _) = t.put(&admin, &format!("/v1/quotas/{project}"), &limits).await;
        assert_eq!(status, 200);
    }
    let lab = json!({"members": {"alpha": {"borrow_by_default": true}, "beta": {}}});
    assert_eq!(t.put(&admin, "/v1/cohorts/lab", &lab).await.0, 200);
    // Alpha takes 3 of the 4 GPUs (2 on loan, by its default), beta the fourth.
    let loaned = t.launch(&alpha, &exclusive(3, json!({}))).await;
    let ready = t.wait_state(&alpha, &loaned, "ready").await;
    assert_eq!(borrowed(&ready), [false, true, true], "{ready}");
    let first = t.launch(&beta, &exclusive(1, json!({}))).await;
    t.wait_state(&beta, &first, "ready").await;
    // Beta, within its quota, needs a GPU: the youngest loan (alpha's last cGPU) is taken back,
    // the VM keeps the others.
    let second = t.launch(&beta, &exclusive(1, json!({"queue": true}))).await;
    let served = t.wait_state(&beta, &second, "ready").await;
    assert_eq!(borrowed(&served), [false], "{served}");
    let shrunk = wait_live(&t, &alpha, &loaned, 2).await;
    let indexes: Vec<u64> =
        shrunk["cgpus"].as_array().unwrap().iter().map(|c| c["index"].as_u64().unwrap()).collect();
    assert_eq!((indexes, borrowed(&shrunk)), (vec![0, 1], vec![false, true]), "{shrunk}");
    let kinds: Vec<&str> =
        shrunk["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"loan_reclaimed"), "{shrunk}");
    // What was taken back waits to be given back, on loan, and takes nothing of beta's.
    assert_eq!(shrunk["queued_attaches"].as_array().map(Vec::len), Some(1), "{shrunk}");
    let (_, quota) = t.get(&alpha, "/v1/quotas/alpha").await;
    assert_eq!(quota["borrowed"]["exclusive_gpus"], 1, "{quota}");
    // Beta within its quota again: nothing of alpha's own is ever taken.
    let third = t.launch(&beta, &exclusive(1, json!({"queue": true}))).await;
    let (_, vm) = t.get(&beta, &format!("/v1/vms/{third}")).await;
    assert_eq!(vm["state"], "queued", "{vm}");
    let (status, _) = t.delete(&beta, &format!("/v1/vms/{third}")).await;
    assert_eq!(status, 202);
    // Beta's first VM ends: alpha's loan comes back through the queue.
    assert_eq!(t.delete(&beta, &format!("/v1/vms/{first}")).await.0, 202);
    let back = wait_live(&t, &alpha, &loaned, 3).await;
    assert_eq!(borrowed(&back), [false, true, true], "{back}");
}

/// Two replicas on one PostgreSQL, each booking from its own ledger, racing borrowers: the loans
/// never pass what the lender lends, and the lender's guarantee is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_racing_cannot_borrow_past_what_the_cohort_lends() {
    let (a, b) = TestService::two_replicas().await;
    let admin = a.admin();
    for (project, cgpus) in [("alpha", 2), ("beta", 4)] {
        let limits = json!({"cgpus": cgpus});
        assert_eq!(a.put(&admin, &format!("/v1/quotas/{project}"), &limits).await.0, 200);
    }
    let lab = json!({"members": {"alpha": {}, "beta": {"lending_limit": {"cgpus": 3}}}});
    assert_eq!(a.put(&admin, "/v1/cohorts/lab", &lab).await.0, 200);
    let (alpha, beta) = (a.member(), a.token("beta", Role::Member));
    let launch = shared_launch_with(1, 256, json!({"borrow": true}));
    let launches = (0..24).map(|i| {
        let replica = if i % 2 == 0 { &a } else { &b };
        let (token, launch) = (alpha.clone(), launch.clone());
        async move { replica.post(&token, "/v1/vms", &launch).await }
    });
    let results = support::join_all(launches).await;
    let statuses: Vec<u16> = results.iter().map(|(s, _)| *s).collect();
    let accepted = support::accepted_ids(&results);
    assert_eq!(accepted.len(), 5, "2 guaranteed and 3 lent: {statuses:?}");
    for (status, problem) in results.iter().filter(|(s, _)| *s != 202) {
        assert_eq!((*status, problem["quota"]["cohort"].as_str()), (403, Some("lab")), "{problem}");
    }
    let mut loans = 0;
    for id in &accepted {
        let vm = a.wait_state(&alpha, id, "ready").await;
        loans += borrowed(&vm).iter().filter(|b| **b).count();
    }
    assert_eq!(loans, 3);
    // The lender's whole quota is its own, on either replica.
    let mine = (0..4).map(|i| {
        let replica = if i % 2 == 0 { &a } else { &b };
        let token = beta.clone();
        async move { replica.post(&token, "/v1/vms", &shared_launch(1, 256)).await }
    });
    let results = support::join_all(mine).await;
    assert_eq!(support::accepted_ids(&results).len(), 4, "{results:?}");
    for replica in [&a, &b] {
        let (_, cohort) = replica.get(&admin, "/v1/cohorts/lab").await;
        assert_eq!(cohort["borrowed"]["cgpus"], 3, "{cohort}");
        assert_eq!(cohort["members"]["beta"]["lendable"]["cgpus"], 0, "{cohort}");
    }
}

async fn a_loan_back_within_its_projects_quota_loses_its_mark(store: Store) {
    let t = TestService::start(store).await;
    let (admin, alpha) = (t.admin(), t.member());
    for (project, gpus) in [("alpha", 1), ("beta", 3)] {
        let limits = json!({"exclusive_gpus": gpus});
        assert_eq!(t.put(&admin, &format!("/v1/quotas/{project}"), &limits).await.0, 200);
    }
    let lab = json!({"members": {"alpha": {}, "beta": {}}});
    assert_eq!(t.put(&admin, "/v1/cohorts/lab", &lab).await.0, 200);
    let own = t.launch(&alpha, &exclusive(1, json!({}))).await;
    t.wait_state(&alpha, &own, "ready").await;
    let loan = t.launch(&alpha, &exclusive(1, json!({"borrow": true}))).await;
    assert_eq!(borrowed(&t.wait_state(&alpha, &loan, "ready").await), [true]);
    let activate = "/v1/background-tasks/loan_marks/activate";
    let (status, ran) = t.post(&admin, activate, &json!({})).await;
    assert_eq!((status, &ran["last_report"]["settled"]), (200, &json!(0)), "{ran}");
    // Alpha's own VM ends: its loan is within its quota now, its own, and says so.
    assert_eq!(t.delete(&alpha, &format!("/v1/vms/{own}")).await.0, 202);
    t.wait_state(&alpha, &own, "deleted").await;
    let (status, ran) = t.post(&admin, activate, &json!({})).await;
    assert_eq!((status, &ran["last_report"]["settled"]), (200, &json!(1)), "{ran}");
    let (_, vm) = t.get(&alpha, &format!("/v1/vms/{loan}")).await;
    assert_eq!(borrowed(&vm), [false], "{vm}");
    let (_, quota) = t.get(&alpha, "/v1/quotas/alpha").await;
    assert_eq!(quota["borrowed"]["exclusive_gpus"], 0, "{quota}");
}

/// A cohort's `PUT` or `DELETE` with `If-Match` (its version, as its `ETag` and view say it)
/// happens only if nobody changed it since: otherwise 409 `version_conflict` and nothing changes.
/// Eight admins that each add a member at once, each reading, changing and writing back (again on
/// such a 409), leave all
/// eight in the cohort: none undoes another. Without `If-Match` a change is made as before.
async fn admins_changing_one_cohort_at_once_never_undo_each_other(store: Store) {
    let t = TestService::start(store).await;
    let admin = t.admin();
    let path = "/v1/cohorts/lab";
    let send = |method: reqwest::Method, body: Option<Value>, if_match: Option<&str>| {
        let mut request = t.http.request(method, t.url(path)).bearer_auth(&admin);
        if let Some(body) = body {
            request = request.json(&body);
        }
        if let Some(tag) = if_match {
            request = request.header("If-Match", tag);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let etag = response.headers().get("etag").map(|v| v.to_str().unwrap().to_owned());
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (status, etag, body)
        }
    };
    let members = |names: &[&str]| {
        let members: serde_json::Map<String, Value> =
            names.iter().map(|n| ((*n).to_owned(), json!({}))).collect();
        json!({ "members": members })
    };
    // Made without If-Match; its ETag is its version, quoted.
    let (status, created, body) = send(reqwest::Method::PUT, Some(members(&["alpha"])), None).await;
    assert_eq!(status, 200, "{body}");
    let first = created.expect("an ETag");
    assert_eq!(first, format!("\"{}\"", body["version"].as_str().unwrap()));
    let (_, read, body) = send(reqwest::Method::GET, None, None).await;
    assert_eq!(read.as_deref(), Some(first.as_str()), "{body}");

    // One admin adds beta as read; another, who read before that, cannot put gamma in.
    let (status, second, _) =
        send(reqwest::Method::PUT, Some(members(&["alpha", "beta"])), Some(&first)).await;
    assert_eq!(status, 200);
    let second = second.expect("an ETag");
    assert_ne!(second, first);
    let (status, _, problem) =
        send(reqwest::Method::PUT, Some(members(&["alpha", "gamma"])), Some(&first)).await;
    assert_eq!((status, problem["code"].as_str()), (409, Some("version_conflict")), "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("changed since it was read"), "{problem}");
    let (status, _, problem) = send(reqwest::Method::DELETE, None, Some(&first)).await;
    assert_eq!((status, problem["code"].as_str()), (409, Some("version_conflict")), "{problem}");
    let (_, now, body) = send(reqwest::Method::GET, None, None).await;
    assert_eq!(now.as_deref(), Some(second.as_str()));
    let names: Vec<&String> = body["members"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["alpha", "beta"], "nothing changed: {body}");
    // Malformed: 400 naming the header, nothing changed; `*` matches any version.
    let (status, _, problem) =
        send(reqwest::Method::PUT, Some(members(&["delta"])), Some("abc")).await;
    assert_eq!((status, problem["errors"][0]["field"].as_str()), (400, Some("If-Match")));
    let (status, _, _) =
        send(reqwest::Method::PUT, Some(members(&["alpha", "beta"])), Some("*")).await;
    assert_eq!(status, 200);

    // Eight admins, each adding its project as it reads the cohort, at once.
    let projects: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    let adds = projects.iter().map(|project| {
        let send = &send;
        async move {
            for _ in 0..50 {
                let (_, tag, body) = send(reqwest::Method::GET, None, None).await;
                let mut view = body["members"].as_object().unwrap().clone();
                let terms: serde_json::Map<String, Value> = view
                    .iter_mut()
                    .map(|(p, m)| (p.clone(), m["terms"].take()))
                    .chain([(project.clone(), json!({}))])
                    .collect();
                let request = json!({ "members": terms });
                let (status, _, body) =
                    send(reqwest::Method::PUT, Some(request), tag.as_deref()).await;
                match status {
                    200 => return,
                    409 if body["code"] == "version_conflict" => continue,
                    _ => panic!("{status}: {body}"),
                }
            }
            panic!("{project} never got in");
        }
    });
    support::join_all(adds).await;
    let (_, _, body) = send(reqwest::Method::GET, None, None).await;
    let names: Vec<&String> = body["members"].as_object().unwrap().keys().collect();
    let mut expected: Vec<&str> = vec!["alpha", "beta"];
    expected.extend(projects.iter().map(String::as_str));
    expected.sort_unstable();
    assert_eq!(names, expected, "no admin undid another's: {body}");

    // A cohort ended meanwhile: a version conflict (it no longer exists); the current version
    // ends it.
    let (_, current, _) = send(reqwest::Method::GET, None, None).await;
    let (status, _, _) = send(reqwest::Method::DELETE, None, current.as_deref()).await;
    assert_eq!(status, 204);
    let (status, _, problem) =
        send(reqwest::Method::PUT, Some(members(&["alpha"])), current.as_deref()).await;
    assert_eq!((status, problem["code"].as_str()), (409, Some("version_conflict")), "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("no longer exists"), "{problem}");
    let (status, _, _) = send(reqwest::Method::GET, None, None).await;
    assert_eq!(status, 404);
    // A tenant learns nothing new from the header: refused as before, no version conflict.
    let tenant = t.member();
    let response = t
        .http
        .put(t.url(path))
        .bearer_auth(&tenant)
        .header("If-Match", "\"0\"")
        .json(&members(&["alpha"]))
        .send()
        .await
        .unwrap();
    assert!(matches!(response.status().as_u16(), 403 | 404), "{}", response.status());
}
