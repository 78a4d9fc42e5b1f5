//! Background work: each task is one file, runs on a timer and on demand (a trigger), is
//! idempotent (it takes no input and looks at everything each pass, so running it twice or on
//! several replicas at once is harmless) and reports what it did.
//!
//! - [`reconciler`]: the pass that converges whatever drifted, and calls the others below.
//! - [`drift`]: VMs whose servers were deleted or moved outside GSaaS.
//! - [`rehome`]: cGPUs moved off failed GPUs (and, on an admin's request, off evacuated ones).
//! - [`fences`]: fenced bookings released once their host's agent confirms.
//! - [`queue_rounds`]: the queue's rounds, which start what waits when capacity frees.
//! - [`revocations`]: revoked token ids reloaded on every replica.
//! - [`notifications`]: the notifications' outbox published to RabbitMQ (one replica at a time).
//! - [`usage_fold`]: the usage log folded into the spans reports read.

pub mod drift;
pub mod fences;
pub mod notifications;
pub mod queue_rounds;
pub mod reconciler;
pub mod rehome;
pub mod revocations;
pub mod usage_fold;
