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
//! own ([`crate::lanes::LaneThread::writer`]): they take SQLite's one connection in turn and wait
//! on its worker thread between statements, so each step of theirs must not queue behind HTTP
//! work on the main runtime's busy workers. On PostgreSQL the requests' batches are written on
//! the main runtime, whose I/O driver serves the requests' connections, and the background lane's
//! on the lane's runtime, with its connections (see [`crate::lanes`]).

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{mpsc, oneshot};

use super::pool::BoxFuture;
use super::App;
use crate::error::Error;

/// The most operations one batch takes; the rest wait for the next.
pub(crate) const MAX_BATCH: usize = 256;
/// The most one batch of the background lane takes while requests keep coming, where it has
/// connections of its own: its batches pile up while it yields to requests (see
/// [`crate::lanes`]), and a batch of 64 hosts' route tables is a statement of 20-30 ms on
/// PostgreSQL at 100,000 GPUs, a core held that long; a batch of 8 takes 2-4 ms. (Taking at most
/// 8 at all times cost clients that wait for their VMs 16-39% of their cycles.)
pub(crate) const MAX_BACKGROUND_BATCH: usize = 8;

/// A caller's operation and where its outcome goes.
pub(crate) type Queued<Op, Out> = (Op, oneshot::Sender<Result<Out, Error>>);

/// Writes one batch and answers every caller in it.
pub(crate) type WriteBatch<Op, Out> = fn(Arc<App>, Vec<Queued<Op, Out>>) -> BoxFuture<'static, ()>;

/// The queue of one kind of write, or one per lane (see [`crate::lanes`]): a lane's callers are
/// batched together and written by a task in that lane, with that lane's connections, so a
/// request never waits behind a batch of background writes, nor in the background lane's queue.
#[derive(Debug)]
pub(crate) struct Batcher<Op, Out> {
    requests: Queue<Op, Out>,
    /// None: the background lane's callers share the requests' queue.
    background: Option<Queue<Op, Out>>,
}

#[derive(Debug)]
struct Queue<Op, Out> {
    sender: mpsc::UnboundedSender<Queued<Op, Out>>,
    /// Taken by [`Batcher::start`].
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Queued<Op, Out>>>>,
}

impl<Op: Send + 'static, Out: Send + 'static> Queue<Op, Out> {
    fn new() -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        Queue { sender, receiver: Mutex::new(Some(receiver)) }
    }

    fn start(
        &self,
        runtime: &tokio::runtime::Handle,
        app: Weak<App>,
        write: WriteBatch<Op, Out>,
        under_load: Option<usize>,
    ) -> tokio::task::AbortHandle {
        let mut receiver =
            self.receiver.lock().expect("batch receiver").take().expect("a batcher starts once");
        runtime
            .spawn(async move {
                let mut batch = Vec::new();
                loop {
                    if receiver.recv_many(&mut batch, 1).await == 0 {
                        return;
                    }
                    let Some(app) = app.upgrade() else { return };
                    let max = match under_load {
                        Some(max) if app.db.requests().busy() => max,
                        _ => MAX_BATCH,
                    };
                    while batch.len() < max {
                        match receiver.try_recv() {
                            Ok(queued) => batch.push(queued),
                            Err(_) => break,
                        }
                    }
                    write(app, std::mem::take(&mut batch)).await;
                }
            })
            .abort_handle()
    }
}

impl<Op: Send + 'static, Out: Send + 'static> Batcher<Op, Out> {
    /// One queue for both lanes: for writes that serialize anyway (the pool's bookings, under
    /// the pool's lock), where a background batch would hold the lock at the background's pace.
    pub(crate) fn shared() -> Self {
        Batcher { requests: Queue::new(), background: None }
    }

    /// A queue per lane, where there is a background lane (`lane`); else one queue.
    pub(crate) fn for_lanes(lane: bool) -> Self {
        Batcher { requests: Queue::new(), background: lane.then(Queue::new) }
    }

    /// Queues `op` in the caller's lane and waits for the outcome of its batch.
    pub(crate) async fn submit(&self, op: Op) -> Result<Out, Error> {
        let queue = match &self.background {
            Some(background) if crate::lanes::on_background() => background,
            _ => &self.requests,
        };
        let (reply, outcome) = oneshot::channel();
        queue.sender.send((op, reply)).map_err(|_| stopped())?;
        outcome.await.map_err(|_| stopped())?
    }

    /// Starts the tasks that write this batcher's batches with `write`, the requests' on
    /// `requests` and, for a batcher with a queue per lane, the background lane's on its runtime
    /// (at most the given number of operations a batch while requests keep coming), until `app`
    /// is dropped.
    pub(crate) fn start(
        &self,
        requests: &tokio::runtime::Handle,
        background: Option<(&tokio::runtime::Handle, usize)>,
        app: Weak<App>,
        write: WriteBatch<Op, Out>,
    ) -> Vec<tokio::task::AbortHandle> {
        let mut tasks = vec![self.requests.start(requests, app.clone(), write, None)];
        if let Some(queue) = &self.background {
            let (runtime, under_load) = background.expect("a batcher per lane has a lane");
            tasks.push(queue.start(runtime, app, write, Some(under_load)));
        }
        tasks
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
        Error::Forbidden(m) => Error::Forbidden(m.clone()),
        Error::NotFound { kind, id } => Error::NotFound { kind, id: id.clone() },
        Error::TooLarge(m) => Error::TooLarge(m.clone()),
        Error::RequestTimeout(m) => Error::RequestTimeout(m.clone()),
        Error::TooManyRequests(m) => Error::TooManyRequests(m.clone()),
        Error::Conflict(m) => Error::Conflict(m.clone()),
        Error::VersionConflict(m) => Error::VersionConflict(m.clone()),
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
        let batcher: Batcher<u32, u32> = Batcher::shared();
        let mut receiver = batcher.requests.receiver.lock().unwrap().take().unwrap();
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

    #[tokio::test]
    async fn each_lane_queues_its_own_callers_and_a_shared_batcher_queues_both_together() {
        let lane = crate::lanes::LaneThread::background().unwrap();
        let per_lane: Arc<Batcher<u32, u32>> = Arc::new(Batcher::for_lanes(true));
        let mut requests = per_lane.requests.receiver.lock().unwrap().take().unwrap();
        let background = per_lane.background.as_ref().unwrap();
        let mut background = background.receiver.lock().unwrap().take().unwrap();
        let from_request = tokio::spawn({
            let batcher = per_lane.clone();
            async move { batcher.submit(1).await }
        });
        let from_background = lane.runtime().spawn({
            let batcher = per_lane.clone();
            async move { batcher.submit(2).await }
        });
        let (op, reply) = requests.recv().await.unwrap();
        assert_eq!(op, 1);
        let _ = reply.send(Ok(10));
        let (op, reply) = background.recv().await.unwrap();
        assert_eq!(op, 2);
        let _ = reply.send(Ok(20));
        assert_eq!(from_request.await.unwrap().unwrap(), 10);
        assert_eq!(from_background.await.unwrap().unwrap(), 20);

        let shared: Arc<Batcher<u32, u32>> = Arc::new(Batcher::shared());
        let mut queue = shared.requests.receiver.lock().unwrap().take().unwrap();
        let from_background = lane.runtime().spawn({
            let batcher = shared.clone();
            async move { batcher.submit(3).await }
        });
        let (op, reply) = queue.recv().await.unwrap();
        assert_eq!(op, 3);
        let _ = reply.send(Ok(30));
        assert_eq!(from_background.await.unwrap().unwrap(), 30);
    }
}
