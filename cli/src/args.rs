//! Command-line arguments: the modern subcommands, and the dissertation's form translated into them.
//!
//! The paper's users type `gsaas -l -ncgpus=2 -poolmem=2048 -mode=shared -locality=local` and
//! `gsaas -t -id=<VMid>`. Rather than a second parser, [`translate_paper_form`] rewrites such an
//! argument list into the modern one (`gsaas launch --ncgpus 2 ...`) before clap sees it, so both forms
//! share every check, default and help text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the request was refused for another reason (conflict, quota) or the VM ended in error
  2  usage error: bad arguments, or the service rejected a field of the request
  3  not found (no such VM or host, or not yours)
  4  no GPU capacity for the request
  5  authentication failed (no token, a bad or expired one, or Keystone refused the OS_* credentials)
  6  the service, Keystone or a dependency is unreachable or failed";

const EXAMPLES: &str = "\
Examples (the dissertation's form works too):
  gsaas launch --ncgpus 2 --image cirros --flavor m1.small            (2 exclusive cGPUs)
  gsaas launch --ncgpus 2 --poolmem 2048 --mode shared --image cirros --flavor m1.small --wait
  gsaas launch --ncgpus 8 --poolmem 4096 --mode shared --locality local --image cirros --flavor m1.small
  gsaas -l -ncgpus=2 -poolmem=2048 -mode=shared       (image and flavor from GSAAS_IMAGE/GSAAS_FLAVOR)
  gsaas -t -id=<VMid>
  gsaas list; gsaas show <VMid>; eval \"$(gsaas env <VMid>)\"
  gsaas usage --start 2026-10-01 --end 2026-11-01; gsaas usage <project> --csv > usage.csv";

#[derive(Debug, Parser)]
#[command(
    name = "gsaas",
    version,
    about = "Launch and terminate VMs with cloudified GPUs (cGPUs) on GSaaS",
    long_about = "Launch and terminate VMs with cloudified GPUs (cGPUs) on GSaaS.\n\n\
        The service and credentials come from --url/--token, GSAAS_URL/GSAAS_TOKEN, or the config file \
        (GSAAS_CONFIG, default ~/.config/gsaas/config.toml, with keys url, token, image, flavor).\n\n\
        OpenStack credentials (for a gsaasd with `[auth] mode = \"keystone\"`), used when no gsaasd \
        token is given: OS_TOKEN (a Keystone token, sent as X-Auth-Token); or OS_CLOUD, a cloud of \
        clouds.yaml (OS_CLIENT_CONFIG_FILE, ./clouds.yaml, ~/.config/openstack/clouds.yaml, \
        /etc/openstack/clouds.yaml, the first found), with any OS_* variable overriding its field; \
        or the OS_* variables alone: OS_AUTH_URL, OS_USERNAME (or OS_USER_ID), OS_PASSWORD, \
        OS_PROJECT_NAME (or OS_PROJECT_ID), OS_USER_DOMAIN_NAME/_ID, OS_PROJECT_DOMAIN_NAME/_ID \
        (default domain: default). gsaas gets a project-scoped token by Keystone v3 password auth \
        and sends it as X-Auth-Token. Incomplete credentials exit 2, Keystone refusing them 5, \
        Keystone unreachable 6. Without --url, GSAAS_URL or a url in the config file, gsaas finds \
        gsaasd in the token's Keystone catalog (service type gpu-scheduling; --os-interface, \
        --os-region-name), as the openstack client finds its services.",
    after_help = EXIT_CODES,
    after_long_help = format!("{EXAMPLES}\n\n{EXIT_CODES}"),
)]
pub struct Cli {
    /// gsaasd's URL (default: GSAAS_URL, the config file; with OpenStack credentials, gsaasd's
    /// endpoint in the Keystone catalog; else http://127.0.0.1:8080).
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// Which of the catalog's endpoints of gsaasd to use: public, internal or admin (default:
    /// OS_INTERFACE, the cloud's interface, public).
    #[arg(long, global = true)]
    pub os_interface: Option<String>,
    /// The catalog region of gsaasd's endpoint (default: OS_REGION_NAME, the cloud's
    /// region_name, the first endpoint of any region).
    #[arg(long, global = true)]
    pub os_region_name: Option<String>,
    /// Bearer token (default: GSAAS_TOKEN or the config file; else OpenStack's OS_TOKEN, OS_CLOUD, OS_*).
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// Output: human tables, or exactly the API's JSON for scripts.
    #[arg(short = 'f', long = "format", global = true, value_enum, default_value = "table")]
    pub format: Format,
    /// Config file (default: GSAAS_CONFIG or ~/.config/gsaas/config.toml).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Exclusive,
    Shared,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Locality {
    Any,
    Local,
    Remote,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Remoting {
    Rcuda,
    Lupine,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch a VM with cGPUs (the paper's `gsaas -l`).
    #[command(after_long_help = EXAMPLES)]
    Launch(Box<Launch>),
    /// Terminate a VM: withdraw its routes, delete it, release its cGPUs (`gsaas -t -id=`).
    Terminate {
        /// The VM's id.
        id: String,
        /// Wait until the VM is deleted.
        #[arg(long)]
        wait: bool,
    },
    /// Attach cGPUs to a ready VM (the dissertation's progressive attach); they follow its locality.
    Attach(Attach),
    /// Detach one cGPU from a ready VM: its route goes first (open connections are cut), then its
    /// booking. The VM's other cGPUs keep their endpoints.
    Detach {
        /// The VM's id.
        id: String,
        /// The cGPU's index (as `gsaas show` lists it).
        index: u32,
        /// Wait until the cGPU is gone.
        #[arg(long)]
        wait: bool,
    },
    /// List your project's VMs, newest first (every page, unless --limit).
    List {
        /// Admins: another project's VMs.
        #[arg(long)]
        project: Option<String>,
        /// Only VMs in this state (queued, creating, ready, error, deleting, deleted).
        #[arg(long)]
        state: Option<String>,
        /// Only VMs of this name.
        #[arg(long)]
        name: Option<String>,
        /// Deleted VMs too.
        #[arg(long)]
        deleted: bool,
        /// At most this many VMs.
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Show a VM: state, cGPUs, rCUDA environment, stage timings.
    Show { id: String },
    /// Print a VM's rCUDA environment as `export` lines (`eval "$(gsaas env ID)"`).
    Env { id: String },
    /// GPU pool capacity and use (admins: per host and GPU, every page of hosts).
    Pool,
    /// The queue: your project's waiting launches and attaches in the order they are served
    /// (admins: every project's), and how many wait at each priority.
    Queue,
    /// List hosts (admins).
    Hosts,
    /// Drain a host: it takes no new cGPUs (admins).
    Drain { host: String },
    /// Undrain a host (admins).
    Undrain { host: String },
    /// Declare a host dead (admins): its routes count as gone, so the cGPUs fenced there are
    /// released; it takes part again once its agent registers.
    Forget {
        host: String,
        /// Even though its agent still heartbeats.
        #[arg(long)]
        force: bool,
    },
    /// Move every cGPU off a GPU or a host's GPUs to other GPUs (admins). The VMs keep their
    /// masked endpoints; connections open to the old GPU are cut. All or nothing.
    Evacuate {
        /// The GPU to empty.
        #[arg(long, conflicts_with = "host", required_unless_present = "host")]
        gpu: Option<String>,
        /// The host whose GPUs to empty.
        #[arg(long)]
        host: Option<String>,
    },
    /// Taint a GPU: it keeps its cGPUs and takes no new ones (admins).
    Taint {
        gpu: String,
        /// Why (kept with your name).
        #[arg(long)]
        reason: String,
    },
    /// Untaint a GPU: it takes new cGPUs again (admins).
    Untaint { gpu: String },
    /// cGPU bookings fenced while a host that could not be reached may still route to them
    /// (admins).
    Fences,
    /// The background tasks of the gsaasd that answers: how often each runs, how its last run
    /// went and what it did (admins).
    Tasks {
        /// Run this task now (`route_tables`, `cloud_drift`, ...) and show it once it ended.
        #[arg(long, value_name = "TASK")]
        activate: Option<String>,
    },
    /// Project quotas: limits and use.
    Quota {
        #[command(subcommand)]
        command: QuotaCommand,
    },
    /// Cohorts: projects that lend each other the quota they do not use (admins).
    Cohort {
        #[command(subcommand)]
        command: CohortCommand,
    },
    /// What projects used in a period (VM-, cGPU-, GPU-memory- and exclusive-GPU-hours, by GPU
    /// model): your project's; admins every project's; with PROJECT, that project's with each of
    /// its VMs.
    Usage {
        project: Option<String>,
        /// The period's start: RFC 3339 or a UTC day, 2026-11-01 (default: the first day of the
        /// end's month).
        #[arg(long)]
        start: Option<String>,
        /// The period's end, excluded, as --start (default: now).
        #[arg(long)]
        end: Option<String>,
        /// The service's CSV (a row per quantity, with its unit) instead of a table.
        #[arg(long)]
        csv: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// A project's quota limits and use; without PROJECT, your project's (admins: every project's).
    Show { project: Option<String> },
    /// Set a project's own limits (admins); limits not given stay as they are, `none` is no limit.
    /// With --model, --cgpus, --memory-mib and --exclusive-gpus are the limits on that GPU model
    /// (a model left with no limit is dropped).
    Set {
        project: String,
        /// The GPU model (exact name, as `gsaas pool` shows it) the limits are on.
        #[arg(long)]
        model: Option<String>,
        /// cGPUs held at once.
        #[arg(long, value_parser = parse_limit)]
        cgpus: Option<Limit>,
        /// GPU memory booked at once, MiB (an exclusive cGPU books its whole GPU).
        #[arg(long, value_parser = parse_limit)]
        memory_mib: Option<Limit>,
        /// Whole GPUs held exclusively at once.
        #[arg(long, value_parser = parse_limit)]
        exclusive_gpus: Option<Limit>,
        /// VMs being created or ready.
        #[arg(long, value_parser = parse_limit)]
        vms: Option<Limit>,
        /// The highest priority the project's launches may ask for (0 to queue.max_priority).
        #[arg(long)]
        max_priority: Option<u32>,
    },
    /// Give a project the default limits again (admins).
    Reset { project: String },
}

#[derive(Debug, Subcommand)]
pub enum CohortCommand {
    /// A cohort's members, their terms and what each lends and borrows; without NAME, every
    /// cohort.
    Show { name: Option<String> },
    /// Put PROJECT in cohort NAME (made if new), or change its terms there; terms not given stay
    /// as they are (a new member's: no limits, no borrowing by default); `none` is no limit. With
    /// --model, the --borrow-* limits are on what it holds on loan of that GPU model (a model left
    /// with no limit is dropped).
    Set {
        name: String,
        project: String,
        /// The GPU model (exact name, as `gsaas pool` shows it) the borrowing limits are on.
        #[arg(long)]
        model: Option<String>,
        /// How many cGPUs past its quota the project may borrow.
        #[arg(long, value_parser = parse_limit)]
        borrow_cgpus: Option<Limit>,
        /// How much GPU memory (MiB) past its quota the project may borrow.
        #[arg(long, value_parser = parse_limit)]
        borrow_memory_mib: Option<Limit>,
        /// How many exclusive GPUs past its quota the project may borrow.
        #[arg(long, value_parser = parse_limit)]
        borrow_exclusive_gpus: Option<Limit>,
        /// How many of its unused cGPUs the others may borrow.
        #[arg(long, value_parser = parse_limit)]
        lend_cgpus: Option<Limit>,
        /// How much of its unused GPU memory (MiB) the others may borrow.
        #[arg(long, value_parser = parse_limit)]
        lend_memory_mib: Option<Limit>,
        /// How many of its unused exclusive GPUs the others may borrow.
        #[arg(long, value_parser = parse_limit)]
        lend_exclusive_gpus: Option<Limit>,
        /// Whether its launches and attaches borrow when they do not say.
        #[arg(long)]
        borrow_by_default: Option<bool>,
    },
    /// Take PROJECT out of cohort NAME (its last member out ends the cohort).
    Remove { name: String, project: String },
    /// End cohort NAME: its members keep their own quotas; what they borrowed stays held.
    Delete { name: String },
}

/// Whether a launch or attach borrows past the project's quota from its cohort.
#[derive(Debug, Args)]
pub struct Borrowing {
    /// Past your project's quota, run on what its cohort's other projects leave unused (those
    /// cGPUs are marked borrowed and may be taken back); default: your project's setting.
    #[arg(long, conflicts_with = "no_borrow")]
    pub borrow: bool,
    /// Never borrow past your project's quota, whatever its setting.
    #[arg(long)]
    pub no_borrow: bool,
}

impl Borrowing {
    /// As the request says it: asked, refused, or (neither) the project's default.
    pub fn asked(&self) -> Option<bool> {
        match (self.borrow, self.no_borrow) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

/// A quota limit as given on the command line: a number, or `none` (no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Unlimited,
    At(u64),
}

fn parse_limit(s: &str) -> Result<Limit, String> {
    match s {
        "none" | "unlimited" => Ok(Limit::Unlimited),
        n => n.parse().map(Limit::At).map_err(|_| format!("{n:?} is not a number or `none`")),
    }
}

#[derive(Debug, Args)]
pub struct Launch {
    /// Number of cGPUs.
    #[arg(long)]
    pub ncgpus: u32,
    /// GPU memory per cGPU in MiB (required in shared mode).
    #[arg(long)]
    pub poolmem: Option<u64>,
    /// exclusive: a whole GPU per cGPU (default); shared: GPUs shared with other VMs.
    #[arg(long, value_enum, default_value = "exclusive")]
    pub mode: Mode,
    /// Where the VM runs: chosen by the cloud (default), local (on the GPUs' host), remote.
    #[arg(long, value_enum, default_value = "any")]
    pub locality: Locality,
    /// Image name or id (default: GSAAS_IMAGE, the config file's `image`, else the service's).
    #[arg(long, env = "GSAAS_IMAGE")]
    pub image: Option<String>,
    /// Flavor name or id (default: GSAAS_FLAVOR, the config file's `flavor`, else the service's).
    #[arg(long, env = "GSAAS_FLAVOR")]
    pub flavor: Option<String>,
    /// A network for the VM (repeatable).
    #[arg(long = "network")]
    pub networks: Vec<String>,
    /// The VM's name.
    #[arg(long)]
    pub name: Option<String>,
    /// Your own cloud-init user_data, from a file.
    #[arg(long)]
    pub user_data: Option<PathBuf>,
    /// Placement policy (first-fit, least-load-fit, best-fit, fewer-jobs-gpu, frag-gradient,
    /// fewer-jobs-node[+P]).
    #[arg(long)]
    pub policy: Option<String>,
    /// Never put two of the VM's cGPUs on one physical GPU.
    #[arg(long)]
    pub distinct_gpus: bool,
    /// Shared mode: each cGPU's share of its GPU's SMs, percent (1-100), held by MPS on hosts
    /// that run it; left out: time-sliced.
    #[arg(long, value_name = "PERCENT")]
    pub compute_percent: Option<u32>,
    /// The remote-GPU layer of the VM's client (every cGPU speaks it); the service's default
    /// when left out. LUPINE: at most 16 cGPUs.
    #[arg(long, value_enum)]
    pub remoting: Option<Remoting>,
    /// Only GPUs of this model (repeat for any of several), as `gsaas pool` lists them.
    #[arg(long = "gpu-model", value_name = "MODEL")]
    pub gpu_models: Vec<String>,
    /// A trait the GPUs must have (repeat for more): an os-traits name or `CUSTOM_...`.
    #[arg(long = "require-trait", value_name = "TRAIT")]
    pub require_traits: Vec<String>,
    /// A trait the GPUs must not have (repeat for more).
    #[arg(long = "forbid-trait", value_name = "TRAIT")]
    pub forbid_traits: Vec<String>,
    /// A trait that ranks a GPU higher (repeat for more).
    #[arg(long = "prefer-trait", value_name = "TRAIT")]
    pub prefer_traits: Vec<String>,
    /// A trait that ranks a GPU lower (repeat for more).
    #[arg(long = "avoid-trait", value_name = "TRAIT")]
    pub avoid_traits: Vec<String>,
    /// Only GPUs of at least this CUDA compute capability (8.0).
    #[arg(long, value_name = "MAJOR.MINOR")]
    pub min_compute_capability: Option<gsaas_api_types::MajorMinor>,
    /// Only GPUs whose driver supports at least this CUDA version (12.2).
    #[arg(long, value_name = "MAJOR.MINOR")]
    pub min_cuda_version: Option<gsaas_api_types::MajorMinor>,
    /// The VM and every cGPU in one group at this level of the cloud's network (rack, zone:
    /// the operator's names).
    #[arg(long, value_name = "LEVEL")]
    pub same: Option<String>,
    /// With --same: prefer one group, but place anywhere when none has room.
    #[arg(long, requires = "same")]
    pub same_preferred: bool,
    /// The longest round trip (microseconds) from the VM's host to each of its GPUs' hosts.
    #[arg(long, value_name = "US")]
    pub max_rtt_us: Option<u32>,
    /// Prefer GPUs in the VM's innermost group, then the next level out.
    #[arg(long)]
    pub nearest: bool,
    /// Makes a retried launch return the same VM.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// When the GPUs are not there now, wait in the queue instead of failing (with --wait: shows
    /// the place in the queue until it starts).
    #[arg(long)]
    pub queue: bool,
    /// Queue priority: higher goes first (0 to the service's maximum, default 0).
    #[arg(long, default_value_t = 0)]
    pub priority: i32,
    /// Best effort: the VM's cGPUs may be taken back for launches of higher priority.
    #[arg(long)]
    pub preemptible: bool,
    /// With --preemptible: cGPUs taken back are not given back when capacity returns.
    #[arg(long, requires = "preemptible")]
    pub no_give_back: bool,
    #[command(flatten)]
    pub borrowing: Borrowing,
    /// Follow the launch stage by stage until the VM is ready (or fails).
    #[arg(long)]
    pub wait: bool,
}

#[derive(Debug, Args)]
pub struct Attach {
    /// The VM's id.
    pub id: String,
    /// Number of cGPUs to add.
    #[arg(long)]
    pub ncgpus: u32,
    /// GPU memory per cGPU in MiB (required in shared mode).
    #[arg(long)]
    pub poolmem: Option<u64>,
    /// exclusive: a whole GPU per cGPU (default); shared: GPUs shared with other VMs.
    #[arg(long, value_enum, default_value = "exclusive")]
    pub mode: Mode,
    /// Placement policy (default: the VM's).
    #[arg(long)]
    pub policy: Option<String>,
    /// Never put two of the VM's cGPUs (old or new) on one physical GPU.
    #[arg(long)]
    pub distinct_gpus: bool,
    /// Shared mode: each new cGPU's share of its GPU's SMs, percent (1-100).
    #[arg(long, value_name = "PERCENT")]
    pub compute_percent: Option<u32>,
    #[command(flatten)]
    pub borrowing: Borrowing,
    /// Makes a retried attach attach once.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// When the GPUs are not there now, wait in the queue instead of failing (with --wait: shows
    /// the place in the queue until it starts).
    #[arg(long)]
    pub queue: bool,
    /// Wait until the new cGPUs are live (or the attach failed).
    #[arg(long)]
    pub wait: bool,
}

/// The paper's options with a value, and their modern names.
const PAPER_OPTIONS: [(&str, &str); 5] = [
    ("ncgpus", "--ncgpus"),
    ("poolmem", "--poolmem"),
    ("mode", "--mode"),
    ("locality", "--locality"),
    ("id", ""),
];

/// Rewrites the dissertation's form (`-l`/`-t` with `-opt=value`, `--opt=value` or `-opt value`) into
/// the modern one; any other argument list is returned unchanged.
pub fn translate_paper_form(args: Vec<String>) -> Vec<String> {
    let Some(verb) = args.iter().skip(1).find_map(|a| match a.as_str() {
        "-l" | "--l" => Some("launch"),
        "-t" | "--t" => Some("terminate"),
        _ => None,
    }) else {
        return args;
    };
    let mut out = vec![args[0].clone(), verb.to_owned()];
    let mut rest = args.into_iter().skip(1).peekable();
    while let Some(arg) = rest.next() {
        if matches!(arg.as_str(), "-l" | "--l" | "-t" | "--t") {
            continue;
        }
        let bare = arg.trim_start_matches('-');
        let (name, value) = match bare.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (bare, None),
        };
        match PAPER_OPTIONS.iter().find(|(paper, _)| *paper == name) {
            Some((_, modern)) if arg.starts_with('-') => {
                let value = value.or_else(|| rest.next()).unwrap_or_default();
                if !modern.is_empty() {
                    out.push((*modern).to_owned());
                }
                out.push(value);
            }
            _ => out.push(arg),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn the_papers_form_becomes_the_modern_one() {
        assert_eq!(
            translate_paper_form(args(
                "gsaas -l -ncgpus=2 -poolmem=2048 -mode=shared -locality=local"
            )),
            args("gsaas launch --ncgpus 2 --poolmem 2048 --mode shared --locality local")
        );
        assert_eq!(translate_paper_form(args("gsaas -t -id=abc")), args("gsaas terminate abc"));
        assert_eq!(
            translate_paper_form(args("gsaas --t --id abc --wait")),
            args("gsaas terminate abc --wait")
        );
        assert_eq!(
            translate_paper_form(args("gsaas -l --ncgpus 2 --image cirros -f json")),
            args("gsaas launch --ncgpus 2 --image cirros -f json")
        );
        assert_eq!(translate_paper_form(args("gsaas list")), args("gsaas list"));
        assert_eq!(
            translate_paper_form(args("gsaas launch --ncgpus 1")),
            args("gsaas launch --ncgpus 1")
        );
    }

    #[test]
    fn clap_accepts_the_translation() {
        let cli = Cli::try_parse_from(translate_paper_form(args("gsaas -l -ncgpus=2"))).unwrap();
        let Command::Launch(launch) = cli.command else { panic!("not a launch") };
        assert_eq!(
            (launch.ncgpus, launch.mode, launch.locality),
            (2, Mode::Exclusive, Locality::Any)
        );
        Cli::command_for_tests().debug_assert();
    }

    impl Cli {
        fn command_for_tests() -> clap::Command {
            <Cli as clap::CommandFactory>::command()
        }
    }
}
