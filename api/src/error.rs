//! gsaasd's one error type and its one mapping to HTTP.
//!
//! Every layer returns [`Error`]; only [`IntoResponse`] below knows status codes. Clients get an RFC 9457
//! problem document with a stable `code` and a message naming the field or cause; internals (SQL, file
//! paths, peer addresses) stay in the log, which records the whole source chain.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use gpgpums::Shortfall;
pub use gsaas_api_types::{FieldError, Problem, QuotaProblem};

tokio::task_local! {
    /// The id of the request this task serves (set by `http::requests::trace_requests`): every
    /// error answer names it.
    pub(crate) static REQUEST_ID: String;
}

/// The id of the request being served by this task, if any.
pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

type Source = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed (not JSON, wrong types): 400.
    #[error("{field}: {reason}")]
    Malformed { field: String, reason: String },
    /// The request is well-formed but fields' values are not acceptable: 422. Never empty: every
    /// invalid field of the request, so a client fixes them all at once.
    #[error("{}", FieldErrors(.0))]
    Invalid(Vec<FieldError>),
    /// No token, or a token that is malformed, expired or wrongly signed: 401.
    #[error("{0}")]
    Unauthenticated(String),
    /// The policy does not let the caller do this to something it may see: 403.
    #[error("{0}")]
    Forbidden(String),
    /// The thing does not exist, or the caller may not see it: 404.
    #[error("{kind}{}{id} not found", if id.is_empty() { "" } else { " " })]
    NotFound { kind: &'static str, id: String },
    /// The request body is too large: 413.
    #[error("{0}")]
    TooLarge(String),
    /// The request (its body) did not arrive in time: 408.
    #[error("{0}")]
    RequestTimeout(String),
    /// The client asked too often: 429.
    #[error("{0}")]
    TooManyRequests(String),
    /// The request contradicts the current state: 409.
    #[error("{0}")]
    Conflict(String),
    /// What the request was made against (its `If-Match` version) changed since: 409, with a code
    /// of its own, as Kubernetes answers a stale `resourceVersion` (a client reads again and
    /// retries; other conflicts need a person).
    #[error("{0}")]
    VersionConflict(String),
    /// The booking would take the project past a quota limit: 403.
    #[error("{0}")]
    QuotaExceeded(gpgpums::QuotaExceeded),
    /// A launch asks for a priority above its project's ceiling (its quota's `max_priority`):
    /// 403, as a quota.
    #[error(
        "priority {priority} is above the highest priority project {project} may ask for \
         (its quota's max_priority, {ceiling}); an admin may raise it"
    )]
    PriorityAboveCeiling { project: String, priority: i32, ceiling: u32 },
    /// Not enough GPU capacity now: 507.
    #[error("{0}")]
    InsufficientCapacity(Shortfall),
    /// A dependency (the cloud, a host agent, the database) is unavailable: 503.
    #[error("{dependency} unavailable")]
    Unavailable {
        dependency: &'static str,
        #[source]
        source: Source,
    },
    /// A bug: 500.
    #[error("internal error")]
    Internal(#[source] Source),
}

impl Error {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid(vec![FieldError { field: field.into(), detail: reason.into() }])
    }

    /// Every error of `errors`, or `Ok` when there is none.
    pub fn invalid_fields(errors: Vec<FieldError>) -> Result<(), Self> {
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(errors))
        }
    }

    pub fn unavailable(dependency: &'static str, source: impl Into<Source>) -> Self {
        Error::Unavailable { dependency, source: source.into() }
    }

    pub fn internal(source: impl Into<Source>) -> Self {
        Error::Internal(source.into())
    }

    pub fn vm_not_found(id: &impl ToString) -> Self {
        Error::NotFound { kind: "VM", id: id.to_string() }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Error::Malformed { .. } => StatusCode::BAD_REQUEST,
            Error::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Error::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Error::Forbidden(_) => StatusCode::FORBIDDEN,
            Error::NotFound { .. } => StatusCode::NOT_FOUND,
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Error::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            Error::Conflict(_) => StatusCode::CONFLICT,
            Error::VersionConflict(_) => StatusCode::CONFLICT,
            Error::QuotaExceeded(_) | Error::PriorityAboveCeiling { .. } => StatusCode::FORBIDDEN,
            Error::InsufficientCapacity(_) => StatusCode::INSUFFICIENT_STORAGE,
            Error::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Malformed { .. } => "malformed_request",
            Error::Invalid(_) => "invalid_request",
            Error::Unauthenticated(_) => "unauthenticated",
            Error::Forbidden(_) => "policy_not_allowed",
            Error::NotFound { .. } => "not_found",
            Error::TooLarge(_) => "body_too_large",
            Error::RequestTimeout(_) => "request_timeout",
            Error::TooManyRequests(_) => "rate_limited",
            Error::Conflict(_) => "conflict",
            Error::VersionConflict(_) => "version_conflict",
            Error::QuotaExceeded(_) | Error::PriorityAboveCeiling { .. } => "quota_exceeded",
            Error::InsufficientCapacity(_) => "insufficient_gpu_capacity",
            Error::Unavailable { .. } => "dependency_unavailable",
            Error::Internal(_) => "internal_error",
        }
    }

    /// The fields at fault, each with what is wrong with it.
    pub fn field_errors(&self) -> Vec<FieldError> {
        match self {
            Error::Malformed { field, reason } => {
                vec![FieldError { field: field.clone(), detail: reason.clone() }]
            }
            Error::Invalid(errors) => errors.clone(),
            Error::PriorityAboveCeiling { .. } => {
                vec![FieldError { field: "priority".into(), detail: self.to_string() }]
            }
            _ => Vec::new(),
        }
    }
}

impl From<gpgpums::Error> for Error {
    fn from(e: gpgpums::Error) -> Self {
        match e {
            gpgpums::Error::InvalidRequest { field, reason } => Error::invalid(field, reason),
            gpgpums::Error::InvalidInventory { field, reason } => Error::invalid(field, reason),
            gpgpums::Error::InsufficientCapacity(shortfall) => {
                Error::InsufficientCapacity(shortfall)
            }
            gpgpums::Error::Conflict(reason) => Error::Conflict(reason),
        }
    }
}

impl From<gpgpums::Refusal> for Error {
    fn from(e: gpgpums::Refusal) -> Self {
        match e {
            gpgpums::Refusal::Quota(e) => e.into(),
            gpgpums::Refusal::Pool(e) => e.into(),
        }
    }
}

impl From<gpgpums::QuotaExceeded> for Error {
    fn from(e: gpgpums::QuotaExceeded) -> Self {
        Error::QuotaExceeded(e)
    }
}

impl From<gsaas_datastore::Error> for Error {
    fn from(e: gsaas_datastore::Error) -> Self {
        match e {
            gsaas_datastore::Error::Invalid { field, reason } => Error::invalid(field, reason),
            gsaas_datastore::Error::Conflict(reason) => Error::Conflict(reason),
            gsaas_datastore::Error::Unavailable { dependency, source } => {
                Error::Unavailable { dependency, source }
            }
            gsaas_datastore::Error::Internal(source) => Error::Internal(source),
        }
    }
}

/// Displays field errors as `a: why; b: why`.
struct FieldErrors<'a>(&'a [FieldError]);

impl std::fmt::Display for FieldErrors<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.field, e.detail)?;
        }
        Ok(())
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            Error::Internal(_) => {
                tracing::error!(error = format!("{:#}", ErrorChain(&self)), "request failed")
            }
            Error::Unavailable { .. } => {
                tracing::warn!(error = format!("{:#}", ErrorChain(&self)), "dependency unavailable")
            }
            _ => tracing::debug!(error = %self, "request refused"),
        }
        let errors = self.field_errors();
        let problem = Problem {
            type_uri: "about:blank".into(),
            title: status.canonical_reason().unwrap_or("Error").into(),
            status: status.as_u16(),
            detail: self.to_string(),
            code: self.code().into(),
            field: errors.first().map(|e| e.field.clone()),
            errors,
            quota: match &self {
                Error::QuotaExceeded(e) => Some(QuotaProblem {
                    resource: e.resource.as_str().to_owned(),
                    model: e.model.clone(),
                    limit: e.limit,
                    in_use: e.in_use,
                    requested: e.requested,
                    cohort: e.cohort.as_ref().map(ToString::to_string),
                    on_loan: e.on_loan,
                }),
                _ => None,
            },
            request_id: current_request_id(),
        };
        let body = serde_json::to_vec(&problem).expect("problem serializes");
        (status, [(header::CONTENT_TYPE, "application/problem+json")], body).into_response()
    }
}

pub use gsaas_infra::ErrorChain;
