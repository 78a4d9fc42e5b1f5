//! What the examples' synthetic traces share: the dissertation's applications (Table 4.1), the
//! policies compared, and the command line (`--requests N --load L --seed S`).

/// Table 4.1: the applications' GPU memory (MB, used as MiB).
pub const APPS: [(&str, u64); 6] = [
    ("GPU-Blast", 1599),
    ("LAMMPS", 876),
    ("mCUDA-MEME", 151),
    ("BarraCUDA", 3319),
    ("MUMmerGPU", 2104),
    ("GPU-LIBSVM", 145),
];
pub const POLICIES: [&str; 6] = [
    "first-fit",
    "best-fit",
    "least-load-fit",
    "fewer-jobs-gpu",
    "fewer-jobs-node",
    "frag-gradient",
];

pub struct Args {
    pub requests: usize,
    pub load: f64,
    pub seed: u64,
    /// `--openb PODS.csv`: replay this trace's pods at their own times instead (simulate only).
    pub openb: Option<std::path::PathBuf>,
    /// `--plot FILE.svg`: where to draw what was replayed (simulate only).
    pub plot: Option<std::path::PathBuf>,
    /// `--squeeze K`: the gaps between the trace's arrivals K times shorter (simulate only).
    pub squeeze: f64,
    /// `--cluster-share F`: replay on this share of the trace's nodes, drawn by the seed.
    pub cluster_share: f64,
    /// `--cohorts F`: compare quotas as walls with one cohort of every project, F of the
    /// requests coming from half the projects (simulate only).
    pub cohorts: Option<f64>,
}

impl Args {
    pub fn new(requests: usize, load: f64, seed: u64) -> Self {
        Args {
            requests,
            load,
            seed,
            openb: None,
            plot: None,
            squeeze: 1.0,
            cluster_share: 1.0,
            cohorts: None,
        }
    }
}

/// The command line over `defaults`; a bad one prints why and exits with status 2. `trace_flags`:
/// whether `--openb` and `--plot` are taken.
pub fn args_or_exit(defaults: Args, trace_flags: bool) -> Args {
    match parse_args(defaults).and_then(|args| {
        let trace_only = args.squeeze != 1.0 || args.cluster_share != 1.0;
        let simulator_only = args.openb.is_some() || args.plot.is_some() || args.cohorts.is_some();
        if !trace_flags && (simulator_only || trace_only) {
            return Err(
                "--openb, --squeeze, --cluster-share, --plot and --cohorts are the simulator's"
                    .into(),
            );
        }
        if args.openb.is_none() && trace_only {
            return Err("--squeeze and --cluster-share apply to an --openb trace".into());
        }
        Ok(args)
    }) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}

fn parse_args(mut args: Args) -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--requests" => args.requests = value.parse().map_err(|e| bad(&e))?,
            "--load" => args.load = value.parse().map_err(|e| bad(&e))?,
            "--seed" => args.seed = value.parse().map_err(|e| bad(&e))?,
            "--openb" => args.openb = Some(value.into()),
            "--plot" => args.plot = Some(value.into()),
            "--cluster-share" => {
                args.cluster_share = value
                    .parse()
                    .ok()
                    .filter(|f: &f64| *f > 0.0 && *f <= 1.0)
                    .ok_or_else(|| bad(&"a share above 0, at most 1"))?
            }
            "--cohorts" => {
                args.cohorts = Some(
                    value
                        .parse()
                        .ok()
                        .filter(|f: &f64| (0.0..=1.0).contains(f))
                        .ok_or_else(|| bad(&"a share from 0 to 1"))?,
                )
            }
            "--squeeze" => {
                args.squeeze = value
                    .parse()
                    .ok()
                    .filter(|k: &f64| (1.0..=1e9).contains(k))
                    .ok_or_else(|| bad(&"a factor from 1 to 1e9"))?
            }
            _ => {
                return Err(format!(
                    "unknown flag {flag} (use --requests, --load, --seed, --openb, --squeeze, --cluster-share, --plot, --cohorts)"
                ))
            }
        }
    }
    if args.requests == 0 || !(args.load > 0.0 && args.load < 10.0) {
        return Err("--requests must be positive and --load in (0, 10)".into());
    }
    Ok(args)
}
