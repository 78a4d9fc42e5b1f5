//! The datastore's connections and write transactions, which never leave the crate (except to
//! its own tests', with the `testing` feature): other crates reach the database through [`Db`]'s
//! and [`PoolChange`]'s methods only.

use sqlx::any::AnyTransactionManager;
use sqlx::{AnyConnection, TransactionManager};

use crate::Error;
#[cfg(doc)]
use crate::{Db, PoolChange};

/// A connection of the process, held until dropped.
#[derive(Debug)]
pub enum Conn {
    Pooled(sqlx::pool::PoolConnection<sqlx::Any>),
    One(OneConn),
}

/// SQLite's one connection, taken: its release tells the checkpointer there may be a log to copy
/// (see [`crate::checkpoint`]).
#[derive(Debug)]
pub struct OneConn {
    pub(crate) conn: tokio::sync::OwnedMutexGuard<AnyConnection>,
    pub(crate) used: std::sync::Arc<tokio::sync::Notify>,
}

impl Drop for OneConn {
    fn drop(&mut self) {
        self.used.notify_one();
    }
}

impl Conn {
    /// Whether this connection is one of a pool's, which its holder may keep between uses
    /// without keeping others waiting (SQLite's single connection must be let go).
    pub fn is_pooled(&self) -> bool {
        matches!(self, Conn::Pooled(_))
    }
}

impl std::ops::Deref for Conn {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::One(one) => &one.conn,
        }
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::One(one) => &mut one.conn,
        }
    }
}

/// A write transaction; dropped uncommitted, it is rolled back (as sqlx's `Transaction` is: the
/// rollback is queued on the connection ahead of its next use).
#[derive(Debug)]
pub struct WriteTx {
    /// Always `Some` until [`WriteTx::commit_keeping`] takes it back.
    pub(crate) conn: Option<Conn>,
    pub(crate) open: bool,
}

impl WriteTx {
    pub async fn commit(self) -> Result<(), Error> {
        self.commit_keeping().await.map(drop)
    }

    /// Commits and hands the connection back, for a caller that keeps one (see
    /// [`Conn::is_pooled`]). On an error the connection goes back to its pool instead.
    pub async fn commit_keeping(mut self) -> Result<Conn, Error> {
        AnyTransactionManager::commit(&mut self).await?;
        self.open = false;
        Ok(self.conn.take().expect("held until committed"))
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if self.open {
            AnyTransactionManager::start_rollback(self);
        }
    }
}

impl std::ops::Deref for WriteTx {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        self.conn.as_ref().expect("held until committed")
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        self.conn.as_mut().expect("held until committed")
    }
}
