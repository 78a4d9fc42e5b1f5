//! The FGD paper's placement-quality experiment on a GPU-sharing trace, for every policy the
//! replay knows ([`gpgpums::replay`]): the GPU allocation ratio when the GPU asked reaches 100% and
//! 130% of the cluster's, mean and standard deviation over the seeds, beside the published rows
//! where the trace is one of the published ones; optionally the curves as an SVG plot.
//!
//! ```text
//! cargo run --release -p gpgpums --example openb -- [--nodes FILE] [--pods FILE]
//!     [--seeds 42-51|42,43,...] [--inflation 1.3] [--mode local|remote|pool|pool-local|both|all]
//!     [--policies paper-random,paper-best-fit,paper-fgd,frag-strand] [--format table|json] [--plot FILE.svg]
//!     [--published FILE|none]
//! ```
//!
//! Defaults: the copies in `gpgpums/data/openb/` (the 1,213 GPU nodes, the default pod list),
//! seeds 42 to 51, 130%, local mode, every policy. `--format json` prints one object per policy
//! and mode, a line each. `pool` replays through GSaaS's own pool and policies
//! ([`gpgpums::replay::pool`]: first-fit, best-fit, least-load-fit, fewer-jobs-gpu, frag-gradient
//! unless `--policies` names others), GPUs anywhere; `pool-local` the same with every pod a
//! `local` VM whose node's CPU and memory bind; `both` is local and remote, `all` the four.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpgpums::replay::cluster::{Cluster, Mode};
use gpgpums::replay::fragmentation::{TypicalPods, TYPICAL_COVERAGE};
use gpgpums::replay::paper::{PaperBestFit, PaperFgd, PaperRandom};
use gpgpums::replay::pool::{replay_pool, PoolMode};
use gpgpums::replay::strand::FragStrand;
use gpgpums::replay::trace::{parse_nodes, parse_pods, TraceNode, TracePod};
use gpgpums::replay::{mean_sd, replay, workload, Course, Placer};

mod svg;

const POLICIES: [&str; 4] = ["paper-random", "paper-best-fit", "paper-fgd", "frag-strand"];
/// GSaaS's policies that pool mode replays unless told others.
const POOL_POLICIES: [&str; 5] =
    ["first-fit", "best-fit", "least-load-fit", "fewer-jobs-gpu", "frag-gradient"];

/// How a replay places: on the trace's cluster (local or remote mode) or through GSaaS's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Cluster(Mode),
    Pool(PoolMode),
}

impl Run {
    fn name(self) -> &'static str {
        match self {
            Run::Cluster(mode) => mode.name(),
            Run::Pool(PoolMode::Anywhere) => "pool",
            Run::Pool(PoolMode::Local) => "pool-local",
        }
    }

    /// The policies it replays by default, and the names it knows.
    fn policies(self) -> Vec<String> {
        let names: &[&str] = match self {
            Run::Cluster(_) => &POLICIES,
            Run::Pool(_) => &POOL_POLICIES,
        };
        names.iter().map(|p| (*p).to_owned()).collect()
    }

    fn knows(self, policy: &str) -> bool {
        match self {
            Run::Cluster(_) => POLICIES.contains(&policy),
            Run::Pool(_) => gpgpums::PolicyRegistry::builtin().resolve(policy).is_ok(),
        }
    }
}
/// Most seeds one run takes.
const MAX_SEEDS: usize = 1000;

struct Args {
    nodes: PathBuf,
    pods: PathBuf,
    seeds: Vec<u64>,
    inflation: f64,
    modes: Vec<Run>,
    /// None: each mode's own.
    policies: Option<Vec<String>>,
    json: bool,
    plot: Option<PathBuf>,
    published: Option<PathBuf>,
}

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/openb").join(file)
}

fn parse_seeds(text: &str) -> Result<Vec<u64>, String> {
    let mut seeds = Vec::new();
    for part in text.split(',') {
        let number = |t: &str| t.trim().parse::<u64>().map_err(|_| format!("`{t}` is not a seed"));
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if b < a || b - a >= MAX_SEEDS as u64 {
                    return Err(format!("{part}: a range of 1 to {MAX_SEEDS} seeds, low to high"));
                }
                seeds.extend(a..=b);
            }
            None => seeds.push(number(part)?),
        }
    }
    if seeds.is_empty() || seeds.len() > MAX_SEEDS {
        return Err(format!("1 to {MAX_SEEDS} seeds"));
    }
    Ok(seeds)
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        nodes: data("openb_node_list_gpu_node.csv"),
        pods: data("openb_pod_list_default.csv"),
        seeds: (42..=51).collect(),
        inflation: 1.3,
        modes: vec![Run::Cluster(Mode::Local)],
        policies: None,
        json: false,
        plot: None,
        published: Some(data("fgd_published_allocation.csv")),
    };
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nodes" => args.nodes = value.into(),
            "--pods" => args.pods = value.into(),
            "--seeds" => args.seeds = parse_seeds(&value).map_err(|e| format!("--seeds: {e}"))?,
            "--inflation" => {
                args.inflation = value
                    .parse()
                    .ok()
                    .filter(|i: &f64| (0.01..=10.0).contains(i))
                    .ok_or_else(|| format!("--inflation {value}: a ratio from 0.01 to 10"))?;
            }
            "--mode" => {
                let (local, remote) = (Run::Cluster(Mode::Local), Run::Cluster(Mode::Remote));
                args.modes = match value.as_str() {
                    "both" => vec![local, remote],
                    "all" => vec![
                        local,
                        remote,
                        Run::Pool(PoolMode::Anywhere),
                        Run::Pool(PoolMode::Local),
                    ],
                    "pool" => vec![Run::Pool(PoolMode::Anywhere)],
                    "pool-local" => vec![Run::Pool(PoolMode::Local)],
                    m => vec![Run::Cluster(Mode::parse(m).ok_or_else(|| {
                        format!("--mode {value}: local, remote, pool, pool-local, both or all")
                    })?)],
                }
            }
            "--policies" => {
                args.policies = Some(value.split(',').map(str::to_owned).collect());
            }
            "--format" => {
                args.json = match value.as_str() {
                    "json" => true,
                    "table" => false,
                    _ => return Err(format!("--format {value}: table or json")),
                }
            }
            "--plot" => args.plot = Some(value.into()),
            "--published" => args.published = (value != "none").then(|| value.into()),
            _ => {
                return Err(format!(
                    "unknown flag {flag} (use --nodes, --pods, --seeds, --inflation, --mode, \
                     --policies, --format, --plot, --published)"
                ))
            }
        }
    }
    if let Some(policies) = &args.policies {
        for run in &args.modes {
            if let Some(bad) = policies.iter().find(|p| !run.knows(p)) {
                return Err(format!(
                    "--policies: `{bad}` is not a policy of {} mode (known: {}{})",
                    run.name(),
                    run.policies().join(", "),
                    if matches!(run, Run::Pool(_)) { ", and every GSaaS policy" } else { "" }
                ));
            }
        }
    }
    Ok(args)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn placer(name: &str, pods: &[TracePod]) -> Box<dyn Placer> {
    match name {
        "paper-random" => Box::new(PaperRandom),
        "paper-best-fit" => Box::new(PaperBestFit),
        "paper-fgd" => Box::new(PaperFgd::new(TypicalPods::of(pods, TYPICAL_COVERAGE))),
        "frag-strand" => Box::new(FragStrand::new(TypicalPods::of(pods, TYPICAL_COVERAGE))),
        _ => unreachable!("checked with the arguments"),
    }
}

/// The published per-seed rows of `trace` (the pod list's file name without `.csv`), by policy.
fn published(path: &Path, trace: &str) -> Result<BTreeMap<String, Vec<(f64, f64)>>, String> {
    let text = read(path)?;
    let mut rows: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let fields: Vec<&str> = line.split(',').collect();
        let [workload, policy, _seed, at_100, at_130] = fields[..] else {
            return Err(format!("{}: line {}: 5 fields expected", path.display(), i + 1));
        };
        if workload != trace {
            continue;
        }
        let number = |t: &str| {
            t.parse::<f64>().map_err(|_| format!("{}: line {}: `{t}`", path.display(), i + 1))
        };
        rows.entry(policy.to_owned()).or_default().push((number(at_100)?, number(at_130)?));
    }
    Ok(rows)
}

struct Outcome {
    policy: String,
    mode: Run,
    courses: Vec<(u64, Course)>,
    seconds: f64,
}

fn run(args: &Args, nodes: &[TraceNode], pods: &[TracePod]) -> Vec<Outcome> {
    let capacity = Cluster::new(nodes, Mode::Local).capacity_milli;
    let workloads: Vec<_> = args
        .seeds
        .iter()
        .map(|&seed| (seed, workload(pods, nodes.len(), capacity, args.inflation, seed)))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let mut outcomes = Vec::new();
    for mode in &args.modes {
        for policy in &args.policies.clone().unwrap_or_else(|| mode.policies()) {
            let started = Instant::now();
            let next = std::sync::atomic::AtomicUsize::new(0);
            let results = std::sync::Mutex::new(Vec::new());
            std::thread::scope(|scope| {
                for _ in 0..threads {
                    scope.spawn(|| loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((seed, work)) = workloads.get(i) else { break };
                        let course = match *mode {
                            Run::Cluster(mode) => {
                                let mut placer = placer(policy, pods);
                                replay(nodes, pods, work, mode, placer.as_mut(), *seed)
                            }
                            Run::Pool(how) => replay_pool(nodes, pods, work, policy, how)
                                .unwrap_or_else(|e| panic!("{policy} in pool mode: {e}")),
                        };
                        results.lock().unwrap().push((*seed, course));
                    });
                }
            });
            let mut courses = results.into_inner().unwrap();
            courses.sort_by_key(|(seed, _)| *seed);
            outcomes.push(Outcome {
                policy: policy.clone(),
                mode: *mode,
                courses,
                seconds: started.elapsed().as_secs_f64(),
            });
        }
    }
    outcomes
}

fn at(outcome: &Outcome, percent: u32) -> Vec<f64> {
    outcome.courses.iter().filter_map(|(_, c)| c.allocation_at(percent)).collect()
}

/// The published policy a replayed one reproduces.
fn published_name(policy: &str) -> Option<&'static str> {
    match policy {
        "paper-random" => Some("Random"),
        "paper-best-fit" => Some("BestFit"),
        "paper-fgd" => Some("FGD"),
        _ => None,
    }
}

fn table(args: &Args, trace: &str, outcomes: &[Outcome], rows: &BTreeMap<String, Vec<(f64, f64)>>) {
    println!(
        "\nGPU allocation ratio (%) on {trace}, nodes of {}, seeds {}, inflated to {:.0}%; mean ± sd over the seeds\n",
        args.nodes.file_name().map_or_else(|| args.nodes.display().to_string(), |n| n.to_string_lossy().into_owned()),
        seed_list(&args.seeds),
        args.inflation * 100.0
    );
    println!("| policy | mode | at 100% asked | at 130% asked | published at 100% / 130% | pods dropped (mean) | s |");
    println!("|---|---|---|---|---|---|---|");
    for o in outcomes {
        let (m100, s100) = mean_sd(&at(o, 100));
        let (m130, s130) = mean_sd(&at(o, 130));
        let published = published_name(&o.policy)
            .and_then(|p| rows.get(p))
            .filter(|_| o.mode == Run::Cluster(Mode::Local))
            .map_or("-".to_owned(), |r| {
                let a: Vec<f64> = r.iter().map(|x| x.0).collect();
                let b: Vec<f64> = r.iter().map(|x| x.1).collect();
                format!("{:.2} / {:.2}", mean_sd(&a).0, mean_sd(&b).0)
            });
        let dropped =
            o.courses.iter().map(|(_, c)| c.dropped as f64).sum::<f64>() / o.courses.len() as f64;
        println!(
            "| {} | {} | {m100:.2} ± {s100:.2} | {m130:.2} ± {s130:.2} | {published} | {dropped:.0} | {:.1} |",
            o.policy,
            o.mode.name(),
            o.seconds
        );
    }
    if !rows.is_empty() {
        println!("\nPublished (the FGD paper's simulator, 10 seeds, local mode):\n");
        println!("| policy | at 100% | at 130% |");
        println!("|---|---|---|");
        for (policy, r) in rows {
            let a: Vec<f64> = r.iter().map(|x| x.0).collect();
            let b: Vec<f64> = r.iter().map(|x| x.1).collect();
            println!("| {policy} | {:.2} | {:.2} |", mean_sd(&a).0, mean_sd(&b).0);
        }
    }
}

fn seed_list(seeds: &[u64]) -> String {
    let contiguous = seeds.windows(2).all(|w| w[1] == w[0] + 1);
    if contiguous && seeds.len() > 2 {
        format!("{}-{}", seeds[0], seeds[seeds.len() - 1])
    } else {
        seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
    }
}

/// `value` to `places` decimals (the published figures have 2).
fn round(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

fn json(trace: &str, args: &Args, outcomes: &[Outcome]) {
    for o in outcomes {
        let (m100, s100) = mean_sd(&at(o, 100));
        let (m130, s130) = mean_sd(&at(o, 130));
        let per_seed: Vec<serde_json::Value> = o
            .courses
            .iter()
            .map(|(seed, c)| {
                serde_json::json!({
                    "seed": seed,
                    "alloc_100": c.allocation_at(100).map(|a| round(a, 2)),
                    "alloc_130": c.allocation_at(130).map(|a| round(a, 2)),
                    "placed": c.placed,
                    "dropped": c.dropped,
                })
            })
            .collect();
        let object = serde_json::json!({
            "policy": o.policy,
            "mode": o.mode.name(),
            "trace": trace,
            "inflation": args.inflation,
            "seeds": args.seeds,
            "alloc_100": round(m100, 2),
            "alloc_100_sd": round(s100, 3),
            "alloc_130": round(m130, 2),
            "alloc_130_sd": round(s130, 3),
            "per_seed": per_seed,
        });
        println!("{object}");
    }
}

/// The mean curve of each outcome: allocation against GPU asked, in percent.
fn plot(path: &Path, trace: &str, outcomes: &[Outcome], to: u32) -> Result<(), String> {
    const W: f64 = 780.0;
    const H: f64 = 440.0;
    const LEFT: f64 = 60.0;
    const BOTTOM: f64 = 50.0;
    const TOP: f64 = 30.0;
    const RIGHT: f64 = 260.0;
    // Where the policies part: from 60% asked, 75-100% allocated.
    let (x_lo, y_lo, y_hi) = (60u32.min(to), 75.0, 100.0);
    let x = |p: f64| LEFT + (p - f64::from(x_lo)) / f64::from(to - x_lo) * (W - LEFT - RIGHT);
    let y = |a: f64| H - BOTTOM - (a - y_lo) / (y_hi - y_lo) * (H - BOTTOM - TOP);
    let mut svg = svg::open(W, H, LEFT, &format!("GPU allocation on {trace} (mean over seeds)"));
    for tick in (x_lo..=to).step_by(10) {
        let px = x(f64::from(tick));
        let _ = writeln!(
            svg,
            r##"<line x1="{px}" y1="{}" x2="{px}" y2="{}" stroke="#ddd"/><text x="{px}" y="{}" text-anchor="middle">{tick}</text>"##,
            y(y_lo),
            y(y_hi),
            y(y_lo) + 16.0
        );
    }
    for tick in (75..=100).step_by(5) {
        let py = y(f64::from(tick));
        let _ = writeln!(
            svg,
            r##"<line x1="{}" y1="{py}" x2="{}" y2="{py}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{tick}</text>"##,
            x(f64::from(x_lo)),
            x(f64::from(to)),
            x(f64::from(x_lo)) - 6.0,
            py + 4.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">GPU asked so far (% of the cluster's)</text>"#,
        x(f64::from(x_lo + to) / 2.0),
        H - 12.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">GPU allocated (%)</text>"#,
        y(87.5)
    );
    for (i, o) in outcomes.iter().enumerate() {
        let mut sums: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
        for (_, course) in &o.courses {
            for (p, a) in course.curve(to) {
                let e = sums.entry(p).or_default();
                e.0 += a;
                e.1 += 1;
            }
        }
        let points: Vec<String> = sums
            .iter()
            .filter(|(p, (sum, n))| **p >= x_lo && sum / f64::from(*n) >= y_lo)
            .map(|(p, (sum, n))| format!("{:.1},{:.1}", x(f64::from(*p)), y(sum / f64::from(*n))))
            .collect();
        // One colour per policy; remote mode dashed, pool mode dotted, pool-local dash-dotted.
        let policy = outcomes.iter().position(|p| p.policy == o.policy).unwrap_or(i);
        let colour = svg::COLOURS[policy % svg::COLOURS.len()];
        let dash = match o.mode {
            Run::Cluster(Mode::Local) => "",
            Run::Cluster(Mode::Remote) => r#" stroke-dasharray="6 3""#,
            Run::Pool(PoolMode::Anywhere) => r#" stroke-dasharray="2 2""#,
            Run::Pool(PoolMode::Local) => r#" stroke-dasharray="8 3 2 3""#,
        };
        svg::line(&mut svg, colour, 1.5, dash, &points);
        let (m130, _) = mean_sd(&at(o, 130));
        let label = format!("{} ({}) {m130:.2}", o.policy, o.mode.name());
        svg::legend(&mut svg, W - RIGHT + 15.0, TOP + 20.0 + i as f64 * 18.0, colour, dash, &label);
    }
    svg::save(svg, path)
}

fn main() {
    let result = (|| -> Result<(), String> {
        let args = parse_args()?;
        let nodes = parse_nodes(&read(&args.nodes)?)
            .map_err(|e| format!("{}: {e}", args.nodes.display()))?;
        if nodes.iter().all(|n| n.gpus == 0) {
            return Err(format!("{}: no node has a GPU", args.nodes.display()));
        }
        let pods =
            parse_pods(&read(&args.pods)?).map_err(|e| format!("{}: {e}", args.pods.display()))?;
        let trace = args
            .pods
            .file_stem()
            .map_or_else(|| "pods".to_owned(), |s| s.to_string_lossy().into_owned());
        let rows = match &args.published {
            Some(path) if path.exists() => published(path, &trace)?,
            _ => BTreeMap::new(),
        };
        let outcomes = run(&args, &nodes, &pods);
        if args.json {
            json(&trace, &args, &outcomes);
        } else {
            table(&args, &trace, &outcomes, &rows);
        }
        if let Some(path) = &args.plot {
            let to = (args.inflation * 100.0).round() as u32;
            plot(path, &trace, &outcomes, to)?;
            eprintln!("plot: {}", path.display());
        }
        Ok(())
    })();
    if let Err(e) = result {
        eprintln!("openb: {e}");
        std::process::exit(2);
    }
}
