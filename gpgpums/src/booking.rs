//! Booking within a project's limits per GPU model: the request narrowed to the models its
//! project still has room on ([`QuotaLedger::within_model_limits`]), booked on the pool, and the
//! refusal that says why when it cannot be. The service's bookings and the queue planner both
//! book this way. (Apart from [`crate::quota`], which knows no pool, and [`crate::pool`], which
//! knows no quota.)

use std::borrow::Cow;

use crate::error::{Error, Shortfall};
use crate::ids::ProjectId;
use crate::model::Request;
use crate::pool::Pool;
use crate::quota::{QuotaExceeded, QuotaLedger};

/// Why something could not be booked within a project's limits: a limit, or the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Quota(QuotaExceeded),
    Pool(Error),
}

/// Books `request` for `project` with `book` on the models its limits per model leave it
/// ([`QuotaLedger::within_model_limits`], the fleet's models from `pool`). Where taking models out
/// leaves a request that could never be placed while the whole one could
/// (`could_ever`), the refusal is the quota's; otherwise it is the pool's, as for the
/// request as asked. Books nothing when it refuses; the caller still charges what is booked
/// ([`QuotaLedger::charge`]), which checks the limits again on what was placed.
pub fn book_within_model_limits<T>(
    quotas: &QuotaLedger,
    project: &ProjectId,
    request: &Request,
    pool: &mut Pool,
    could_ever: impl FnOnce(&mut Pool, &Request) -> bool,
    mut book: impl FnMut(&mut Pool, &Request) -> Result<T, Error>,
) -> Result<T, Refusal> {
    let narrowed =
        quotas.within_model_limits(project, request, pool.models()).map_err(Refusal::Quota)?;
    let Cow::Owned(narrowed) = narrowed else {
        return book(pool, request).map_err(Refusal::Pool);
    };
    match book(pool, &narrowed) {
        Ok(booked) => Ok(booked),
        Err(Error::InvalidRequest { .. })
        | Err(Error::InsufficientCapacity(Shortfall { never_fits: true, .. })) => {
            if could_ever(pool, request) {
                let first = quotas.first_blocked(project, request, &narrowed);
                Err(Refusal::Quota(first.expect("a model was taken out for a limit")))
            } else {
                // As asked, it never fits either: the pool says why.
                book(pool, request).map_err(Refusal::Pool)
            }
        }
        Err(e) => Err(Refusal::Pool(e)),
    }
}
