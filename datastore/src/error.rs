//! The datastore's one error type: what a caller of the datastore may need to tell apart (a
//! value the store refuses, a conflict with what is stored, the database unavailable) and
//! everything else as internal. gsaasd maps it to its own error, and so to HTTP, in one place
//! (`impl From<gsaas_datastore::Error> for gsaasd::error::Error`).

type Source = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value the store cannot take (a backup's destination, the database's URL).
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    /// The write contradicts what is stored (a unique key taken, an idempotency key reused).
    #[error("{0}")]
    Conflict(String),
    /// The database (or its migrations) cannot serve now.
    #[error("{dependency} unavailable")]
    Unavailable {
        dependency: &'static str,
        #[source]
        source: Source,
    },
    /// A bug, or a stored value that is not valid.
    #[error("internal error")]
    Internal(#[source] Source),
}

impl Error {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid { field: field.into(), reason: reason.into() }
    }

    pub fn unavailable(dependency: &'static str, source: impl Into<Source>) -> Self {
        Error::Unavailable { dependency, source: source.into() }
    }

    pub fn internal(source: impl Into<Source>) -> Self {
        Error::Internal(source.into())
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                Error::unavailable("database", e)
            }
            sqlx::Error::Database(ref db) if db.code().is_some_and(|c| server_unavailable(&c)) => {
                Error::unavailable("database", e)
            }
            e => Error::internal(e),
        }
    }
}

/// Whether a SQLSTATE says the database server cannot serve now rather than that the statement is
/// wrong: a connection exception (class 08), insufficient resources (53: out of disk, memory or
/// connections), or operator intervention (57: a backend ended by an administrator or a shutdown).
fn server_unavailable(sqlstate: &str) -> bool {
    ["08", "53", "57"].iter().any(|class| sqlstate.starts_with(class))
}
