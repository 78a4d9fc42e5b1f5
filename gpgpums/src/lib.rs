//! GPGPUMS, the GPU scheduling core of GSaaS (dissertation sections 4.3 and 5.2.1.2-5.2.1.3).
//!
//! Pure and synchronous on purpose: it decides, and the service executes. No I/O, no clock, no async, no
//! database, no randomness; the same inputs give the same placements. That makes every decision
//! testable on its own, replayable from storage, and cheap enough to sit inside a database transaction.
//!
//! - [`Pool`]: inventory (hosts, GPUs), bookings, and all-or-nothing placement of a VM's cGPUs.
//! - [`policy`]: the selection policies as plugins behind [`policy::Policy`], selected by name.
//! - [`quota`]: project limits and the ledger of what each project holds.
//! - [`queue`]: the order waiting requests start in, backfill, and preemption by shrinking.
//! - [`traits`]: what a GPU is beyond model and memory, and the constraints a request puts on it.
//! - [`remoting`]: the remote-GPU layers (rCUDA, LUPINE) a GPU's server may speak.
//! - [`seeded`]: a seeded generator for simulations and tests around the planner.
//! - [`replay`]: placement quality on a production trace (the FGD paper's experiment), any policy.
//! - [`topology`]: where a host sits in the network (the operator's levels and groups).
//! - [`Error`]: the crate's one error type.

pub mod booking;
pub mod error;
pub mod ids;
pub mod model;
pub mod policy;
pub mod pool;
pub mod queue;
pub mod quota;
pub mod remoting;
pub mod replay;
pub mod seeded;
pub mod topology;
pub mod traits;

pub use booking::{book_within_model_limits, Refusal};
pub use error::{Error, Shortfall};
pub use ids::{CohortName, GpuId, HostId, IdError, ProjectId, TicketId, VmId, MAX_NAME_LEN};
pub use model::{
    profile_name_problem, CgpuAssignment, GpuSpec, GpuUsage, HostKind, HostState, HostUsage,
    Locality, Mode, Partition, Placement, RcudaEndpoint, Request, Resources, UsageTotals, VmHost,
    MAX_CPU_MILLI, MAX_MEMORY_MIB, MAX_PROFILE_LEN,
};
pub use policy::{PolicyRegistry, DEFAULT_POLICY};
pub use pool::{
    Fragmentation, Pool, Rehome, Selector, SubsetStats, MAX_CGPUS_PER_VM, MAX_GPU_MEMORY_MIB,
};
pub use quota::{
    Admission, CohortTerms, Holding, Loan, ModelLimits, PoolSize, Quota, QuotaExceeded,
    QuotaLedger, Resource, Usage, MAX_MODEL_LIMITS,
};
pub use remoting::Remoting;
pub use topology::{topology_problem, NetworkConstraint, Strength, Topology, MAX_RTT_US};
pub use traits::{GpuAttributes, GpuConstraints, GpuKind, MajorMinor};
