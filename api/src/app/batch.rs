//! Group commit: the writes that many requests and sagas make at once, in a few statements.
//!
//! Every statement costs a hand-off to SQLite's worker thread or a round trip to PostgreSQL, and on
//! SQLite every statement also waits for the one connection; at hundreds of launches a second those costs,
//! not the work, set the pace. So the hot writes (reservations and releases of cGPUs, and the saga's
//! conditional VM writes) are queued: a task per kind takes everything queued, writes it as one
//! batch (one transaction, one statement per table), and answers each caller. A lone write goes out
//! at once; under load, writes queue while a batch is written and the next batch takes them all, so
//! statements per write fall as load rises.
//!
//! A batch runs in its own task, not in a caller's future: a caller that goes away (a client
//! hanging up) cannot cut the others' batch short. On SQLite these tasks run on a thread of their
//! own ([`WriterThread`]): they take SQLite's one connection in turn and wait on its worker
//! thread between statements, so each step of theirs must not queue behind HTTP work on the
//! main runtime's busy workers. On PostgreSQL they stay on the main runtime, whose I/O driver
//! serves the connections they use.

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{mpsc, oneshot};

use super::pool::BoxFuture;
use super::App;
use crate::error::Error;

/// The most operations one batch takes; the rest wait for the next.
const MAX_BATCH: usize = 256;

/// A caller's operation and where its outcome goes.
pub(crate) type Queued<Op, Out> = (Op, oneshot::Sender<Result<Out, Error>>);

/// Writes one batch and answers every caller in it.
pub(crate) type WriteBatch<Op, Out> = fn(Arc<App>, Vec<Queued<Op, Out>>) -> BoxFuture<'static, ()>;

/// The queue of one kind of write.
#[derive(Debug)]
pub(crate) struct Batcher<Op, Out> {
    sender: mpsc::UnboundedSender<Queued<Op, Out>>,
    /// Taken by [`Batcher::start`].
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Queued<Op, Out>>>>,
}

impl<Op: Send + 'static, Out: Send + 'static> Batcher<Op, Out> {
    pub(crate) fn new() -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        Batcher { sender, receiver: Mutex::new(Some(receiver)) }
    }

    /// Queues `op` and waits for the outcome of its batch.
    pub(crate) async fn submit(&self, op: Op) -> Result<Out, Error> {
        let (reply, outcome) = oneshot::channel();
        self.sender.send((op, reply)).map_err(|_| stopped())?;
        outcome.await.map_err(|_| stopped())?
    }

    /// Starts the task that writes this queue's batches with `write` on `runtime`, until `app` is
    /// dropped.
    pub(crate) fn start(
        &self,
        runtime: &tokio::runtime::Handle,
        app: Weak<App>,
        write: WriteBatch<Op, Out>,
    ) -> tokio::task::AbortHandle {
        let mut receiver =
            self.receiver.lock().expect("batch receiver").take().expect("a batcher starts once");
        runtime
            .spawn(async move {
                let mut batch = Vec::new();
                while receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
                    let Some(app) = app.upgrade() else { return };
                    write(app, std::mem::take(&mut batch)).await;
                }
            })
            .abort_handle()
    }
}

/// A thread with a runtime of its own for the batch tasks (see the module docs). It stops when
/// this is dropped. The runtime has timers but no I/O driver: the tasks reach SQLite's worker
/// thread over channels, and a runtime without sockets to poll parks on a futex, which is quicker
/// to wake than epoll.
#[derive(Debug)]
pub(crate) struct WriterThread {
    runtime: tokio::runtime::Handle,
    _stop: oneshot::Sender<()>,
}

impl WriterThread {
    pub(crate) fn start() -> std::io::Result<WriterThread> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new().name("gsaasd-writer".into()).spawn(move || {
            let _ = runtime.block_on(stopped);
        })?;
        Ok(WriterThread { runtime: handle, _stop: stop })
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }
}

fn stopped() -> Error {
    Error::unavailable("database", "the service is stopping; the write was not made")
}

/// One failure told to every caller of a batch: the same kind of error (so the same status and
/// message), with the original's causes as its source.
pub(crate) fn share(e: &Arc<Error>) -> Error {
    let cause = || Box::new(Causes(e.clone()));
    match &**e {
        Error::Malformed { field, reason } => {
            Error::Malformed { field: field.clone(), reason: reason.clone() }
        }
        Error::Invalid(errors) => Error::Invalid(errors.clone()),
        Error::Unauthenticated(m) => Error::Unauthenticated(m.clone()),
        Error::NotFound { kind, id } => Error::NotFound { kind, id: id.clone() },
        Error::TooLarge(m) => Error::TooLarge(m.clone()),
        Error::RequestTimeout(m) => Error::RequestTimeout(m.clone()),
        Error::TooManyRequests(m) => Error::TooManyRequests(m.clone()),
        Error::Conflict(m) => Error::Conflict(m.clone()),
        Error::QuotaExceeded(e) => Error::QuotaExceeded(e.clone()),
        Error::PriorityAboveCeiling { project, priority, ceiling } => Error::PriorityAboveCeiling {
            project: project.clone(),
            priority: *priority,
            ceiling: *ceiling,
        },
        Error::InsufficientCapacity(shortfall) => Error::InsufficientCapacity(shortfall.clone()),
        Error::Unavailable { dependency, .. } => Error::Unavailable { dependency, source: cause() },
        Error::Internal(_) => Error::Internal(cause()),
    }
}

/// The source chain of a shared error (its own message is the sharing error's).
#[derive(Debug)]
struct Causes(Arc<Error>);

impl std::fmt::Display for Causes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match std::error::Error::source(&*self.0) {
            Some(source) => write!(f, "{source}"),
            None => write!(f, "{}", self.0),
        }
    }
}

impl std::error::Error for Causes {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&*self.0).and_then(|s| s.source())
    }
}

/// Answers every caller of a failed batch with `e`.
pub(crate) fn fail_all<Op, Out>(queued: Vec<Queued<Op, Out>>, e: Error) {
    let e = Arc::new(e);
    for (_, reply) in queued {
        let _ = reply.send(Err(share(&e)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorChain;

    #[test]
    fn a_shared_failure_keeps_its_kind_message_and_causes() {
        let io = std::io::Error::other("disk full");
        let original = Arc::new(Error::unavailable("database", io));
        let shared = share(&original);
        assert_eq!(shared.status(), original.status());
        assert_eq!(shared.to_string(), "database unavailable");
        assert_eq!(ErrorChain(&shared).to_string(), "database unavailable: disk full");

        let conflict = share(&Arc::new(Error::Conflict("taken".into())));
        assert_eq!((conflict.code(), conflict.to_string()), ("conflict", "taken".to_owned()));
    }

    #[tokio::test]
    async fn callers_get_their_own_outcomes_and_an_error_once_the_writer_is_gone() {
        let batcher: Batcher<u32, u32> = Batcher::new();
        let mut receiver = batcher.receiver.lock().unwrap().take().unwrap();
        let writer = tokio::spawn(async move {
            let mut batch = Vec::new();
            receiver.recv_many(&mut batch, MAX_BATCH).await;
            let size = batch.len() as u32;
            for (op, reply) in batch {
                let _ = reply.send(Ok(op * 10 + size));
            }
        });
        let (a, b) = tokio::join!(batcher.submit(1), batcher.submit(2));
        assert_eq!((a.unwrap(), b.unwrap()), (12, 22), "both in one batch of 2");
        writer.await.unwrap();
        let gone = batcher.submit(3).await.unwrap_err();
        assert_eq!(gone.code(), "dependency_unavailable");
    }
}
