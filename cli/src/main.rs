//! `gsaas`, the command-line client of GSaaS (dissertation section 5.2.1.4).
//!
//! It is a thin shell over the REST API: it builds requests from arguments, prints answers as tables
//! (or the API's own JSON with `-f json`), follows launches with `--wait`, and turns every outcome
//! into an exit code a script can branch on.

mod args;
mod client;
mod failure;
mod openstack;
mod output;

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use gsaas_api_types::{
    AttachRequest, CgpuState, CohortMemberTerms, CohortRequest, CohortView, GpuModels,
    LaunchRequest, LocalityParam, ModeParam, NetworkParam, QuotaView, RemotingParam, StrengthParam,
    TaintRequest, TraitsParam, VmView, LAUNCH_STAGES,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use args::{Cli, CohortCommand, Command, Format, Launch, Limit, QuotaCommand};
use client::{exit, Auth, Client, Failure, FileConfig};

const DEFAULT_URL: &str = "http://127.0.0.1:8080";
const WAIT_LIMIT: Duration = Duration::from_secs(900);

fn main() -> ExitCode {
    let argv = args::translate_paper_form(std::env::args().collect());
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("gsaas: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

fn run(cli: Cli) -> Result<(), Failure> {
    let file = FileConfig::load(cli.config.as_deref())?;
    let url = cli
        .url
        .or_else(|| std::env::var("GSAAS_URL").ok().filter(|u| !u.is_empty()))
        .or(file.url.clone());
    let token = cli.token.or_else(|| std::env::var("GSAAS_TOKEN").ok()).or(file.token.clone());
    let auth = Auth::resolve(token)?;
    // No URL given: OpenStack credentials find gsaasd in their catalog, as every OpenStack
    // client finds its service.
    let url = match url {
        Some(url) => url,
        None => auth
            .discover(cli.os_interface.as_deref(), cli.os_region_name.as_deref())?
            .unwrap_or_else(|| DEFAULT_URL.to_owned()),
    };
    let client = Client::new(&url, auth);
    let format = cli.format;
    match cli.command {
        Command::Launch(launch) => launch_vm(&client, format, *launch, &file),
        Command::Terminate { id, wait } => {
            let vm = client.delete(&format!("/v1/vms/{}", path_segment(&id)?))?;
            if wait {
                let vm = follow(&client, &id, &["deleted"], format, false)?;
                return print(format, &vm, output::vm);
            }
            print(format, &vm, output::vm)
        }
        Command::Attach(attach) => attach_cgpus(&client, format, attach),
        Command::Detach { id, index, wait } => {
            let vm = client.delete(&format!("/v1/vms/{}/cgpus/{index}", path_segment(&id)?))?;
            let vm = if wait { follow_cgpus(&client, &id)? } else { vm };
            print(format, &vm, output::vm)
        }
        Command::List { project, state, name, deleted, limit } => {
            let mut query = Vec::new();
            for (key, value) in [("project", project), ("state", state), ("name", name)] {
                if let Some(value) = value {
                    query.push(format!("{key}={}", path_segment(&value)?));
                }
            }
            if deleted {
                query.push("deleted=true".into());
            }
            if let Some(limit) = limit {
                query.push(format!("limit={}", limit.min(1000)));
            }
            let first = format!("/v1/vms?{}", query.join("&"));
            let vms = all_pages(&client, &first, "vms", limit.map(|n| n as usize))?;
            print(format, &json!({ "vms": vms }), output::vm_list)
        }
        Command::Show { id } => {
            print(format, &client.get(&format!("/v1/vms/{}", path_segment(&id)?))?, output::vm)
        }
        Command::Env { id } => {
            let vm = client.get(&format!("/v1/vms/{}", path_segment(&id)?))?;
            match format {
                Format::Json => {
                    let env = match &vm["gpu_env"] {
                        Value::Object(env) if !env.is_empty() => &vm["gpu_env"],
                        _ => &vm["rcuda_env"],
                    };
                    print(format, env, |_: &Value| String::new())
                }
                Format::Table => {
                    print!("{}", output::env(&typed(&vm)?));
                    Ok(())
                }
            }
        }
        Command::Pool => {
            let mut pool = client.get("/v1/pool")?;
            if let Some(next) = pool["next"].as_str().map(str::to_owned) {
                let more = all_pages(&client, &next, "hosts", None)?;
                if let Some(hosts) = pool["hosts"].as_array_mut() {
                    hosts.extend(more);
                }
                pool.as_object_mut().map(|p| p.remove("next"));
            }
            print(format, &pool, output::pool)
        }
        Command::Queue => print(format, &client.get("/v1/queue")?, output::queue),
        Command::Hosts => print(format, &client.get("/v1/hosts")?, output::hosts),
        Command::Drain { host } => print(
            format,
            &client.post(&format!("/v1/hosts/{}/drain", path_segment(&host)?), &json!({}), None)?,
            output::host,
        ),
        Command::Undrain { host } => print(
            format,
            &client.post(
                &format!("/v1/hosts/{}/undrain", path_segment(&host)?),
                &json!({}),
                None,
            )?,
            output::host,
        ),
        Command::Forget { host, force } => {
            let path = format!("/v1/hosts/{}/forget?force={force}", path_segment(&host)?);
            print(format, &client.post(&path, &json!({}), None)?, output::host)
        }
        Command::Evacuate { gpu, host } => {
            let path = match (gpu, host) {
                (Some(gpu), _) => format!("/v1/gpus/{}/evacuate", path_segment(&gpu)?),
                (None, Some(host)) => format!("/v1/hosts/{}/evacuate", path_segment(&host)?),
                (None, None) => unreachable!("clap requires --gpu or --host"),
            };
            print(format, &client.post(&path, &json!({}), None)?, output::evacuation)
        }
        Command::Taint { gpu, reason } => {
            let path = format!("/v1/gpus/{}/taint", path_segment(&gpu)?);
            let body = body(&TaintRequest { reason });
            print(format, &client.post(&path, &body, None)?, output::taint)
        }
        Command::Untaint { gpu } => {
            let path = format!("/v1/gpus/{}/untaint", path_segment(&gpu)?);
            print(format, &client.post(&path, &json!({}), None)?, output::taint)
        }
        Command::Fences => print(format, &client.get("/v1/fences")?, output::fences),
        Command::Tasks { activate: None } => {
            print(format, &client.get("/v1/background-tasks")?, output::tasks)
        }
        Command::Tasks { activate: Some(task) } => {
            let path = format!("/v1/background-tasks/{}/activate", path_segment(&task)?);
            print(format, &client.post(&path, &json!({}), None)?, output::task)
        }
        Command::Quota { command } => quota(&client, format, command),
        Command::Cohort { command } => cohort(&client, format, command),
        Command::Usage { project, start, end, csv } => {
            let mut path = match &project {
                Some(project) => format!("/v1/usage/{}", path_segment(project)?),
                None => "/v1/usage".to_owned(),
            };
            let params: Vec<(&str, &str)> = [("start", &start), ("end", &end)]
                .into_iter()
                .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
                .chain(csv.then_some(("format", "csv")))
                .collect();
            for (i, (key, value)) in params.iter().enumerate() {
                path.push(if i == 0 { '?' } else { '&' });
                path.push_str(&format!("{key}={}", query_value(value)));
            }
            let report = client.get(&path)?;
            match (csv, &report) {
                (true, Value::String(text)) => {
                    print!("{text}");
                    Ok(())
                }
                _ => print(format, &report, output::usage),
            }
        }
    }
}

/// A query parameter's value, percent-encoded but for the characters RFC 3986 leaves as they are.
fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b':' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `gsaas quota set` without --model: the totals given (cGPUs, memory, exclusive GPUs, VMs) and
/// the priority ceiling; the rest stay.
fn set_total_limits(
    client: &Client,
    format: Format,
    path: &str,
    given: [Option<Limit>; 4],
    max_priority: Option<u32>,
) -> Result<(), Failure> {
    if given.iter().all(Option::is_none) && max_priority.is_none() {
        return Err(Failure::usage(
            "give at least one limit: --cgpus, --memory-mib, --exclusive-gpus, --vms or \
             --max-priority",
        ));
    }
    let mut limits = typed::<QuotaView>(&client.get(path)?)?.limits;
    let slots =
        [&mut limits.cgpus, &mut limits.memory_mib, &mut limits.exclusive_gpus, &mut limits.vms];
    set_limits(slots, given);
    if let Some(priority) = max_priority {
        limits.max_priority = Some(priority);
    }
    print(format, &client.put(path, &body(&limits))?, output::quota)
}

/// Sets each of `slots` to its limit given (`none`: no limit); those not given stay.
fn set_limits<const N: usize>(slots: [&mut Option<u64>; N], given: [Option<Limit>; N]) {
    for (slot, limit) in slots.into_iter().zip(given) {
        match limit {
            Some(Limit::At(n)) => *slot = Some(n),
            Some(Limit::Unlimited) => *slot = None,
            None => {}
        }
    }
}

fn quota(client: &Client, format: Format, command: QuotaCommand) -> Result<(), Failure> {
    match command {
        QuotaCommand::Show { project: None } => {
            print(format, &client.get("/v1/quotas")?, output::quota_list)
        }
        QuotaCommand::Show { project: Some(project) } => print(
            format,
            &client.get(&format!("/v1/quotas/{}", path_segment(&project)?))?,
            output::quota,
        ),
        QuotaCommand::Set {
            project,
            model,
            cgpus,
            memory_mib,
            exclusive_gpus,
            vms,
            max_priority,
        } => {
            let path = format!("/v1/quotas/{}", path_segment(&project)?);
            let Some(model) = model else {
                let given = [cgpus, memory_mib, exclusive_gpus, vms];
                return set_total_limits(client, format, &path, given, max_priority);
            };
            if vms.is_some() || max_priority.is_some() {
                return Err(Failure::usage(
                    "--vms and --max-priority are not per model: give them without --model",
                ));
            }
            let given = [cgpus, memory_mib, exclusive_gpus];
            if given.iter().all(Option::is_none) {
                return Err(Failure::usage(
                    "give at least one limit on the model: --cgpus, --memory-mib or \
                     --exclusive-gpus",
                ));
            }
            let mut limits = typed::<QuotaView>(&client.get(&path)?)?.limits;
            let entry = limits.models.entry(model.clone()).or_default();
            let slots = [&mut entry.cgpus, &mut entry.memory_mib, &mut entry.exclusive_gpus];
            set_limits(slots, given);
            if [entry.cgpus, entry.memory_mib, entry.exclusive_gpus].iter().all(Option::is_none) {
                limits.models.remove(&model);
            }
            print(format, &client.put(&path, &body(&limits))?, output::quota)
        }
        QuotaCommand::Reset { project } => print(
            format,
            &client.delete(&format!("/v1/quotas/{}", path_segment(&project)?))?,
            output::quota,
        ),
    }
}

fn cohort(client: &Client, format: Format, command: CohortCommand) -> Result<(), Failure> {
    match command {
        CohortCommand::Show { name: None } => {
            print(format, &client.get("/v1/cohorts")?, output::cohort_list)
        }
        CohortCommand::Show { name: Some(name) } => print(
            format,
            &client.get(&format!("/v1/cohorts/{}", path_segment(&name)?))?,
            output::cohort,
        ),
        CohortCommand::Set {
            name,
            project,
            model,
            borrow_cgpus,
            borrow_memory_mib,
            borrow_exclusive_gpus,
            lend_cgpus,
            lend_memory_mib,
            lend_exclusive_gpus,
            borrow_by_default,
        } => {
            let path = format!("/v1/cohorts/{}", path_segment(&name)?);
            let borrow = [borrow_cgpus, borrow_memory_mib, borrow_exclusive_gpus];
            let lend = [lend_cgpus, lend_memory_mib, lend_exclusive_gpus];
            if model.is_some() {
                if lend.iter().any(Option::is_some) || borrow_by_default.is_some() {
                    return Err(Failure::usage(
                        "--lend-* and --borrow-by-default are not per model: give them without \
                         --model",
                    ));
                }
                if borrow.iter().all(Option::is_none) {
                    return Err(Failure::usage(
                        "give at least one borrowing limit on the model: --borrow-cgpus, \
                         --borrow-memory-mib or --borrow-exclusive-gpus",
                    ));
                }
            }
            let changed = change_members(client, &path, |members| {
                let terms = members.entry(project.clone()).or_default();
                if let Some(model) = &model {
                    let by_model = &mut terms.borrowing_limit_by_model;
                    let entry = by_model.entry(model.clone()).or_default();
                    let slots =
                        [&mut entry.cgpus, &mut entry.memory_mib, &mut entry.exclusive_gpus];
                    set_limits(slots, borrow);
                    let limits = [entry.cgpus, entry.memory_mib, entry.exclusive_gpus];
                    if limits.iter().all(Option::is_none) {
                        by_model.remove(model);
                    }
                    return Ok(());
                }
                let b = &mut terms.borrowing_limit;
                set_limits([&mut b.cgpus, &mut b.memory_mib, &mut b.exclusive_gpus], borrow);
                let l = &mut terms.lending_limit;
                set_limits([&mut l.cgpus, &mut l.memory_mib, &mut l.exclusive_gpus], lend);
                if let Some(by_default) = borrow_by_default {
                    terms.borrow_by_default = by_default;
                }
                Ok(())
            })?;
            let changed = changed.ok_or_else(|| Failure::usage("a member set ends no cohort"))?;
            print(format, &changed, output::cohort)
        }
        CohortCommand::Remove { name, project } => {
            let path = format!("/v1/cohorts/{}", path_segment(&name)?);
            let changed =
                change_members(client, &path, |members| match members.remove(&project) {
                    Some(_) => Ok(()),
                    None => Err(Failure {
                        message: format!("project {project} is not in cohort {name}"),
                        code: exit::NOT_FOUND,
                    }),
                })?;
            match changed {
                Some(changed) => print(format, &changed, output::cohort),
                None => {
                    println!("cohort {name} ended: {project} was its last member");
                    Ok(())
                }
            }
        }
        CohortCommand::Delete { name } => {
            client.delete(&format!("/v1/cohorts/{}", path_segment(&name)?))?;
            println!("cohort {name} ended");
            Ok(())
        }
    }
}

/// How often a change of one member is tried again on a cohort another admin changed meanwhile.
const COHORT_TRIES: usize = 5;

/// Reads the cohort at `path` (none: no member), applies `change` to its members and writes them
/// back if nobody changed it since (`If-Match`), reading and applying again if someone did: one
/// member's change never undoes another admin's. The cohort as written; `None`: left without
/// members, it was ended.
fn change_members(
    client: &Client,
    path: &str,
    change: impl Fn(&mut BTreeMap<String, CohortMemberTerms>) -> Result<(), Failure>,
) -> Result<Option<Value>, Failure> {
    for _ in 0..COHORT_TRIES {
        let (mut members, version) = match client.get(path) {
            Ok(cohort) => {
                let cohort: CohortView = typed(&cohort)?;
                let members = cohort.members.into_iter().map(|(p, m)| (p, m.terms)).collect();
                (members, Some(cohort.version).filter(|v| !v.is_empty()))
            }
            Err(e) if e.code == exit::NOT_FOUND => (BTreeMap::new(), None),
            Err(e) => return Err(e),
        };
        change(&mut members)?;
        let request = (!members.is_empty()).then(|| body(&CohortRequest { members }));
        if let Some(answer) = client.change_if_match(path, request.as_ref(), version.as_deref())? {
            return Ok(request.is_some().then_some(answer));
        }
    }
    Err(Failure {
        message: format!(
            "{path} kept changing while it was read and written ({COHORT_TRIES} tries): try again"
        ),
        code: exit::REFUSED,
    })
}

/// A value that goes into a URL path, checked so it cannot change the path.
fn path_segment(value: &str) -> Result<&str, Failure> {
    if value.is_empty()
        || !value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
    {
        return Err(Failure::usage(format!("{value:?} is not a valid id or name")));
    }
    Ok(value)
}

/// Prints the service's answer: as it came (`-f json`), or read into its API type `T` and shown by
/// `table`.
fn print<T: DeserializeOwned>(
    format: Format,
    value: &Value,
    table: impl Fn(&T) -> String,
) -> Result<(), Failure> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(value).expect("JSON prints")),
        Format::Table => print!("{}", table(&typed(value)?)),
    }
    Ok(())
}

/// The service's answer read into its API type.
fn typed<T: DeserializeOwned>(value: &Value) -> Result<T, Failure> {
    T::deserialize(value).map_err(|e| Failure {
        message: format!("the service's answer does not read as the API's type: {e}"),
        code: exit::UNAVAILABLE,
    })
}

/// A request body as JSON.
fn body(request: &impl Serialize) -> Value {
    serde_json::to_value(request).expect("API requests serialize")
}

fn launch_vm(
    client: &Client,
    format: Format,
    launch: Launch,
    file: &FileConfig,
) -> Result<(), Failure> {
    // None: the service's default image and flavor (it names the field when it has none).
    let image = launch.image.or(file.image.clone());
    let flavor = launch.flavor.or(file.flavor.clone());
    let user_data = match &launch.user_data {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| Failure::usage(format!("--user-data {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let request = LaunchRequest {
        name: launch.name,
        image,
        flavor,
        networks: launch.networks,
        user_data,
        ncgpus: launch.ncgpus,
        gpu_memory_mib: launch.poolmem,
        mode: mode_param(launch.mode),
        locality: match launch.locality {
            args::Locality::Any => LocalityParam::Any,
            args::Locality::Local => LocalityParam::Local,
            args::Locality::Remote => LocalityParam::Remote,
        },
        policy: launch.policy,
        distinct_gpus: launch.distinct_gpus,
        compute_percent: launch.compute_percent,
        remoting: launch.remoting.map(|r| match r {
            args::Remoting::Rcuda => RemotingParam::Rcuda,
            args::Remoting::Lupine => RemotingParam::Lupine,
        }),
        gpu_model: (!launch.gpu_models.is_empty()).then_some(GpuModels::AnyOf(launch.gpu_models)),
        traits: TraitsParam {
            required: launch.require_traits,
            forbidden: launch.forbid_traits,
            preferred: launch.prefer_traits,
            avoid: launch.avoid_traits,
        },
        min_compute_capability: launch.min_compute_capability,
        min_cuda_version: launch.min_cuda_version,
        network: NetworkParam {
            same: launch.same,
            strength: if launch.same_preferred {
                StrengthParam::Preferred
            } else {
                StrengthParam::Required
            },
            max_rtt_us: launch.max_rtt_us,
            nearest: launch.nearest,
        },
        queue: launch.queue,
        priority: launch.priority,
        preemptible: launch.preemptible,
        give_back: !launch.no_give_back,
        borrow: launch.borrowing.asked(),
    };
    let vm = client.post("/v1/vms", &body(&request), launch.idempotency_key.as_deref())?;
    if !launch.wait {
        return print(format, &vm, output::vm);
    }
    let id = typed::<VmView>(&vm)?.id;
    let vm = follow(client, &id, &["ready", "error"], format, true)?;
    print(format, &vm, output::vm)?;
    let vm: VmView = typed(&vm)?;
    if vm.state == "error" {
        return Err(Failure {
            message: format!("VM {id} failed: {}", vm.error.as_deref().unwrap_or("unknown reason")),
            code: exit::REFUSED,
        });
    }
    Ok(())
}

fn mode_param(mode: args::Mode) -> ModeParam {
    match mode {
        args::Mode::Exclusive => ModeParam::Exclusive,
        args::Mode::Shared => ModeParam::Shared,
    }
}

fn attach_cgpus(client: &Client, format: Format, attach: args::Attach) -> Result<(), Failure> {
    let request = AttachRequest {
        ncgpus: attach.ncgpus,
        gpu_memory_mib: attach.poolmem,
        mode: mode_param(attach.mode),
        distinct_gpus: attach.distinct_gpus,
        compute_percent: attach.compute_percent,
        policy: attach.policy,
        queue: attach.queue,
        borrow: attach.borrowing.asked(),
    };
    let path = format!("/v1/vms/{}/cgpus", path_segment(&attach.id)?);
    let vm = client.post(&path, &body(&request), attach.idempotency_key.as_deref())?;
    if !attach.wait {
        return print(format, &vm, output::vm);
    }
    let waiting = queued_attaches(&typed(&vm)?);
    if waiting > 0 {
        follow_queued_attach(client, &attach.id, waiting)?;
    }
    let vm = follow_cgpus(client, &attach.id)?;
    print(format, &vm, output::vm)?;
    let vm: VmView = typed(&vm)?;
    let gave_up = vm
        .events
        .last()
        .filter(|e| matches!(e.kind.as_str(), "queue_timeout" | "attach_refused"))
        .filter(|_| waiting > 0)
        .map(|e| e.detail.clone());
    match vm.error.or(gave_up) {
        Some(error) => {
            Err(Failure { message: format!("VM {}: {error}", attach.id), code: exit::REFUSED })
        }
        None => Ok(()),
    }
}

/// How many attaches asked for (not given back) the VM waits for.
fn queued_attaches(vm: &VmView) -> usize {
    vm.queued_attaches.iter().filter(|q| q.kind == "attach").count()
}

/// Polls the VM until fewer than `waiting` of its attaches wait in the queue (the newest one
/// started, timed out or was refused), showing the VM's place in the queue as it changes. Waiting
/// for GPUs has no limit here: the service ends it (`queue_timeout`).
fn follow_queued_attach(client: &Client, id: &str, waiting: usize) -> Result<(), Failure> {
    let mut position = None;
    loop {
        let vm: VmView = typed(&client.get(&format!("/v1/vms/{id}"))?)?;
        if queued_attaches(&vm) < waiting || vm.state != "ready" {
            return Ok(());
        }
        let now = vm.queue_position;
        if now != position {
            match now {
                Some(p) => eprintln!("queued: position {p}"),
                None => eprintln!("queued"),
            }
            position = now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls the VM until no cGPU of it is attaching or detaching (or it is no longer ready).
fn follow_cgpus(client: &Client, id: &str) -> Result<Value, Failure> {
    let started = Instant::now();
    loop {
        let answer = client.get(&format!("/v1/vms/{id}"))?;
        let vm: VmView = typed(&answer)?;
        let changing = vm.cgpus.iter().any(|c| c.state != CgpuState::Live);
        if !changing || vm.state != "ready" {
            return Ok(answer);
        }
        if started.elapsed() > WAIT_LIMIT {
            return Err(Failure {
                message: format!(
                    "VM {id}'s cGPUs are still changing after {} s",
                    WAIT_LIMIT.as_secs()
                ),
                code: exit::UNAVAILABLE,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a launch is doing while each of [`LAUNCH_STAGES`] runs, in the same order.
const STAGE_LABELS: [&str; LAUNCH_STAGES.len()] =
    ["checking", "selecting GPUs", "creating VM", "activating", "deploying", "configuring routes"];

/// Polls the VM until its state is one of `until`, reporting launch stages as they complete when
/// `stages` (a progress line on a terminal, plain lines otherwise; all on stderr, so stdout keeps
/// exactly the API's JSON for `-f json`).
fn follow(
    client: &Client,
    id: &str,
    until: &[&str],
    format: Format,
    stages: bool,
) -> Result<Value, Failure> {
    let terminal = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut reported = if stages { 0 } else { LAUNCH_STAGES.len() };
    let spinner = ['|', '/', '-', '\\'];
    let mut tick = 0usize;
    let mut queue_position = None;
    let mut waited_in_queue = Duration::ZERO;
    loop {
        let answer = client.get(&format!("/v1/vms/{id}"))?;
        let vm: VmView = typed(&answer)?;
        let state = vm.state.as_str();
        while let Some(seconds) = LAUNCH_STAGES.get(reported).and_then(|stage| vm.timings.of(stage))
        {
            let label = STAGE_LABELS[reported];
            if terminal {
                eprint!("\r\x1b[K");
            }
            eprintln!("{label:<20} done in {seconds:.3} s");
            reported += 1;
        }
        if until.contains(&state) {
            if terminal {
                eprint!("\r\x1b[K");
            }
            if format == Format::Table {
                eprintln!("{state} after {:.1} s", started.elapsed().as_secs_f64());
            }
            return Ok(answer);
        }
        if state == "queued" {
            // Waiting for GPUs has no limit here: the service ends it (queue_timeout).
            let position = vm.queue_position;
            if position != queue_position {
                if terminal {
                    eprint!("\r\x1b[K");
                }
                match position {
                    Some(p) => eprintln!("queued: position {p}"),
                    None => eprintln!("queued"),
                }
                queue_position = position;
            }
            waited_in_queue = started.elapsed();
        }
        if started.elapsed() - waited_in_queue > WAIT_LIMIT {
            return Err(Failure {
                message: format!("VM {id} is still {state} after {} s", WAIT_LIMIT.as_secs()),
                code: exit::UNAVAILABLE,
            });
        }
        if terminal {
            let next = STAGE_LABELS.get(reported).copied().unwrap_or(state);
            eprint!("\r\x1b[K{} {next}", spinner[tick % spinner.len()]);
            let _ = std::io::stderr().flush();
            tick += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `key` items of the page at `path` and of every page after it (each page's `next`), at
/// most `limit` of them.
fn all_pages(
    client: &Client,
    path: &str,
    key: &str,
    limit: Option<usize>,
) -> Result<Vec<Value>, Failure> {
    let mut items = Vec::new();
    let mut path = Some(path.to_owned());
    while let Some(page) = path.take() {
        let mut answer = client.get(&page)?;
        if let Some(Value::Array(page_items)) = answer.get_mut(key).map(Value::take) {
            items.extend(page_items);
        }
        if limit.is_some_and(|n| items.len() >= n) {
            items.truncate(limit.unwrap_or(usize::MAX));
            break;
        }
        path = answer["next"].as_str().map(str::to_owned);
    }
    Ok(items)
}
