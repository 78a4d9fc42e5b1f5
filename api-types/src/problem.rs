//! Problem documents (RFC 9457): every error gsaasd answers.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One invalid field of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FieldError {
    /// The field's path in the request (`ncgpus`, `networks[2]`, `gpus[0].rcuda.port`), or
    /// `body`, `query` or a header's name.
    pub field: String,
    /// What is wrong with it.
    pub detail: String,
}

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// `about:blank` or a URI naming the problem type.
    #[serde(rename = "type")]
    pub type_uri: String,
    pub title: String,
    pub status: u16,
    /// What went wrong, naming the field or cause.
    pub detail: String,
    /// Stable machine-readable code.
    pub code: String,
    /// The first request field at fault, when there is one (`errors` lists them all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// With `invalid_request` and `malformed_request`: every field at fault.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// With `quota_exceeded`: the limit the request would pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaProblem>,
    /// The request's id, as in its `X-Request-Id` header and gsaasd's log lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// The quota a refused request would exceed (Nova's convention).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct QuotaProblem {
    /// `cgpus`, `memory_mib`, `exclusive_gpus` or `vms`.
    pub resource: String,
    /// The GPU model whose limit it is; absent: the project's total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub limit: u64,
    pub in_use: u64,
    pub requested: u64,
    /// The cohort whose lending `limit` includes (the request asked to borrow); absent: the
    /// project's own limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort: Option<String>,
    /// `limit` and `in_use` count what the project holds on loan of `model` (its
    /// `borrowing_limit_by_model` in `cohort`), not all it holds of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_loan: bool,
}
