//! What a GPU is beyond its model and memory, and what a request may ask of it.
//!
//! Traits are named as OpenStack Placement names them, so operators use the vocabulary they already
//! use for Nova flavors. A name is accepted when it is
//! - one of os-traits' standard names (`data/os-traits.txt`, made by `scripts/os-traits.sh`);
//! - a CUDA compute capability or SDK version past the end of that list, spelt as the list spells
//!   them: os-traits 3.9.0 stops at `HW_GPU_CUDA_COMPUTE_CAPABILITY_V7_2` and `HW_GPU_CUDA_SDK_V10_0`,
//!   and `HW_GPU_CUDA_COMPUTE_CAPABILITY_V9_0` or `HW_GPU_CUDA_SDK_V12_4` follow its pattern;
//! - an operator's own: `CUSTOM_` and then `A-Z`, `0-9` and `_`, as Placement requires.
//!
//! A GPU's compute capability and its driver's CUDA version give it those two traits besides the
//! ones it is declared with ([`GpuAttributes::all_traits`]), so a request may name either; "at
//! least" is asked with [`GpuConstraints::min_compute_capability`] and `min_cuda_version`.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::remoting::Remoting;

/// Placement's limit on a trait name's length.
pub const MAX_TRAIT_NAME_LEN: usize = 255;
/// The most traits a GPU may carry, or one list of a request name.
pub const MAX_TRAITS: usize = 64;
/// The most models a request may list.
pub const MAX_MODELS: usize = 64;
/// The longest model name.
pub const MAX_MODEL_LEN: usize = 255;

/// Why `name` cannot be a GPU model's name, if it cannot.
pub fn model_name_problem(name: &str) -> Option<String> {
    let bad = name.is_empty() || name.len() > MAX_MODEL_LEN || name.chars().any(char::is_control);
    bad.then(|| format!("a model name must be 1 to {MAX_MODEL_LEN} printable characters"))
}

const OS_TRAITS: &str = include_str!("../data/os-traits.txt");
const CUSTOM: &str = "CUSTOM_";
const COMPUTE_CAPABILITY: &str = "HW_GPU_CUDA_COMPUTE_CAPABILITY_V";
const SDK: &str = "HW_GPU_CUDA_SDK_V";

/// os-traits' standard names, sorted.
fn standard_traits() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| OS_TRAITS.lines().filter(|l| !l.starts_with('#')).collect())
}

/// The os-traits release whose names are accepted.
pub fn os_traits_version() -> &'static str {
    OS_TRAITS
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("# os-traits "))
        .and_then(|rest| rest.split(':').next())
        .unwrap_or("unknown")
}

/// Why `name` is no trait name, or `None` when it is one (see the module docs).
pub fn trait_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("a trait name is empty".to_owned());
    }
    if name.len() > MAX_TRAIT_NAME_LEN {
        return Some(format!(
            "a trait name of {} characters is longer than {MAX_TRAIT_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(own) = name.strip_prefix(CUSTOM) {
        let allowed = |c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_';
        if !own.is_empty() && own.chars().all(allowed) {
            return None;
        }
        return Some(format!(
            "{name:?} is no custom trait name: CUSTOM_ must be followed by A-Z, 0-9 and _ only"
        ));
    }
    if standard_traits().binary_search(&name).is_ok() {
        return None;
    }
    let versioned = [COMPUTE_CAPABILITY, SDK].iter().any(|prefix| {
        name.strip_prefix(prefix).and_then(|v| v.split_once('_')).is_some_and(|(major, minor)| {
            [major, minor]
                .iter()
                .all(|n| !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit()))
                && (major.len() == 1 || !major.starts_with('0'))
        })
    });
    if versioned {
        return None;
    }
    let shown: String = name.chars().take(64).collect();
    Some(format!(
        "unknown trait {shown:?}: neither an os-traits {} name nor CUSTOM_ followed by A-Z, 0-9 \
         and _",
        os_traits_version()
    ))
}

/// A `major.minor` version: a CUDA compute capability (`8.0`) or CUDA version (`12.4`). Written
/// and read as that text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MajorMinor {
    pub major: u16,
    pub minor: u16,
}

impl MajorMinor {
    pub const fn new(major: u16, minor: u16) -> Self {
        MajorMinor { major, minor }
    }

    /// The compute-capability trait of a GPU of this capability.
    pub fn compute_capability_trait(self) -> String {
        format!("{COMPUTE_CAPABILITY}{}_{}", self.major, self.minor)
    }

    /// The SDK trait of a driver of this CUDA version.
    pub fn sdk_trait(self) -> String {
        format!("{SDK}{}_{}", self.major, self.minor)
    }
}

impl fmt::Display for MajorMinor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for MajorMinor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            let shown: String = s.chars().take(32).collect();
            format!("{shown:?} is not a version of the form major.minor (8.0, 12.4)")
        };
        let (major, minor) = s.split_once('.').ok_or_else(bad)?;
        let number = |n: &str| {
            if n.is_empty() || n.len() > 3 || !n.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            n.parse::<u16>().map_err(|_| bad())
        };
        Ok(MajorMinor { major: number(major)?, minor: number(minor)? })
    }
}

impl Serialize for MajorMinor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MajorMinor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What a GPU is besides its model and memory: what NVML reads or the inventory states.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GpuAttributes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<MajorMinor>,
    /// The highest CUDA version its driver supports (NVML's `cudaDriverVersion`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<MajorMinor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Its declared traits (see the module docs), sorted.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub traits: BTreeSet<String>,
    /// The remote-GPU layer its server speaks (rCUDA when not said: every GPU registered before
    /// layers were told apart).
    #[serde(default, skip_serializing_if = "Remoting::is_rcuda")]
    pub remoting: Remoting,
    /// Its host's agent runs its servers, one per cGPU, each held to its share (`[gpu_servers]
    /// managed`); otherwise one server per GPU, started by the operator.
    #[serde(default, skip_serializing_if = "is_false")]
    pub managed: bool,
    /// Its host runs MPS (`[gpu_servers] mps`), so its agent can hold each server to a compute
    /// share. Only a managed GPU can.
    #[serde(default, skip_serializing_if = "is_false")]
    pub mps: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl GpuAttributes {
    /// What an operator states of a GPU in a configuration file (the agent's `[[gpus]]`,
    /// gsaasd's `[[hosts.inventory]]`); its layer and whether its servers are managed come from
    /// its host, with its servers' endpoints.
    pub fn stated(
        compute_capability: Option<MajorMinor>,
        cuda_version: Option<MajorMinor>,
        uuid: Option<String>,
        traits: BTreeSet<String>,
    ) -> GpuAttributes {
        GpuAttributes { compute_capability, cuda_version, uuid, traits, ..GpuAttributes::default() }
    }

    /// The declared traits and those its compute capability and CUDA version give it.
    pub fn all_traits(&self) -> BTreeSet<String> {
        let mut all = self.traits.clone();
        all.extend(self.compute_capability.map(MajorMinor::compute_capability_trait));
        all.extend(self.cuda_version.map(MajorMinor::sdk_trait));
        all
    }

    /// Everything wrong with the attributes, as `(field, reason)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.traits.len() > MAX_TRAITS {
            problems.push((
                "traits",
                format!("{} traits are more than {MAX_TRAITS}", self.traits.len()),
            ));
        }
        problems.extend(
            self.traits.iter().filter_map(|t| trait_name_problem(t)).map(|p| ("traits", p)),
        );
        if self.mps && !self.managed {
            problems.push((
                "mps",
                "only a GPU whose agent runs its servers (managed) can give compute shares"
                    .to_owned(),
            ));
        }
        if let Some(uuid) = &self.uuid {
            let fine = |c: char| c.is_ascii_alphanumeric() || c == '-';
            if uuid.is_empty() || uuid.len() > 96 || !uuid.chars().all(fine) {
                problems.push(("uuid", "must be 1 to 96 letters, digits and dashes".to_owned()));
            }
        }
        problems
    }
}

/// What a request asks of its GPUs beyond memory and mode: hard constraints filter the GPUs,
/// soft ones rank those left before the policy decides among equals. Strengths as the device
/// preferences of the framework seed ("002"): required, preferred, allowed (unnamed), avoided,
/// forbidden.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct GpuConstraints {
    /// The remote-GPU layer every GPU's server must speak; any when unset. The API always sets
    /// it (the request's, or the configured default), so that all of a VM's cGPUs speak one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remoting: Option<Remoting>,
    /// One of these models, by exact name; any model when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Traits every GPU must have.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required: Vec<String>,
    /// Traits no GPU may have.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forbidden: Vec<String>,
    /// Traits a GPU ranks higher for, one step each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred: Vec<String>,
    /// Traits a GPU ranks lower for, one step each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_compute_capability: Option<MajorMinor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cuda_version: Option<MajorMinor>,
    /// Only GPUs whose host runs MPS: set for a request with a compute share (see
    /// [`crate::Request::gpu_constraints`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub compute_share: bool,
}

/// What a GPU offers to constraints: one per kind of GPU in a pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuKind {
    pub model: String,
    pub remoting: Remoting,
    pub compute_capability: Option<MajorMinor>,
    pub cuda_version: Option<MajorMinor>,
    /// [`GpuAttributes::all_traits`].
    pub traits: BTreeSet<String>,
    /// [`GpuAttributes::mps`].
    pub mps: bool,
}

impl GpuKind {
    pub fn of(model: &str, attributes: &GpuAttributes) -> Self {
        GpuKind {
            model: model.to_owned(),
            remoting: attributes.remoting,
            compute_capability: attributes.compute_capability,
            cuda_version: attributes.cuda_version,
            traits: attributes.all_traits(),
            mps: attributes.mps,
        }
    }
}

impl GpuConstraints {
    /// No constraint: any GPU, none ranked above another.
    pub const NONE: GpuConstraints = GpuConstraints {
        remoting: None,
        models: Vec::new(),
        required: Vec::new(),
        forbidden: Vec::new(),
        preferred: Vec::new(),
        avoid: Vec::new(),
        min_compute_capability: None,
        min_cuda_version: None,
        compute_share: false,
    };

    /// Whether it asks nothing (any GPU, no ranking).
    pub fn is_empty(&self) -> bool {
        *self == GpuConstraints::default()
    }

    /// Whether it ranks GPUs (preferred or avoided traits).
    pub fn ranks(&self) -> bool {
        !self.preferred.is_empty() || !self.avoid.is_empty()
    }

    /// Whether it filters GPUs (anything but ranking).
    pub fn filters(&self) -> bool {
        self.remoting.is_some()
            || !self.models.is_empty()
            || !self.required.is_empty()
            || !self.forbidden.is_empty()
            || self.min_compute_capability.is_some()
            || self.min_cuda_version.is_some()
            || self.compute_share
    }

    /// The hard constraints in the order a refusal names the first that no GPU meets: each
    /// with its request field, and whether `kind` meets it.
    pub fn hard_checks<'a>(
        &'a self,
        kind: &'a GpuKind,
    ) -> impl Iterator<Item = (&'static str, bool)> + 'a {
        let at_least = |have: Option<MajorMinor>, want: Option<MajorMinor>| match want {
            None => true,
            Some(want) => have.is_some_and(|have| have >= want),
        };
        [
            ("remoting", self.remoting.is_none_or(|r| r == kind.remoting)),
            ("gpu_model", self.models.is_empty() || self.models.contains(&kind.model)),
            (
                "min_compute_capability",
                at_least(kind.compute_capability, self.min_compute_capability),
            ),
            ("min_cuda_version", at_least(kind.cuda_version, self.min_cuda_version)),
            ("traits.required", self.required.iter().all(|t| kind.traits.contains(t))),
            ("traits.forbidden", !self.forbidden.iter().any(|t| kind.traits.contains(t))),
            ("compute_percent", !self.compute_share || kind.mps),
        ]
        .into_iter()
    }

    /// Whether a GPU of `kind` meets every hard constraint.
    pub fn admits(&self, kind: &GpuKind) -> bool {
        self.hard_checks(kind).all(|(_, met)| met)
    }

    /// How a GPU of `kind` ranks by the soft constraints: one up per preferred trait it has, one
    /// down per avoided one. Higher goes first.
    pub fn rank(&self, kind: &GpuKind) -> i32 {
        let count = |traits: &[String]| traits.iter().filter(|t| kind.traits.contains(*t)).count();
        count(&self.preferred) as i32 - count(&self.avoid) as i32
    }

    /// Everything wrong with the constraints on their own, before any pool is asked.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.models.len() > MAX_MODELS {
            problems.push((
                "gpu_model",
                format!("{} models are more than {MAX_MODELS}", self.models.len()),
            ));
        }
        if let Some(problem) = self.models.iter().find_map(|m| model_name_problem(m)) {
            problems.push(("gpu_model", problem));
        }
        let lists: [(&'static str, &[String]); 4] = [
            ("traits.required", &self.required),
            ("traits.forbidden", &self.forbidden),
            ("traits.preferred", &self.preferred),
            ("traits.avoid", &self.avoid),
        ];
        for (field, list) in lists {
            if list.len() > MAX_TRAITS {
                problems.push((field, format!("{} traits are more than {MAX_TRAITS}", list.len())));
                continue;
            }
            problems.extend(list.iter().filter_map(|t| trait_name_problem(t)).map(|p| (field, p)));
        }
        // A trait in two lists asks two things of one trait: contradictory or meaningless.
        for (i, (a, list_a)) in lists.iter().enumerate() {
            for (b, list_b) in &lists[i + 1..] {
                if let Some(both) = list_a.iter().find(|t| list_b.contains(t)) {
                    problems.push((a, format!("{both} is also in {b}")));
                }
            }
        }
        problems
    }
}
