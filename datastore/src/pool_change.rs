//! A pool change: the one transaction in which every change of bookings or inventory is decided
//! and written. It begins by bumping the pool generation, which orders such transactions across
//! replicas (the row lock is held until it ends), and says what the caller needs to decide: the
//! new generation (to tell whether its in-memory pool is current; [`PoolChange::read_pool_rows`]
//! reloads it otherwise) and the queue's head. The caller decides on its pool and writes through
//! the change's methods ([`crate::queries`]); [`PoolChange::commit`] ends it. Dropped without a
//! commit, it rolls back.
//!
//! Pool changes run one at a time (the caller's pool lock), so on PostgreSQL they keep the
//! pooled connection they last committed on rather than taking the pool's next idle one: a
//! launch's statements are prepared and planned once per process, not once per connection of
//! the pool (after a start, the first 50 launches took twice as long as the next ones while each
//! of the 16 connections prepared them in turn). A change that fails lets its connection go back
//! to the pool, and the next one takes another; so does one whose kept connection broke while
//! idle, or has been kept for as long as the pool keeps any.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{begin_pool_write, Conn, Db, Error, PoolWrite, QueueHead, WriteTx};

/// How long pool changes keep one connection before letting it go back to the pool: as long as
/// the pool keeps any (sqlx's default `max_lifetime`), so that a connection is renewed as the
/// pool's others are.
const WRITER_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// The connection the last pool change committed on, kept for the next (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct KeptWriter(Mutex<Option<Writer>>);

#[derive(Debug)]
struct Writer {
    conn: Conn,
    /// When pool changes first kept it.
    since: Instant,
}

/// One change of bookings or inventory, open until [`PoolChange::commit`]; see the module docs.
#[derive(Debug)]
pub struct PoolChange {
    pub(crate) tx: WriteTx,
    state: PoolWrite,
    /// Since when pool changes keep `tx`'s connection; `None`: taken from the pool now.
    writer_since: Option<Instant>,
    kept: Arc<KeptWriter>,
}

impl Db {
    /// Begins a pool change (see the module docs) on the kept connection, or on one of the
    /// pool's when none is kept, it is due for renewal, or it broke while idle (the server
    /// restarted, an administrator ended it: nothing ran on it yet). The caller holds its pool's
    /// lock until the change ends.
    pub async fn begin_pool_change(&self) -> Result<PoolChange, Error> {
        let kept = self.kept_writer.0.lock().expect("kept writer").take();
        if let Some(Writer { conn, since }) = kept {
            if since.elapsed() < WRITER_LIFETIME {
                match begin_pool_write(conn).await {
                    Ok((tx, state)) => return Ok(self.pool_change(tx, state, Some(since))),
                    Err(e) => {
                        tracing::warn!(error = %e, "the pool's kept connection failed; taking another")
                    }
                }
            }
        }
        let (tx, state) = begin_pool_write(self.connection().await?).await?;
        Ok(self.pool_change(tx, state, None))
    }

    fn pool_change(&self, tx: WriteTx, state: PoolWrite, since: Option<Instant>) -> PoolChange {
        PoolChange { tx, state, writer_since: since, kept: self.kept_writer.clone() }
    }
}

impl PoolChange {
    /// The pool generation, bumped by this change.
    pub fn generation(&self) -> i64 {
        self.state.generation
    }

    /// The queue's head as the change began (only this change moves it until it ends).
    pub fn queue_head(&self) -> Option<QueueHead> {
        self.state.queue_head.clone()
    }

    /// Whether any request waited in the queue as the change began: only then is a release
    /// worth a queue round. Requests join the queue only in pool changes, so this is exact until
    /// the commit.
    pub fn queue_waits(&self) -> bool {
        self.state.queue_waits
    }

    /// Commits the change, keeping its connection for the next one where it is a pool's.
    pub async fn commit(self) -> Result<(), Error> {
        let PoolChange { tx, writer_since, kept, .. } = self;
        let conn = tx.commit_keeping().await?;
        if conn.is_pooled() {
            let since = writer_since.unwrap_or_else(Instant::now);
            *kept.0.lock().expect("kept writer") = Some(Writer { conn, since });
        }
        Ok(())
    }
}
