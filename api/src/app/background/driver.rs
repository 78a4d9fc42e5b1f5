//! The one driver of background tasks. A task is a type implementing [`Task`]: it has a name, a
//! period and one idempotent activation; the driver runs each task on a loop of its own, on its
//! timer and whenever something triggers it, never two activations of one task at once, and
//! keeps how each task's last activation went for admins (`GET /v1/background-tasks`) and for
//! `/metrics`. Tasks hold no loop, handle or status of their own, so adding one is one file and
//! one line in [`super::tasks`].

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gsaas_api_types::{BackgroundTaskView, TaskOutcome};
use tokio::sync::Notify;

use crate::app::App;
use crate::config::Config;
use crate::db::now_ms;
use crate::error::{Error, ErrorChain};
use crate::metrics::header;

/// The longest wait between two activations of a task that backs off while it fails.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Every background task, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskName {
    HostLiveness,
    PoolRefresh,
    RouteTables,
    CloudDrift,
    Rehome,
    Fences,
    UsageRollup,
    Delegations,
    SagaResumption,
    QueueRounds,
    Revocations,
    UsageFold,
    PolicyReload,
    LoanMarks,
    Notifications,
}

impl TaskName {
    pub const ALL: [TaskName; 15] = [
        TaskName::HostLiveness,
        TaskName::PoolRefresh,
        TaskName::RouteTables,
        TaskName::CloudDrift,
        TaskName::Rehome,
        TaskName::Fences,
        TaskName::UsageRollup,
        TaskName::Delegations,
        TaskName::SagaResumption,
        TaskName::QueueRounds,
        TaskName::Revocations,
        TaskName::UsageFold,
        TaskName::PolicyReload,
        TaskName::LoanMarks,
        TaskName::Notifications,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskName::HostLiveness => "host_liveness",
            TaskName::PoolRefresh => "pool_refresh",
            TaskName::RouteTables => "route_tables",
            TaskName::CloudDrift => "cloud_drift",
            TaskName::Rehome => "rehome",
            TaskName::Fences => "fences",
            TaskName::UsageRollup => "usage_rollup",
            TaskName::Delegations => "delegations",
            TaskName::SagaResumption => "saga_resumption",
            TaskName::QueueRounds => "queue_rounds",
            TaskName::Revocations => "revocations",
            TaskName::UsageFold => "usage_fold",
            TaskName::PolicyReload => "policy_reload",
            TaskName::LoanMarks => "loan_marks",
            TaskName::Notifications => "notifications",
        }
    }

    pub fn parse(name: &str) -> Option<TaskName> {
        TaskName::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

/// What an activation did, in counts (`("tables_pushed", 3)`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report(Vec<(&'static str, u64)>);

impl Report {
    pub fn with(mut self, what: &'static str, count: impl TryInto<u64>) -> Report {
        self.0.push((what, count.try_into().unwrap_or(u64::MAX)));
        self
    }

    pub fn get(&self, what: &str) -> u64 {
        self.0.iter().find(|(w, _)| *w == what).map_or(0, |(_, n)| *n)
    }
}

/// An activation that failed, with what it did before or beside its failure.
#[derive(Debug)]
pub struct Failed {
    pub report: Report,
    pub error: Error,
}

impl From<Error> for Failed {
    fn from(error: Error) -> Failed {
        Failed { report: Report::default(), error }
    }
}

impl From<crate::db::Error> for Failed {
    fn from(error: crate::db::Error) -> Failed {
        Error::from(error).into()
    }
}

/// A background task: idempotent (it takes no input and looks at everything each time, so an
/// activation twice, or on several replicas at once, is harmless), reporting what it did.
#[async_trait]
pub trait Task: Send + Sync + std::fmt::Debug + 'static {
    fn name(&self) -> TaskName;
    /// One line for admins.
    fn describe(&self) -> &'static str;
    /// Between two activations when nothing triggers one.
    fn period(&self, config: &Config) -> Duration;
    /// Whether its loop activates it at once, or first waits a period (or a trigger).
    fn at_start(&self) -> bool {
        true
    }
    /// Whether failures stretch the wait (doubling, up to [`MAX_BACKOFF`]).
    fn backs_off(&self) -> bool {
        false
    }
    /// Whether it runs beside the requests rather than in the background lane
    /// ([`crate::lanes`]): work that requests wait on.
    fn on_request_lane(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed>;
}

/// The tasks of one process, their triggers and what their activations did.
#[derive(Debug)]
pub(crate) struct Driver {
    slots: Vec<Slot>,
    loops: Mutex<Vec<tokio::task::AbortHandle>>,
    stopped: AtomicBool,
}

#[derive(Debug)]
struct Slot {
    task: Box<dyn Task>,
    trigger: Notify,
    /// Held through an activation: one at a time, whoever asks.
    one_at_a_time: tokio::sync::Mutex<()>,
    status: Mutex<Status>,
}

#[derive(Debug, Clone, Default)]
struct Status {
    running: bool,
    activations: u64,
    failures: u64,
    last_started_ms: Option<i64>,
    last_duration: Option<Duration>,
    last_outcome: Option<TaskOutcome>,
    last_error: Option<String>,
    last_report: Report,
    /// When the last activation that succeeded ended.
    last_success_ms: Option<i64>,
}

impl Driver {
    pub fn new(tasks: Vec<Box<dyn Task>>) -> Driver {
        let slots = tasks
            .into_iter()
            .map(|task| Slot {
                task,
                trigger: Notify::new(),
                one_at_a_time: tokio::sync::Mutex::new(()),
                status: Mutex::new(Status::default()),
            })
            .collect();
        Driver { slots, loops: Mutex::new(Vec::new()), stopped: AtomicBool::new(false) }
    }

    fn slot(&self, name: TaskName) -> Option<&Slot> {
        self.slots.iter().find(|s| s.task.name() == name)
    }

    /// Asks for an activation as soon as possible (none when this process does not run it).
    pub fn trigger(&self, name: TaskName) {
        if let Some(slot) = self.slot(name) {
            slot.trigger.notify_one();
        }
    }

    /// Activates `name` now and waits for it (after any activation already running); `None`
    /// when this process does not run it. The activation runs in a task of its own on the
    /// task's lane: a caller that goes away (an admin's request cut off) leaves it to finish,
    /// and a panic in it is a failed activation, not a dead loop.
    pub async fn activate(&self, app: &Arc<App>, name: TaskName) -> Option<Result<Report, Failed>> {
        let index = self.slots.iter().position(|s| s.task.name() == name)?;
        let work = Driver::activation(app.clone(), index);
        let handle = match self.slots[index].task.on_request_lane() {
            true => tokio::spawn(work),
            false => app.spawn_background(work),
        };
        self.keep(vec![handle.abort_handle()]);
        Some(match handle.await {
            Ok(result) => result,
            Err(e) => {
                let how = if e.is_panic() { "panicked" } else { "was stopped" };
                Err(Failed::from(Error::internal(format!("task {} {how}", name.as_str()))))
            }
        })
    }

    async fn activation(app: Arc<App>, index: usize) -> Result<Report, Failed> {
        let slot = &app.tasks.slots[index];
        let _one = slot.one_at_a_time.lock().await;
        let mut running = Running::start(slot);
        let result = slot.task.activate(&app).await;
        running.end(&result);
        result
    }

    /// Starts every task's loop. `first` runs at once, and the loops of `after_first` start
    /// once it ended (the reconciler's first pass, which runs those tasks in its order): their
    /// next activation is a period after it, or a trigger.
    pub fn start<F>(app: &Arc<App>, first: F, after_first: &'static [TaskName])
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let spawn_loop = |app: &Arc<App>, index: usize| {
            let work = Driver::run(app.clone(), index);
            let handle = match app.tasks.slots[index].task.on_request_lane() {
                true => tokio::spawn(work),
                false => app.spawn_background(work),
            };
            handle.abort_handle()
        };
        let later = |slot: &Slot| after_first.contains(&slot.task.name());
        let now: Vec<usize> =
            (0..app.tasks.slots.len()).filter(|&i| !later(&app.tasks.slots[i])).collect();
        let mut handles: Vec<_> = now.into_iter().map(|index| spawn_loop(app, index)).collect();
        let this = app.clone();
        handles.push(
            app.spawn_background(async move {
                first.await;
                let slots = &this.tasks.slots;
                let then: Vec<_> = (0..slots.len())
                    .filter(|&i| later(&slots[i]))
                    .map(|index| spawn_loop(&this, index))
                    .collect();
                this.tasks.keep(then);
            })
            .abort_handle(),
        );
        app.tasks.keep(handles);
    }

    /// Keeps `handles` to abort at [`Driver::stop`] (at once when it has been called), and
    /// forgets those that ended.
    fn keep(&self, handles: Vec<tokio::task::AbortHandle>) {
        let mut loops = self.loops.lock().expect("task loops");
        loops.retain(|h| !h.is_finished());
        if self.stopped.load(Ordering::SeqCst) {
            handles.iter().for_each(tokio::task::AbortHandle::abort);
        }
        loops.extend(handles);
    }

    /// Stops every loop and activation where it stands (tasks are idempotent: the next
    /// process's first activation finishes what one left).
    pub fn stop(&self) {
        let loops = self.loops.lock().expect("task loops");
        self.stopped.store(true, Ordering::SeqCst);
        loops.iter().for_each(tokio::task::AbortHandle::abort);
    }

    async fn run(app: Arc<App>, index: usize) {
        let slot = &app.tasks.slots[index];
        let (name, period) = (slot.task.name(), slot.task.period(&app.config));
        let mut wait = period;
        if !slot.task.at_start() {
            Driver::idle(slot, wait).await;
        }
        loop {
            let ok = matches!(app.tasks.activate(&app, name).await, Some(Ok(_)));
            wait = match (ok, slot.task.backs_off()) {
                (false, true) => (wait * 2).clamp(period, MAX_BACKOFF.max(period)),
                _ => period,
            };
            Driver::idle(slot, wait).await;
        }
    }

    async fn idle(slot: &Slot, wait: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = slot.trigger.notified() => {}
        }
    }

    /// The last report of `name` and its status, for views that sum several tasks.
    pub(crate) fn last(&self, name: TaskName) -> Option<TaskSummary> {
        let slot = self.slot(name)?;
        let status = slot.status.lock().expect("task status");
        Some(TaskSummary {
            activations: status.activations,
            failures: status.failures,
            last_started_ms: status.last_started_ms,
            last_error: status.last_error.clone(),
            report: status.last_report.clone(),
        })
    }

    /// Every task as admins see it, in the order they were registered.
    pub fn views(&self, config: &Config) -> Vec<BackgroundTaskView> {
        self.slots
            .iter()
            .map(|slot| {
                let status = slot.status.lock().expect("task status").clone();
                BackgroundTaskView {
                    name: slot.task.name().as_str().to_owned(),
                    description: slot.task.describe().to_owned(),
                    period_ms: duration_ms(slot.task.period(config)),
                    running: status.running,
                    activations: status.activations,
                    failures: status.failures,
                    last_started_ms: status.last_started_ms,
                    last_duration_ms: status.last_duration.map(duration_ms),
                    last_outcome: status.last_outcome,
                    last_error: status.last_error,
                    last_report: status
                        .last_report
                        .0
                        .iter()
                        .map(|(what, n)| ((*what).to_owned(), *n))
                        .collect(),
                }
            })
            .collect()
    }

    /// Each task's activations, failures, last duration and last success, in the Prometheus
    /// text format.
    pub fn render(&self, out: &mut String) {
        let statuses: Vec<(&str, Status)> = self
            .slots
            .iter()
            .map(|s| (s.task.name().as_str(), s.status.lock().expect("task status").clone()))
            .collect();
        let families: [Family; 4] = [
            (
                "gsaas_background_task_activations_total",
                "counter",
                "Activations of each background task that ended.",
                |s| Some(s.activations as f64),
            ),
            (
                "gsaas_background_task_failures_total",
                "counter",
                "Activations of each background task that failed.",
                |s| Some(s.failures as f64),
            ),
            (
                "gsaas_background_task_last_duration_seconds",
                "gauge",
                "How long each background task's last activation took.",
                |s| s.last_duration.map(|d| d.as_secs_f64()),
            ),
            (
                "gsaas_background_task_last_success_timestamp_seconds",
                "gauge",
                "When each background task's last successful activation ended.",
                |s| s.last_success_ms.map(|ms| ms as f64 / 1000.0),
            ),
        ];
        for (family, kind, help, value) in families {
            header(out, family, kind, help);
            for (task, status) in &statuses {
                if let Some(v) = value(status) {
                    let _ = writeln!(out, "{family}{{task=\"{task}\"}} {v}");
                }
            }
        }
    }
}

/// A metric family of the tasks: its name, type, help and each task's value.
type Family = (&'static str, &'static str, &'static str, fn(&Status) -> Option<f64>);

/// An activation under way: it records how it ended, or, dropped before (a panic, a stop), that
/// it failed, so that a task never shows as running for ever.
struct Running<'a> {
    slot: &'a Slot,
    started: Instant,
    ended: bool,
}

impl<'a> Running<'a> {
    fn start(slot: &'a Slot) -> Running<'a> {
        let mut status = slot.status.lock().expect("task status");
        status.running = true;
        status.last_started_ms = Some(now_ms());
        Running { slot, started: Instant::now(), ended: false }
    }

    fn end(&mut self, result: &Result<Report, Failed>) {
        self.ended = true;
        let name = self.slot.task.name();
        let mut status = self.slot.status.lock().expect("task status");
        status.running = false;
        status.activations += 1;
        status.last_duration = Some(self.started.elapsed());
        match result {
            Ok(report) => {
                status.last_outcome = Some(TaskOutcome::Ok);
                status.last_error = None;
                status.last_report = report.clone();
                status.last_success_ms = Some(now_ms());
            }
            Err(Failed { report, error }) => {
                tracing::warn!(task = name.as_str(), error = %ErrorChain(error), "background task");
                status.failures += 1;
                status.last_outcome = Some(TaskOutcome::Error);
                status.last_error = Some(error.to_string());
                status.last_report = report.clone();
            }
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let error = Error::internal("the activation panicked or was stopped");
            self.end(&Err(Failed::from(error)));
        }
    }
}

/// What [`Driver::last`] tells of a task.
#[derive(Debug, Clone)]
pub(crate) struct TaskSummary {
    pub activations: u64,
    pub failures: u64,
    pub last_started_ms: Option<i64>,
    pub last_error: Option<String>,
    pub report: Report,
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
