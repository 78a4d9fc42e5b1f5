//! The queue of requests waiting for capacity (see `app::queue`): one ticket per queued launch
//! (its VM in state `queued`), and per attach a running VM waits for (asked by its owner, or
//! the cGPUs it lost to a preemption, to be given back).

use std::collections::{BTreeSet, HashMap};

use gpgpums::queue::Head;
use gpgpums::{ProjectId, Request, TicketId, VmId};
use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::corrupt;
use super::events::VmEvent;
use super::vms::{vm_from_row, VM_COLUMNS, VM_COLUMN_COUNT};
use crate::error::Error;
use crate::model::VmRecord;

/// What a ticket waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Queued {
    /// The VM's launch (the VM is `queued`).
    Launch,
    /// More cGPUs for the running VM; `give_back`: those a preemption took.
    Attach { attach: Box<QueuedAttach>, give_back: bool },
}

/// An attach as it waits: what to book, by which policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedAttach {
    pub request: Request,
    pub policy: String,
    /// Whether it may borrow past its project's quota (absent: its project's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow: Option<bool>,
}

impl Queued {
    pub fn kind(&self) -> &'static str {
        match self {
            Queued::Launch => "launch",
            Queued::Attach { give_back: false, .. } => "attach",
            Queued::Attach { give_back: true, .. } => "give_back",
        }
    }

    fn attach(&self) -> Option<&QueuedAttach> {
        match self {
            Queued::Launch => None,
            Queued::Attach { attach, .. } => Some(attach),
        }
    }

    fn from_row(kind: &str, attach: Option<&str>) -> Result<Queued, Error> {
        let attach = || -> Result<QueuedAttach, Error> {
            let text = attach.unwrap_or_default();
            serde_json::from_str(text).map_err(|_| corrupt("queued attach", text))
        };
        match kind {
            "launch" => Ok(Queued::Launch),
            "attach" => Ok(Queued::Attach { attach: Box::new(attach()?), give_back: false }),
            "give_back" => Ok(Queued::Attach { attach: Box::new(attach()?), give_back: true }),
            other => Err(corrupt("queue ticket kind", other)),
        }
    }
}

/// A ticket in the queue, with its VM as it is now.
#[derive(Debug, Clone)]
pub struct QueuedVm {
    pub ticket: TicketId,
    pub vm: VmRecord,
    pub queued: Queued,
    pub priority: i32,
    /// How often other projects' requests started ahead of it while it was the head.
    pub passed: u32,
    /// Since when it holds other projects' requests back, if it does.
    pub holding_since_ms: Option<i64>,
    pub enqueued_ms: i64,
    pub deadline_ms: Option<i64>,
}

/// A ticket to write.
#[derive(Debug, Clone)]
pub struct NewTicket<'a> {
    pub vm: &'a VmRecord,
    pub queued: Queued,
    pub now_ms: i64,
    pub deadline_ms: Option<i64>,
}

/// Gives the request the next ticket, at its VM's priority. Runs in the pool transaction, which
/// serializes ticket numbers.
pub async fn enqueue(conn: &mut AnyConnection, new: NewTicket<'_>) -> Result<TicketId, Error> {
    let row =
        sqlx::query("SELECT COALESCE(MAX(ticket), 0) + 1 FROM queue").fetch_one(&mut *conn).await?;
    let ticket: i64 = row.try_get(0)?;
    let attach = new.queued.attach().map(|a| serde_json::to_string(a).expect("attach serializes"));
    sqlx::query(
        "INSERT INTO queue (ticket, vm, project, priority, passed, enqueued_ms, deadline_ms, \
         kind, attach) VALUES ($1, $2, $3, $4, 0, $5, $6, $7, $8)",
    )
    .bind(ticket)
    .bind(new.vm.id.to_string())
    .bind(&new.vm.project)
    .bind(i64::from(new.vm.spec.priority))
    .bind(new.now_ms)
    .bind(new.deadline_ms)
    .bind(new.queued.kind())
    .bind(attach)
    .execute(&mut *conn)
    .await?;
    super::extras_added(conn, new.vm.id).await?;
    Ok(TicketId(ticket as u64))
}

/// Every ticket with its VM, in ticket order.
pub async fn queued_vms(conn: &mut AnyConnection) -> Result<Vec<QueuedVm>, Error> {
    let sql = format!(
        "SELECT {VM_COLUMNS}, q.ticket, q.passed, q.enqueued_ms, q.deadline_ms, q.priority, \
         q.kind, q.attach, q.holding_since_ms FROM queue q JOIN vms v ON v.id = q.vm \
         ORDER BY q.ticket"
    );
    let rows = sqlx::query(&sql).fetch_all(conn).await?;
    rows.iter()
        .map(|row| {
            let at = VM_COLUMN_COUNT;
            let ticket: i64 = row.try_get(at)?;
            let passed: i64 = row.try_get(at + 1)?;
            let priority: i64 = row.try_get(at + 4)?;
            let kind: String = row.try_get(at + 5)?;
            Ok(QueuedVm {
                vm: vm_from_row(row)?,
                ticket: TicketId(
                    u64::try_from(ticket).map_err(|_| corrupt("ticket", &ticket.to_string()))?,
                ),
                queued: Queued::from_row(
                    &kind,
                    row.try_get::<Option<String>, _>(at + 6)?.as_deref(),
                )?,
                priority: i32::try_from(priority)
                    .map_err(|_| corrupt("priority", &priority.to_string()))?,
                passed: u32::try_from(passed).unwrap_or(u32::MAX),
                holding_since_ms: row.try_get(at + 7)?,
                enqueued_ms: row.try_get(at + 2)?,
                deadline_ms: row.try_get(at + 3)?,
            })
        })
        .collect()
}

/// Takes the tickets out of the queue.
pub async fn dequeue(conn: &mut AnyConnection, tickets: &[TicketId]) -> Result<(), Error> {
    for ticket in tickets {
        sqlx::query("DELETE FROM queue WHERE ticket = $1")
            .bind(ticket.0 as i64)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

impl super::Db {
    /// Ends a queued launch: `write` (the VM's end, not claimed) and its tickets out of the
    /// queue, together. False: the VM changed since it was read, and nothing was written.
    pub async fn cancel_queued(&self, write: &mut [super::VmWrite; 1]) -> Result<bool, Error> {
        let mut tx = self.begin_write().await?;
        let written = super::update_vms(&mut tx, write).await?;
        if written.first() != Some(&super::Written::Done { claimed: false }) {
            return Ok(false);
        }
        dequeue_vms(&mut tx, &[write[0].vm.id]).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// Takes every ticket of `vms` out of the queue, in one statement per [`super::MAX_ROWS`] VMs.
pub async fn dequeue_vms(conn: &mut AnyConnection, vms: &[VmId]) -> Result<(), Error> {
    super::fetch_for_vms(conn, vms, |values| {
        format!("DELETE FROM queue WHERE vm IN (VALUES {values})")
    })
    .await?;
    Ok(())
}

/// The head of the queue as the last round planned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueHead {
    pub ticket: TicketId,
    pub project: String,
    pub priority: i32,
    /// How often other projects' requests started ahead of it while it was the head.
    pub passed: u32,
    /// Since when it holds other projects' requests back, if it does.
    pub holding_since_ms: Option<i64>,
    /// Capacity is being taken back from preemptible VMs for it.
    pub awaiting_reclaim: bool,
    /// It would run past its project's quota on loan ([`Head::borrowing`]).
    pub borrowing: bool,
}

/// The `head` column: 0 not the head; 1, and 2 while capacity is being taken back for it; 3 and
/// 4 the same for a head that would borrow (a replica of before cohorts reads 4 as not awaiting).
fn head_code(awaiting_reclaim: bool, borrowing: bool) -> i64 {
    1 + i64::from(awaiting_reclaim) + 2 * i64::from(borrowing)
}

/// Records what a round planned of passes and holds: the projects in `reset` hold nobody back
/// any more and their requests' passes start again; then the head (`None`: no request is
/// blocked), with how often it has been passed and since when it holds.
pub async fn set_head(
    conn: &mut AnyConnection,
    reset: &BTreeSet<ProjectId>,
    head: Option<&Head>,
    awaiting_reclaim: bool,
) -> Result<(), Error> {
    sqlx::query("UPDATE queue SET head = 0 WHERE head > 0").execute(&mut *conn).await?;
    for project in reset {
        sqlx::query("UPDATE queue SET passed = 0, holding_since_ms = NULL WHERE project = $1")
            .bind(project.as_str())
            .execute(&mut *conn)
            .await?;
    }
    if let Some(head) = head {
        sqlx::query(
            "UPDATE queue SET head = $1, passed = $2, holding_since_ms = $3 WHERE ticket = $4",
        )
        .bind(head_code(awaiting_reclaim, head.borrowing))
        .bind(i64::from(head.passed))
        .bind(head.holding_since_ms)
        .bind(head.ticket.0 as i64)
        .execute(conn)
        .await?;
    }
    Ok(())
}

/// The columns of the queue's head, read with [`queue_head_at`] (`q`: the queue).
pub(super) const QUEUE_HEAD_COLUMNS: &str =
    "q.ticket, q.priority, q.passed, q.head, q.project, q.holding_since_ms";

/// The head of the queue from [`QUEUE_HEAD_COLUMNS`] starting at column `at`, if the last round
/// found one that is still waiting (NULLs: none).
pub(super) fn queue_head_at(row: &AnyRow, at: usize) -> Result<Option<QueueHead>, Error> {
    let Some(ticket) = row.try_get::<Option<i64>, _>(at)? else {
        return Ok(None);
    };
    let priority: i64 = row.try_get(at + 1)?;
    let passed: i64 = row.try_get(at + 2)?;
    let code: i64 = row.try_get(at + 3)?;
    Ok(Some(QueueHead {
        ticket: TicketId(ticket as u64),
        project: row.try_get(at + 4)?,
        priority: i32::try_from(priority)
            .map_err(|_| corrupt("priority", &priority.to_string()))?,
        passed: u32::try_from(passed).unwrap_or(u32::MAX),
        holding_since_ms: row.try_get(at + 5)?,
        awaiting_reclaim: code == head_code(true, false) || code == head_code(true, true),
        borrowing: code >= head_code(false, true),
    }))
}

/// Counts `passes` more starts of other projects' requests ahead of the head; one that makes it
/// a barrier (`max_passes` in all) starts its hold at `now_ms`.
pub async fn pass_head(
    conn: &mut AnyConnection,
    ticket: TicketId,
    passes: u32,
    max_passes: u32,
    now_ms: i64,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE queue SET passed = passed + $1, holding_since_ms = CASE \
           WHEN holding_since_ms IS NULL AND passed + $1 >= $2 THEN $3 \
           ELSE holding_since_ms END \
         WHERE ticket = $4",
    )
    .bind(i64::from(passes))
    .bind(i64::from(max_passes))
    .bind(now_ms)
    .bind(ticket.0 as i64)
    .execute(conn)
    .await?;
    Ok(())
}

/// A VM's ticket as its owner sees it: what it waits for and its place in the whole queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePlace {
    pub vm: VmId,
    pub ticket: TicketId,
    pub queued: Queued,
    pub enqueued_ms: i64,
    pub deadline_ms: Option<i64>,
    /// 1: next. Each ticket counts the tickets of higher priority, or of equal priority and
    /// earlier.
    pub position: u64,
}

/// The tickets of `vms` with their places in the queue (in ticket order) and the last `per_vm`
/// events of each (oldest first): what a VM's view shows besides the VM. One statement per
/// [`super::MAX_ROWS`] VMs reads both, so they come from one snapshot (an attach leaves the
/// queue in the transaction that records its event: no view shows both), and a view costs one
/// round trip for them, not two: for nearly every VM both are empty.
pub async fn queue_places_and_events(
    conn: &mut AnyConnection,
    vms: &[VmId],
    per_vm: usize,
) -> Result<(Vec<QueuePlace>, HashMap<VmId, Vec<VmEvent>>), Error> {
    let per_vm = i64::try_from(per_vm).unwrap_or(i64::MAX);
    // Row kind 0: a ticket (vm, ticket, enqueued_ms, kind, attach, deadline_ms, position); 1: an
    // event (vm, seq, at_ms, kind, detail). Tickets first: SQLite's rows take their columns'
    // types from the first SELECT, so it is the one without NULL columns.
    let rows = super::fetch_for_vms(conn, vms, |values| {
        format!(
            "WITH wanted (vm) AS (VALUES {values}) \
             SELECT CAST(0 AS BIGINT), q.vm, q.ticket, q.enqueued_ms, q.kind, q.attach, \
                 q.deadline_ms, (SELECT COUNT(*) FROM queue o WHERE o.priority > q.priority \
                     OR (o.priority = q.priority AND o.ticket < q.ticket)) + 1 \
             FROM queue q WHERE q.vm IN (SELECT vm FROM wanted) \
             UNION ALL \
             SELECT CAST(1 AS BIGINT), vm, seq, at_ms, kind, detail, NULL, NULL FROM ( \
                 SELECT e.vm, e.seq, e.at_ms, e.kind, e.detail, \
                     ROW_NUMBER() OVER (PARTITION BY e.vm ORDER BY e.seq DESC) AS latest \
                 FROM vm_events e WHERE e.vm IN (SELECT vm FROM wanted) \
             ) ranked WHERE latest <= {per_vm} \
             ORDER BY 1, 2, 3"
        )
    })
    .await?;
    let mut places = Vec::new();
    let mut events: HashMap<VmId, Vec<VmEvent>> = HashMap::new();
    for row in &rows {
        let vm: String = row.try_get(1)?;
        let vm = super::vm_id(&vm)?;
        if row.try_get::<i64, _>(0)? == 1 {
            events.entry(vm).or_default().push(super::events::event(row, 3)?);
            continue;
        }
        let ticket: i64 = row.try_get(2)?;
        let kind: String = row.try_get(4)?;
        let position: i64 = row.try_get(7)?;
        places.push(QueuePlace {
            vm,
            ticket: TicketId(
                u64::try_from(ticket).map_err(|_| corrupt("ticket", &ticket.to_string()))?,
            ),
            queued: Queued::from_row(&kind, row.try_get::<Option<String>, _>(5)?.as_deref())?,
            enqueued_ms: row.try_get(3)?,
            deadline_ms: row.try_get(6)?,
            position: u64::try_from(position)
                .map_err(|_| corrupt("queue position", &position.to_string()))?,
        });
    }
    // Chunks come back in chunk order: the whole answer in ticket order.
    places.sort_by_key(|p| p.ticket);
    Ok((places, events))
}

/// A ticket as the queue's views show it, with its VM's name and what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRow {
    pub ticket: TicketId,
    pub vm: VmId,
    pub vm_name: String,
    pub project: String,
    pub priority: i32,
    pub queued: Queued,
    /// The cGPUs it waits for: a launch's whole request, or the attach's.
    pub request: Request,
    pub enqueued_ms: i64,
    pub deadline_ms: Option<i64>,
    /// Its place in the whole queue (1: next).
    pub position: u64,
}

/// The tickets of `project` (every project's for `None`) in queue order, each with its place in
/// the whole queue. Places come from one light read of the whole queue, so that they cost no
/// query per ticket.
pub async fn queue_rows(
    conn: &mut AnyConnection,
    project: Option<&str>,
) -> Result<Vec<QueueRow>, Error> {
    const ORDER: &str = "ORDER BY q.priority DESC, q.ticket";
    let order =
        sqlx::query(&format!("SELECT q.ticket FROM queue q {ORDER}")).fetch_all(&mut *conn).await?;
    let mut positions = HashMap::new();
    for (i, row) in order.iter().enumerate() {
        positions.insert(row.try_get::<i64, _>(0)?, i as u64 + 1);
    }
    let filter = if project.is_some() { "WHERE q.project = $1" } else { "" };
    let sql = format!(
        "SELECT q.ticket, q.vm, v.name, q.project, q.priority, q.kind, q.attach, v.request, \
         q.enqueued_ms, q.deadline_ms FROM queue q JOIN vms v ON v.id = q.vm {filter} {ORDER}"
    );
    let mut query = sqlx::query(&sql);
    if let Some(project) = project {
        query = query.bind(project);
    }
    let mut rows = Vec::new();
    for row in query.fetch_all(conn).await? {
        let ticket: i64 = row.try_get(0)?;
        // Queued after the places were read: it shows from the next read on.
        let Some(&position) = positions.get(&ticket) else { continue };
        let vm: String = row.try_get(1)?;
        let priority: i64 = row.try_get(4)?;
        let kind: String = row.try_get(5)?;
        let queued = Queued::from_row(&kind, row.try_get::<Option<String>, _>(6)?.as_deref())?;
        let request = match &queued {
            Queued::Attach { attach, .. } => attach.request.clone(),
            Queued::Launch => {
                let spec: String = row.try_get(7)?;
                serde_json::from_str::<crate::model::LaunchSpec>(&spec)
                    .map_err(|_| corrupt("launch request", &spec))?
                    .gpus
            }
        };
        rows.push(QueueRow {
            ticket: TicketId(ticket as u64),
            vm: super::vm_id(&vm)?,
            vm_name: row.try_get(2)?,
            project: row.try_get(3)?,
            priority: i32::try_from(priority)
                .map_err(|_| corrupt("priority", &priority.to_string()))?,
            queued,
            request,
            enqueued_ms: row.try_get(8)?,
            deadline_ms: row.try_get(9)?,
            position,
        });
    }
    Ok(rows)
}

/// How many requests the project has waiting that it asked for (give-backs are the service's).
pub async fn waiting_in_project(conn: &mut AnyConnection, project: &str) -> Result<u64, Error> {
    let row = sqlx::query("SELECT COUNT(*) FROM queue WHERE project = $1 AND kind <> 'give_back'")
        .bind(project)
        .fetch_one(conn)
        .await?;
    Ok(row.try_get::<i64, _>(0)? as u64)
}

/// How many requests wait at each priority.
pub async fn queue_lengths(conn: &mut AnyConnection) -> Result<Vec<(i64, i64)>, Error> {
    let rows =
        sqlx::query("SELECT priority, COUNT(*) FROM queue GROUP BY priority ORDER BY priority")
            .fetch_all(conn)
            .await?;
    rows.iter().map(|row| Ok((row.try_get(0)?, row.try_get(1)?))).collect()
}

/// Ready VMs, with no change under way, whose cGPUs may be taken back, with their priority.
pub async fn preemptible_vms(
    conn: &mut AnyConnection,
) -> Result<std::collections::BTreeMap<VmId, i32>, Error> {
    let rows = sqlx::query(
        "SELECT id, priority FROM vms WHERE preemptible = 1 AND state = 'ready' AND step = 'done'",
    )
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let id: String = row.try_get(0)?;
            let priority: i64 = row.try_get(1)?;
            let id: VmId = super::vm_id(&id)?;
            Ok((
                id,
                i32::try_from(priority).map_err(|_| corrupt("priority", &priority.to_string()))?,
            ))
        })
        .collect()
}

/// Starts taking a live cGPU back for the queue (it becomes `detaching`, reclaimed at `now_ms`).
/// Whether it was live.
pub async fn reclaim_cgpu(
    conn: &mut AnyConnection,
    vm: VmId,
    index: u32,
    now_ms: i64,
) -> Result<bool, Error> {
    let moved = sqlx::query(
        "UPDATE cgpus SET state = 'detaching', reclaimed_ms = $1 \
         WHERE vm = $2 AND idx = $3 AND state = 'live'",
    )
    .bind(now_ms)
    .bind(vm.to_string())
    .bind(i64::from(index))
    .execute(&mut *conn)
    .await?;
    if moved.rows_affected() == 0 {
        return Ok(false);
    }
    super::cgpus::bump_cgpus_versions(conn, [vm]).await?;
    Ok(true)
}

/// cGPUs a preemption began taking back at `since_ms` or later and that are still booked: free
/// once their detach releases them. Other detaches (an owner's) are not waited for.
pub async fn reclaiming_cgpus(
    conn: &mut AnyConnection,
    since_ms: i64,
) -> Result<Vec<(VmId, u32)>, Error> {
    let rows = sqlx::query(
        "SELECT vm, idx FROM cgpus WHERE state = 'detaching' AND reclaimed_ms >= $1 \
         ORDER BY vm, idx",
    )
    .bind(since_ms)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let vm: String = row.try_get(0)?;
            let index: i64 = row.try_get(1)?;
            Ok((
                super::vm_id(&vm)?,
                u32::try_from(index).map_err(|_| corrupt("cGPU index", &index.to_string()))?,
            ))
        })
        .collect()
}
