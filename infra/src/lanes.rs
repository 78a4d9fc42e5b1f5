//! Requests first: on PostgreSQL, background work (sagas, the reconciler, route pushes) runs in a
//! lane of its own and yields to the requests being served.
//!
//! A launch answers once its reservation is written; everything after it (creating the server,
//! pushing the host's routes, recording progress) is background work. With the simulated Nova at
//! zero delay, a burst of launches starts a saga per launch at once, and on a small machine the
//! sagas (their route-table reads on PostgreSQL above all) took the cores the next launches
//! needed: 1,000 back-to-back launches at 100,000 GPUs answered with a p99 of 4-7 ms, and of
//! 1.4 ms when the sagas were held back (BENCHMARKS.md, eighth round). So background work gets:
//! - a runtime on a thread of its own, so it never holds one of the request runtime's workers;
//! - connections of its own to PostgreSQL ([`BACKGROUND_CONNECTIONS`]), so it never waits for a
//!   connection a request holds, nor a request for one it holds;
//! - an admission gate before each of those connections ([`Requests::admit_background`]): at once
//!   when no request has been served for [`QUIET`], otherwise one admission per
//!   [`ADMIT_EVERY_UNDER_LOAD`], in turn. PostgreSQL runs a background statement at the same
//!   priority as a request's, so what keeps requests fast is running fewer of them meanwhile; the
//!   batches that pile up meanwhile are written a few operations at a time while requests keep
//!   coming ([`Requests::busy`], gsaasd's `app::batch`), so no admitted statement holds a core for
//!   long.
//!
//! A lower priority for the lane's thread (nice 10) was tried and left out: with the gate, the
//! launches' p99 was the same, and clients that wait for their VMs lost another 5-8% of their
//! cycles on PostgreSQL.
//!
//! Under a sustained load of requests the sagas still advance, a batch every interval; a burst
//! leaves them behind and they catch up when it ends. But while a request is parked in a long
//! poll ([`parked`]), a client waits for background work, and it is admitted at once: clients
//! that launch and wait for their VMs (the cycles bench: 885 and 1,000 cycles/s on PostgreSQL)
//! fell to 440-460/s when their sagas waited for the interval. Which lane code runs in follows
//! from its thread: [`on_background`].
//!
//! On SQLite there is no lane: one connection serves everything, through the writer's thread (see
//! gsaasd's `app::batch`), so there is nothing of its own to give background work, and sagas on a
//! thread of their own cost clients that wait for their VMs 6-13% of their cycles.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// The background lane's connections to PostgreSQL.
pub const BACKGROUND_CONNECTIONS: u32 = 4;
/// How long no request must have been served before background work starts at once.
pub const QUIET: Duration = Duration::from_millis(2);
/// While requests keep coming, background work starts at most this often.
pub const ADMIT_EVERY_UNDER_LOAD: Duration = Duration::from_millis(20);

thread_local! {
    static BACKGROUND_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is one of the background lane's (its runtime's thread, or a thread
/// of its blocking pool).
pub fn on_background() -> bool {
    BACKGROUND_THREAD.with(Cell::get)
}

fn enter_background() {
    BACKGROUND_THREAD.with(|b| b.set(true));
}

/// A thread with a runtime of its own. It stops when this is dropped.
#[derive(Debug)]
pub struct LaneThread {
    runtime: tokio::runtime::Handle,
    _stop: oneshot::Sender<()>,
}

impl LaneThread {
    /// The background lane: a runtime with timers and I/O (the sagas reach the cloud and agents
    /// over HTTP, and this runtime drives the background connections to PostgreSQL).
    pub fn background() -> std::io::Result<LaneThread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_start(enter_background)
            .build()?;
        Self::start("gsaasd-background", runtime, true)
    }

    /// SQLite's writer (see gsaasd's `app::batch`): timers but no I/O driver. Its tasks reach
    /// SQLite's worker thread over channels, and a runtime without sockets to poll parks on a
    /// futex, which is quicker to wake than epoll.
    pub fn writer() -> std::io::Result<LaneThread> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
        Self::start("gsaasd-writer", runtime, false)
    }

    fn start(
        name: &str,
        runtime: tokio::runtime::Runtime,
        background: bool,
    ) -> std::io::Result<LaneThread> {
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new().name(name.into()).spawn(move || {
            if background {
                enter_background();
            }
            let _ = runtime.block_on(stopped);
        })?;
        Ok(LaneThread { runtime: handle, _stop: stop })
    }

    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }
}

tokio::task_local! {
    /// The requests of the one being served by this task (see [`parked`]).
    static SERVING: Arc<Requests>;
}

/// The requests being served, which the background lane yields to.
#[derive(Debug)]
pub struct Requests {
    in_flight: AtomicUsize,
    /// Requests parked until something happens (long polls): their clients wait for background
    /// work.
    parked: AtomicUsize,
    /// When the last request ended.
    last_ended: Mutex<Instant>,
    /// Raised when no request is left in flight, or one parks.
    idle: Notify,
    /// When background work was last admitted; background work waits for it in turn.
    admitted: tokio::sync::Mutex<Instant>,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            in_flight: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            last_ended: Mutex::new(Instant::now()),
            idle: Notify::new(),
            admitted: tokio::sync::Mutex::new(Instant::now()),
        }
    }
}

/// One request counted in flight until dropped.
struct InFlight(Arc<Requests>);

impl InFlight {
    fn begin(requests: Arc<Requests>) -> InFlight {
        requests.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(requests)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end_one();
    }
}

impl Requests {
    fn end_one(&self) {
        *self.last_ended.lock().expect("requests") = Instant::now();
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Serves `request`, counted in flight.
    pub async fn serve<F: Future>(self: &Arc<Self>, request: F) -> F::Output {
        let _in_flight = InFlight::begin(self.clone());
        SERVING.scope(self.clone(), request).await
    }

    /// Whether requests keep coming and none waits for background work: background work is
    /// then admitted once per interval (see [`Requests::admit_background`]).
    pub fn busy(&self) -> bool {
        if self.parked.load(Ordering::SeqCst) > 0 {
            return false;
        }
        self.in_flight.load(Ordering::SeqCst) > 0 || Instant::now() < self.quiet_from()
    }

    /// When background work may start at once if no request comes meanwhile.
    fn quiet_from(&self) -> Instant {
        *self.last_ended.lock().expect("requests") + QUIET
    }

    /// Waits until background work may start: at once when a request waits for it (a parked
    /// long poll) or when no request has been served for [`QUIET`], otherwise in turn, one
    /// admission per [`ADMIT_EVERY_UNDER_LOAD`].
    pub async fn admit_background(&self) {
        let mut admitted = self.admitted.lock().await;
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            let due = *admitted + ADMIT_EVERY_UNDER_LOAD;
            if !self.busy() || Instant::now() >= due {
                break;
            }
            let wake = if self.in_flight.load(Ordering::SeqCst) > 0 {
                due
            } else {
                due.min(self.quiet_from())
            };
            tokio::select! {
                () = idle => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
        *admitted = Instant::now();
    }
}

/// Runs `wait` (a request parked until something happens: a long poll) without counting its
/// request in flight meanwhile.
pub async fn parked<F: Future>(wait: F) -> F::Output {
    let Ok(requests) = SERVING.try_with(Clone::clone) else { return wait.await };
    requests.parked.fetch_add(1, Ordering::SeqCst);
    requests.end_one();
    requests.idle.notify_waiters();
    // Counted again when the wait ends, or is dropped with its request.
    struct Resumed(Arc<Requests>);
    impl Drop for Resumed {
        fn drop(&mut self) {
            self.0.in_flight.fetch_add(1, Ordering::SeqCst);
            self.0.parked.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let _resumed = Resumed(requests);
    wait.await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn admitted_after(requests: &Requests) -> Duration {
        let started = Instant::now();
        requests.admit_background().await;
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn background_starts_at_once_when_no_request_was_served_for_a_moment() {
        let requests = Arc::new(Requests::default());
        tokio::time::sleep(QUIET).await;
        assert_eq!(admitted_after(&requests).await, Duration::ZERO);
        assert_eq!(admitted_after(&requests).await, Duration::ZERO, "quiet: no interval either");
    }

    #[tokio::test(start_paused = true)]
    async fn under_load_background_starts_once_per_interval_in_turn() {
        let requests = Arc::new(Requests::default());
        let (release, released) = oneshot::channel::<()>();
        let serving = tokio::spawn({
            let requests = requests.clone();
            async move { requests.serve(released).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(requests.in_flight.load(Ordering::SeqCst), 1);
        // The first admission is due an interval after the gate was made, the next ones an
        // interval after each other, while the request stays in flight.
        let first = admitted_after(&requests).await;
        assert_eq!(first, ADMIT_EVERY_UNDER_LOAD);
        let (a, b) = tokio::join!(admitted_after(&requests), admitted_after(&requests));
        let mut waits = [a, b];
        waits.sort();
        assert_eq!(waits, [ADMIT_EVERY_UNDER_LOAD, 2 * ADMIT_EVERY_UNDER_LOAD]);

        // The request ends: background work waits for the quiet moment, not the interval.
        let waiting = tokio::spawn({
            let requests = requests.clone();
            async move { admitted_after(&requests).await }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let _ = release.send(());
        serving.await.unwrap().unwrap();
        assert_eq!(requests.in_flight.load(Ordering::SeqCst), 0);
        assert_eq!(waiting.await.unwrap(), Duration::from_millis(5) + QUIET);
    }

    #[tokio::test(start_paused = true)]
    async fn a_parked_request_is_not_counted_while_it_waits() {
        let requests = Arc::new(Requests::default());
        let (wake, woken) = oneshot::channel::<()>();
        let (parked_now, is_parked) = oneshot::channel::<()>();
        let serving = tokio::spawn({
            let requests = requests.clone();
            async move {
                requests
                    .serve(async {
                        let _ = parked_now.send(());
                        parked(woken).await.unwrap();
                        tokio::task::yield_now().await;
                    })
                    .await
            }
        });
        is_parked.await.unwrap();
        tokio::task::yield_now().await;
        assert_eq!(requests.in_flight.load(Ordering::SeqCst), 0, "parked");
        // Another request in flight: background work still starts at once, a client waits for it.
        let _other = InFlight::begin(requests.clone());
        assert_eq!(admitted_after(&requests).await, Duration::ZERO);
        assert_eq!(admitted_after(&requests).await, Duration::ZERO);
        drop(_other);
        let _ = wake.send(());
        serving.await.unwrap();
        assert_eq!(requests.in_flight.load(Ordering::SeqCst), 0, "counted again, then ended");
        assert_eq!(requests.parked.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_background_lane_runs_on_its_own_thread() {
        let lane = LaneThread::background().unwrap();
        let (tell, told) = std::sync::mpsc::channel();
        lane.runtime().spawn(async move {
            let blocking = tokio::task::spawn_blocking(on_background).await.unwrap();
            let name = std::thread::current().name().map(String::from);
            let _ = tell.send((on_background(), blocking, name));
        });
        let (background, blocking, name) = told.recv().unwrap();
        assert!(background && blocking, "the lane's thread and its blocking pool's");
        assert_eq!(name.as_deref(), Some("gsaasd-background"));
        assert!(!on_background(), "the caller's thread is not the lane's");
    }
}
