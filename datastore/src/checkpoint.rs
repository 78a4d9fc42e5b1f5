//! SQLite's WAL checkpoints, moved off the request path.
//!
//! In WAL mode SQLite copies the log back into the database file (a checkpoint, ending in an
//! fsync) as soon as a commit leaves the log past `wal_autocheckpoint` pages, and the committing
//! connection pays for it. With the process's one connection that is whatever request commits
//! next: at SQLite's default of 1,000 pages, one launch in 34 took 6-8 ms instead of 1.4 ms (the
//! scale bench's launch p99). A second connection of the process checkpoints instead, every
//! [`CHECKPOINT_EVERY`] while the one connection is in use, and not at all while it is not (an idle
//! service wakes for nothing), PASSIVE (it never waits for the writer or a reader, so the one
//! connection never waits for it); the one connection keeps a far higher threshold
//! ([`BACKSTOP_PAGES`]) so that the log stays bounded should this one fall behind or fail.
//!
//! A checkpoint does not change the log's header, so the one connection's page cache stays warm.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use sqlx::any::AnyConnectOptions;
use sqlx::{AnyConnection, Connection};

use gsaas_infra::ErrorChain;

/// How often the checkpointer copies the log into the database: at a thousand launches a second
/// the log grows by about 3,000 pages in that time.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// The one connection's `wal_autocheckpoint` (pages of 4 KiB): 64 MiB of log.
pub(super) const BACKSTOP_PAGES: u32 = 16_384;

/// How often an idle checkpointer looks whether the one connection is gone.
const GONE_EVERY: Duration = Duration::from_secs(5);

/// Checkpoints the database of `options` until the process's one connection (`main`) is gone:
/// [`CHECKPOINT_EVERY`] after `used` tells that it was used (and let go) since the last one.
pub(super) fn spawn_checkpointer(
    options: AnyConnectOptions,
    main: Weak<tokio::sync::Mutex<AnyConnection>>,
    used: Arc<Notify>,
) {
    tokio::spawn(async move {
        let mut conn = match AnyConnection::connect_with(&options).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(
                    error = %ErrorChain(&e),
                    "no checkpointer: the database's connection checkpoints its own log"
                );
                return;
            }
        };
        let mut failing = false;
        loop {
            tokio::select! {
                () = used.notified() => tokio::time::sleep(CHECKPOINT_EVERY).await,
                () = tokio::time::sleep(GONE_EVERY) => {
                    if main.strong_count() == 0 {
                        break;
                    }
                    continue;
                }
            }
            if main.strong_count() == 0 {
                break;
            }
            match sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&mut conn).await {
                Ok(_) => failing = false,
                // Once per run of failures: the next tick retries, and the backstop bounds the log.
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %ErrorChain(&e), "WAL checkpoint failed");
                }
                Err(_) => {}
            }
        }
        let _ = conn.close().await;
    });
}
