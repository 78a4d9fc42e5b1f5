//! The OpenAPI document: what utoipa derives from the handlers and types, then made to state
//! everything gsaasd enforces, so that a client (or a generated one) can check a request before
//! sending it and expect only the answers listed.
//!
//! Two things are added here rather than at each handler, so that no handler can forget them:
//! - the answers every operation of a kind can give (401 for every secured one, 400, 408, 413 and
//!   422 for every one with a body or checked parameters, 404 for every one with a path
//!   parameter, 503 when a
//!   dependency is down), all problem documents as `application/problem+json`;
//! - the constraints of request fields, from the same constants the checks use (see
//!   [`crate::app::fields`]).
//!
//! What no schema can say is left to the service and documented as 422: whether a list's marker
//! names a VM or host the caller may continue after, whether an image, flavor or network exists
//! in the cloud, whether any GPU of the pool is large enough, and whether a host's report agrees
//! with its path and its own GPU ids.

use serde_json::{json, Value};
use utoipa::OpenApi;

use super::tasks::{BackgroundTaskList, BackgroundTaskView, TaskOutcome};
use super::views::*;
use crate::app::fields::TEXT_PATTERN;
use crate::error::{FieldError, Problem};

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut http = Http::new(HttpAuthScheme::Bearer);
        http.bearer_format = Some("JWT".into());
        components.add_security_scheme("bearer", SecurityScheme::Http(http));
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "GSaaS", description = "GPU scheduling as a service: cGPU-enabled VMs for OpenStack."),
    paths(super::launch_vm, super::lists::list_vms, super::get_vm, super::terminate_vm, super::get_queue,
        super::elastic::attach_cgpus, super::elastic::detach_cgpu,
        super::quotas::list_quotas, super::quotas::get_quota, super::quotas::put_quota,
        super::quotas::delete_quota, super::cohorts::list_cohorts, super::cohorts::get_cohort,
        super::cohorts::put_cohort, super::cohorts::delete_cohort, super::usage::usage, super::usage::project_usage,
        super::lists::get_pool, super::list_hosts, super::register_host,
        super::renew_agent_token, super::rtt_targets, super::drain_host, super::undrain_host,
        super::failures::forget_host, super::failures::evacuate_host, super::failures::list_fences,
        super::failures::evacuate_gpu, super::taint_gpu, super::untaint_gpu,
        super::tasks::list_tasks, super::tasks::activate_task, super::healthz,
        super::healthcheck::healthcheck, super::readyz, super::metrics, super::openapi_json,
        super::sessions::auth_methods, super::sessions::sign_in, super::sessions::projects,
        super::sessions::sign_out, super::versions::root, super::versions::version_v1),
    components(schemas(Problem, FieldError, QuotaProblem, QuotaView,
        QuotaList, QuotaLimits, QuotaUsage, ModelQuotaUsage, CohortRequest, CohortMemberTerms,
        CohortView, CohortMemberView, CohortList, LaunchRequest, AttachRequest,
        CgpuState, VmView, VmList, CgpuView, VmEventView, WaitingView, QueueView,
        QueueLengthView, QueuedRequestView, GpuRequestView, PoolView, PoolTotals, PoolHostView,
        FragmentationView,
        GpuView, HostView, HostAlertView, HostList, EvacuationView, FenceView,
        FenceList, TaintRequest, GpuTaintView, AgentToken, HostReportBody, GpuReportBody, LocalVmsView, ResourcesBody,
        RcudaBody, RttTargetsBody, RttTargetBody, Health, Readiness, ModeParam, LocalityParam,
        NetworkParam, StrengthParam, Timings,
        ReconcilerStatus, BackgroundTaskList, BackgroundTaskView, TaskOutcome,
        crate::model::VmState, AuthMethods, SignInRequest, PasswordSignIn,
        ApplicationCredentialSignIn, ProjectParam, SessionView, NamedView, ProjectList,
        ApiVersions, ApiVersionDocument, ApiVersion, Link, UsageReport, UsageTotals, ModelUsage,
        ProjectUsage, VmUsage, UsageSeries, UsageLine)),
    modifiers(&BearerAuth),
)]
struct ApiDoc;

/// The OpenAPI document, pretty-printed, as checked in at `openapi/gsaas.json`.
pub fn openapi_document() -> String {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").into();
    let mut doc = serde_json::to_value(&doc).expect("the OpenAPI document serializes");
    constrain_request_fields(&mut doc);
    add_links(&mut doc);
    add_common_responses(&mut doc);
    problems_as_problem_json(&mut doc);
    let mut text = serde_json::to_string_pretty(&doc).expect("the OpenAPI document serializes");
    text.push('\n');
    text
}

const PROBLEM: &str = "#/components/schemas/Problem";
const PROBLEM_JSON: &str = "application/problem+json";

fn problem_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": { PROBLEM_JSON: { "schema": { "$ref": PROBLEM } } }
    })
}

/// The answers every operation of a kind can give, where its handler does not list them.
fn add_common_responses(doc: &mut Value) {
    let Some(paths) = doc["paths"].as_object_mut() else { return };
    for (path, item) in paths.iter_mut() {
        let Some(operations) = item.as_object_mut() else { continue };
        for (method, operation) in operations.iter_mut() {
            let params = operation["parameters"].as_array().cloned().unwrap_or_default();
            let has = |kind: &str| params.iter().any(|p| p["in"] == kind);
            let secured = operation.get("security").is_some();
            let body = operation.get("requestBody").is_some();
            let mut common: Vec<(&str, &str)> = Vec::new();
            if body {
                common.push(("400", "Malformed request: the body is not JSON"));
                common.push(("408", "The body did not arrive within `http.body_timeout_secs`"));
                common.push(("413", "The body is larger than 256 KiB"));
            }
            let constrained_path =
                params.iter().any(|p| p["in"] == "path" && p["schema"].get("pattern").is_some());
            if body || has("query") || has("header") || constrained_path {
                common.push(("422", "Invalid fields; `errors` lists every one"));
            }
            if secured {
                common.push(("401", "No token, or one that is malformed, expired or revoked"));
                common.push(("429", "Too many token validations (Keystone mode)"));
            }
            if has("path") {
                common.push(("404", "Not found, or not the caller's to see"));
            }
            // `/metrics` counts VMs and fences in the database too.
            if path.starts_with("/v1/") || path == "/metrics" {
                common.push(("503", "A dependency (the database, the cloud) is unavailable"));
            }
            let Some(responses) = operation["responses"].as_object_mut() else { continue };
            for (status, description) in common {
                responses.entry(status).or_insert_with(|| problem_response(description));
            }
            if let Some(rule) = policy_rule(method, path) {
                let refused =
                    format!("The policy does not allow it (`policy_not_allowed`): rule `{rule}`");
                match responses.get_mut("403") {
                    Some(response) => {
                        let described = response["description"].as_str().unwrap_or_default();
                        let refused = refused.replacen("The", "the", 1);
                        response["description"] = json!(format!("{described}; or {refused}"));
                    }
                    None => {
                        responses.insert("403".to_owned(), problem_response(&refused));
                    }
                }
            }
        }
    }
}

/// The policy rule that governs `method path`, whose refusal is a 403 (a caller who may not see
/// the thing is answered 404 instead): the first that lists it (the others of an operation only
/// widen what it shows, such as `gpu:vm:list:all_projects`).
fn policy_rule(method: &str, path: &str) -> Option<&'static str> {
    let operation = format!("{} {path}", method.to_uppercase());
    crate::policy::DEFAULTS
        .iter()
        .find(|rule| rule.operations.contains(&operation.as_str()))
        .map(|rule| rule.name)
}

/// Problem documents are served as `application/problem+json` (RFC 9457).
fn problems_as_problem_json(doc: &mut Value) {
    let Some(paths) = doc["paths"].as_object_mut() else { return };
    for operation in
        paths.values_mut().filter_map(Value::as_object_mut).flat_map(|o| o.values_mut())
    {
        let Some(responses) = operation["responses"].as_object_mut() else { continue };
        for response in responses.values_mut() {
            let Some(content) = response.get_mut("content").and_then(Value::as_object_mut) else {
                continue;
            };
            if content.get("application/json").is_some_and(|c| c["schema"]["$ref"] == PROBLEM) {
                let media = content.remove("application/json").expect("checked");
                content.insert(PROBLEM_JSON.to_owned(), media);
            }
        }
    }
}

/// Adds `constraints` to the schema at `pointer`.
fn merge(doc: &mut Value, pointer: &str, constraints: Value) {
    let target = doc
        .pointer_mut(pointer)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("the OpenAPI document has no {pointer}"));
    let Value::Object(constraints) = constraints else { panic!("constraints are an object") };
    target.extend(constraints);
}

/// Adds `constraints` to the schema of parameter `name` of `method path`.
fn merge_param(doc: &mut Value, path: &str, method: &str, name: &str, constraints: Value) {
    let pointer = format!("/paths/{}/{method}/parameters", path.replace('/', "~1"));
    let index = doc
        .pointer(&pointer)
        .and_then(Value::as_array)
        .and_then(|params| params.iter().position(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"));
    merge(doc, &format!("{pointer}/{index}/schema"), constraints);
}

/// OpenAPI links: what a client (and a stateful test) can do next with what an answer names.
fn add_links(doc: &mut Value) {
    let vm = json!({ "id": "$response.body#/id" });
    let host = json!({ "name": "$request.path.name" });
    let project = json!({ "project": "$request.path.project" });
    let links = [
        ("/v1/vms", "post", "202", &["get_vm", "terminate_vm", "attach_cgpus"][..], &vm),
        ("/v1/vms/{id}/cgpus", "post", "202", &["get_vm", "terminate_vm"][..], &vm),
        (
            "/v1/hosts/{name}",
            "put",
            "200",
            &["drain_host", "undrain_host", "evacuate_host", "forget_host"][..],
            &host,
        ),
        ("/v1/quotas/{project}", "put", "200", &["get_quota", "delete_quota"][..], &project),
        ("/v1/cohorts/{name}", "put", "200", &["get_cohort", "delete_cohort"][..], &host),
    ];
    for (path, method, status, operations, parameters) in links {
        let pointer = format!("/paths/{}/{method}/responses/{status}", path.replace('/', "~1"));
        let links: serde_json::Map<String, Value> = operations
            .iter()
            .map(|id| (id.to_string(), json!({ "operationId": id, "parameters": parameters })))
            .collect();
        merge(doc, &pointer, json!({ "links": links }));
    }
}

/// The pattern of project, host and GPU ids (`gpgpums`'s names).
const ID_PATTERN: &str = "^[A-Za-z0-9._:-]+$";

/// `If-Match` as [`super::cohorts`] reads it: `*`, or entity tags (`"v"`, `W/"v"`, no comma
/// inside) separated by commas.
const IF_MATCH_PATTERN: &str =
    r#"^[ \t]*(\*|(W/)?"[!#-+.-~-]*"([ \t]*,[ \t]*(W/)?"[!#-+.-~-]*")*)[ \t]*$"#;

/// A time as usage reports take it: RFC 3339, or UTC without a zone, or a UTC day.
const TIME_PATTERN: &str = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})?)?$";

fn constrain_request_fields(doc: &mut Value) {
    use crate::app::vms::{MAX_NAME, MAX_NETWORKS, MAX_USER_DATA};
    use gpgpums::{PolicyRegistry, MAX_CGPUS_PER_VM, MAX_GPU_MEMORY_MIB};
    use rodvr_contract::protocol as agent;

    let text = |max: usize| json!({ "minLength": 1, "maxLength": max, "pattern": TEXT_PATTERN });
    let ncgpus = json!({ "minimum": 1, "maximum": MAX_CGPUS_PER_VM });
    let memory = json!({ "minimum": 1, "maximum": MAX_GPU_MEMORY_MIB });
    let mut policies: Vec<Value> =
        PolicyRegistry::builtin().known_names().into_iter().map(Value::from).collect();
    policies.push(Value::Null);
    let policy = json!({ "enum": policies });
    let shared_needs_memory = json!({
        "if": { "properties": { "mode": { "const": "shared" } }, "required": ["mode"] },
        "then": { "required": ["gpu_memory_mib"],
                  "properties": { "gpu_memory_mib": { "type": "integer" } } }
    });

    let wait = crate::app::watch::MAX_WAIT.as_secs();
    merge_param(doc, "/v1/vms/{id}", "get", "wait", json!({ "minimum": 0, "maximum": wait }));
    let key = text(MAX_NAME);
    merge_param(doc, "/v1/vms", "post", "Idempotency-Key", key.clone());
    merge_param(doc, "/v1/vms/{id}/cgpus", "post", "Idempotency-Key", key);

    // A cohort's If-Match: `*`, or quoted versions (RFC 9110's entity tags), as its parser takes;
    // absent, not null (a header has no null).
    let if_match = json!({ "type": "string", "pattern": IF_MATCH_PATTERN });
    merge_param(doc, "/v1/cohorts/{name}", "put", "If-Match", if_match.clone());
    merge_param(doc, "/v1/cohorts/{name}", "delete", "If-Match", if_match);

    let id = json!({ "minLength": 1, "maxLength": gpgpums::MAX_NAME_LEN, "pattern": ID_PATTERN });
    for method in ["get", "put", "delete"] {
        merge_param(doc, "/v1/quotas/{project}", method, "project", id.clone());
        merge_param(doc, "/v1/cohorts/{name}", method, "name", id.clone());
    }

    {
        use crate::app::usage::{MAX_STEP_SECONDS, MIN_STEP_SECONDS};
        let time = json!({ "pattern": TIME_PATTERN });
        let step = json!({ "minimum": MIN_STEP_SECONDS, "maximum": MAX_STEP_SECONDS });
        merge_param(doc, "/v1/usage/{project}", "get", "project", id.clone());
        for path in ["/v1/usage", "/v1/usage/{project}"] {
            merge_param(doc, path, "get", "start", time.clone());
            merge_param(doc, path, "get", "end", time.clone());
            merge_param(doc, path, "get", "step", step.clone());
        }
    }

    let name_or_empty = format!("^$|{TEXT_PATTERN}");
    {
        use super::lists::{MAX_HOST_PAGE, MAX_VM_PAGE};
        let vms = "/v1/vms";
        merge_param(doc, vms, "get", "limit", json!({ "minimum": 1, "maximum": MAX_VM_PAGE }));
        merge_param(doc, vms, "get", "marker", json!({ "format": "uuid" }));
        let name = json!({ "maxLength": MAX_NAME, "pattern": name_or_empty });
        merge_param(doc, vms, "get", "name", name);
        let pool = "/v1/pool";
        merge_param(doc, pool, "get", "limit", json!({ "minimum": 1, "maximum": MAX_HOST_PAGE }));
        merge_param(doc, pool, "get", "marker", id.clone());
    }

    let launch = "/components/schemas/LaunchRequest";
    merge(
        doc,
        &format!("{launch}/properties/name"),
        json!({ "maxLength": MAX_NAME, "pattern": name_or_empty }),
    );
    merge(doc, &format!("{launch}/properties/image"), text(MAX_NAME));
    merge(doc, &format!("{launch}/properties/flavor"), text(MAX_NAME));
    merge(doc, &format!("{launch}/properties/networks"), json!({ "maxItems": MAX_NETWORKS }));
    merge(doc, &format!("{launch}/properties/networks/items"), text(MAX_NAME));
    merge(doc, &format!("{launch}/properties/user_data"), json!({ "maxLength": MAX_USER_DATA }));
    merge(doc, &format!("{launch}/properties/ncgpus"), ncgpus.clone());
    merge(doc, &format!("{launch}/properties/gpu_memory_mib"), memory.clone());
    merge(doc, &format!("{launch}/properties/policy"), policy.clone());
    merge(
        doc,
        &format!("{launch}/properties/priority"),
        json!({ "minimum": 0, "maximum": crate::config::MAX_QUEUE_PRIORITY }),
    );
    merge(doc, launch, shared_needs_memory.clone());
    // A percent of a GPU's SMs (see gpgpums' `Request::compute_percent`).
    let percent = json!({ "minimum": 1, "maximum": 100 });
    merge(doc, &format!("{launch}/properties/compute_percent"), percent.clone());

    let attach = "/components/schemas/AttachRequest";
    merge(doc, &format!("{attach}/properties/ncgpus"), ncgpus);
    merge(doc, &format!("{attach}/properties/gpu_memory_mib"), memory);
    merge(doc, &format!("{attach}/properties/compute_percent"), percent);
    merge(doc, &format!("{attach}/properties/policy"), policy);
    merge(doc, attach, shared_needs_memory);

    merge(
        doc,
        "/components/schemas/TaintRequest/properties/reason",
        text(crate::app::gpus::MAX_TAINT_LEN),
    );

    let quota = "/components/schemas/QuotaLimits/properties";
    for resource in ["cgpus", "memory_mib", "exclusive_gpus", "vms"] {
        merge(
            doc,
            &format!("{quota}/{resource}"),
            json!({ "maximum": crate::config::MAX_QUOTA_LIMIT }),
        );
    }
    merge(
        doc,
        &format!("{quota}/max_priority"),
        json!({ "maximum": crate::config::MAX_QUEUE_PRIORITY }),
    );

    let host = "/components/schemas/HostReportBody/properties";
    merge(doc, &format!("{host}/host"), id.clone());
    merge(doc, &format!("{host}/kind"), json!({ "enum": ["compute-gpu", "compute-rgpu"] }));
    merge(doc, &format!("{host}/agent_url"), json!({ "maxLength": agent::MAX_URL_LEN }));
    merge(doc, &format!("{host}/gpus"), json!({ "maxItems": agent::MAX_GPUS_PER_HOST }));
    merge(doc, &format!("{host}/applied_generation"), json!({ "maximum": agent::MAX_GENERATION }));
    merge(
        doc,
        &format!("{host}/rtt_us"),
        json!({
            "maxProperties": agent::MAX_RTT_TARGETS,
            "additionalProperties": { "minimum": 1, "maximum": gpgpums::MAX_RTT_US }
        }),
    );
    let offers = "/components/schemas/ResourcesBody/properties";
    merge(doc, &format!("{offers}/cpu_milli"), json!({ "maximum": gpgpums::MAX_CPU_MILLI }));
    merge(doc, &format!("{offers}/memory_mib"), json!({ "maximum": gpgpums::MAX_MEMORY_MIB }));
    merge(
        doc,
        "/components/schemas/RttTargetsBody/properties/targets",
        json!({ "maxItems": agent::MAX_RTT_TARGETS }),
    );
    let gpu = "/components/schemas/GpuReportBody/properties";
    merge(doc, &format!("{gpu}/id"), id);
    // utoipa marks no optional reference deprecated: the old name of a GPU's server.
    merge(doc, &format!("{gpu}/rcuda"), json!({ "deprecated": true }));
    merge(
        doc,
        &format!("{gpu}/model"),
        json!({ "minLength": 1, "maxLength": agent::MAX_MODEL_LEN }),
    );
    merge(
        doc,
        &format!("{gpu}/memory_mib"),
        json!({ "minimum": 1, "maximum": agent::MAX_GPU_MEMORY_MIB }),
    );
    merge(
        doc,
        &format!("{gpu}/unhealthy"),
        json!({ "minLength": 1, "maxLength": agent::MAX_HEALTH_LEN }),
    );
    let rcuda = "/components/schemas/RcudaBody/properties";
    merge(doc, &format!("{rcuda}/address"), json!({ "format": "ipv4" }));
    merge(doc, &format!("{rcuda}/port"), json!({ "minimum": 1, "maximum": 65535 }));
    merge(doc, &format!("{rcuda}/gpu_number"), json!({ "maximum": agent::MAX_GPU_NUMBER }));
}
