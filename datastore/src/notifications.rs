//! The notifications' outbox (`migrations/0028_notifications.*.sql`, whose triggers write it):
//! whether it is written, which replica publishes it (a lease), what waits in it.

use sqlx::{AnyConnection, Connection, Row};

use super::Db;
use crate::error::Error;
use crate::model::NotificationRecord;

/// The triggers that write the outbox, by table (`migrations/0028_notifications.*.sql`). They
/// exist (SQLite) or are enabled (PostgreSQL) only while `notifier.enabled` is 1.
const NOTIFY_TRIGGERS: [(&str, &str); 4] = [
    ("vms", "vms_notify_insert"),
    ("vms", "vms_notify_update"),
    ("cgpus", "cgpus_notify_update"),
    ("cgpus", "cgpus_notify_delete"),
];

/// Turns the outbox's triggers on or off with `notifier.enabled`: off, they cost nothing, where a
/// trigger that finds the outbox off still runs on every change of a VM's or a cGPU's state (on
/// PostgreSQL a PL/pgSQL call, on SQLite a sub-program that reads `notifier`). PostgreSQL
/// disables them; SQLite, which cannot, drops them and creates them again from 0028's text.
async fn switch_notify_triggers(conn: &mut AnyConnection, on: bool) -> Result<(), Error> {
    let sqlite = conn.backend_name() != "PostgreSQL";
    for (table, trigger) in NOTIFY_TRIGGERS {
        let sql = match (sqlite, on) {
            (false, true) => format!("ALTER TABLE {table} ENABLE TRIGGER {trigger}"),
            (false, false) => format!("ALTER TABLE {table} DISABLE TRIGGER {trigger}"),
            (true, true) => sqlite_notify_trigger(trigger)?.replacen(
                "CREATE TRIGGER ",
                "CREATE TRIGGER IF NOT EXISTS ",
                1,
            ),
            (true, false) => format!("DROP TRIGGER IF EXISTS {trigger}"),
        };
        sqlx::query(&sql).execute(&mut *conn).await?;
    }
    Ok(())
}

/// SQLite's `CREATE TRIGGER` statement of `trigger`, as migration 0028 wrote it (released
/// migrations never change, so this is the text the store had).
fn sqlite_notify_trigger(trigger: &str) -> Result<&'static str, Error> {
    let (_, _, sql, _) = super::DIALECT_MIGRATIONS
        .iter()
        .find(|(version, ..)| *version == 28)
        .ok_or_else(|| Error::internal("migration 0028 is missing"))?;
    let start = sql.find(&format!("CREATE TRIGGER {trigger} "));
    let end = start.and_then(|start| sql[start..].find("\nEND;").map(|end| start + end + 5));
    match (start, end) {
        (Some(start), Some(end)) => Ok(&sql[start..end]),
        _ => Err(Error::internal(format!("migration 0028 has no trigger {trigger}"))),
    }
}

/// Turns the outbox on (a replica that publishes), or off when no replica holds the publisher's
/// lease (a replica started without `[notifications]` must not silence one that has them). The
/// switch and its triggers change in one transaction.
pub async fn configure_notifier(
    conn: &mut AnyConnection,
    publishing: bool,
    now_ms: i64,
) -> Result<(), Error> {
    let mut tx = conn.begin().await?;
    if publishing {
        sqlx::query("UPDATE notifier SET enabled = 1 WHERE id = 1").execute(&mut *tx).await?;
        switch_notify_triggers(&mut tx, true).await?;
    } else {
        let off =
            sqlx::query("UPDATE notifier SET enabled = 0 WHERE id = 1 AND lease_until_ms < $1")
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
        if off.rows_affected() == 1 {
            switch_notify_triggers(&mut tx, false).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Takes or keeps the publisher's lease for `owner` until `until_ms`: whether it holds it. One
/// replica publishes at a time, so each VM's events leave in order.
pub async fn take_notifier_lease(
    conn: &mut AnyConnection,
    owner: &str,
    now_ms: i64,
    until_ms: i64,
) -> Result<bool, Error> {
    let mut tx = conn.begin().await?;
    let was_on: i64 = sqlx::query("SELECT enabled FROM notifier WHERE id = 1")
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
    let taken = sqlx::query(
        "UPDATE notifier SET lease_owner = $1, lease_until_ms = $2, enabled = 1 \
         WHERE id = 1 AND (lease_owner = $1 OR lease_until_ms < $3)",
    )
    .bind(owner)
    .bind(until_ms)
    .bind(now_ms)
    .execute(&mut *tx)
    .await?;
    let taken = taken.rows_affected() == 1;
    if taken && was_on == 0 {
        // The outbox was turned off while nobody published (see `configure_notifier`).
        switch_notify_triggers(&mut tx, true).await?;
    }
    tx.commit().await?;
    Ok(taken)
}

/// Up to `limit` waiting notifications, oldest first, each VM's in its order.
pub async fn waiting_notifications(
    conn: &mut AnyConnection,
    limit: usize,
) -> Result<Vec<NotificationRecord>, Error> {
    let rows = sqlx::query(
        "SELECT vm, seq, event_type, payload, created_ms FROM notifications \
         ORDER BY created_ms, vm, seq LIMIT $1",
    )
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(conn)
    .await?;
    let mut waiting: Vec<NotificationRecord> = rows
        .iter()
        .map(|row| {
            Ok(NotificationRecord {
                vm: row.try_get(0)?,
                seq: row.try_get(1)?,
                event_type: row.try_get(2)?,
                payload: row.try_get(3)?,
                created_ms: row.try_get(4)?,
            })
        })
        .collect::<Result<_, Error>>()?;
    // Two events of a VM in one millisecond: by their number.
    waiting.sort_by(|a, b| (a.created_ms, &a.vm, a.seq).cmp(&(b.created_ms, &b.vm, b.seq)));
    Ok(waiting)
}

/// How many notifications wait.
pub async fn waiting_notification_count(conn: &mut AnyConnection) -> Result<i64, Error> {
    Ok(sqlx::query("SELECT COUNT(*) FROM notifications").fetch_one(conn).await?.try_get(0)?)
}

impl Db {
    /// Forgets notifications the broker confirmed.
    pub async fn forget_notifications(&self, sent: &[NotificationRecord]) -> Result<(), Error> {
        let mut tx = self.begin_write().await?;
        for chunk in sent.chunks(super::MAX_ROWS) {
            let values: Vec<String> =
                (0..chunk.len()).map(|i| format!("(${}, ${})", 2 * i + 1, 2 * i + 2)).collect();
            let sql = format!(
                "DELETE FROM notifications WHERE (vm, seq) IN (VALUES {})",
                values.join(", ")
            );
            let mut query = sqlx::query(&sql);
            for n in chunk {
                query = query.bind(&n.vm).bind(n.seq);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sqlite_trigger_is_found_whole_in_its_migration() {
        for (table, trigger) in NOTIFY_TRIGGERS {
            let sql = sqlite_notify_trigger(trigger).unwrap();
            assert!(sql.starts_with(&format!("CREATE TRIGGER {trigger} AFTER ")), "{sql}");
            assert!(sql.contains(&format!(" ON {table}\n")), "{sql}");
            assert!(sql.ends_with("\nEND;"), "{sql}");
            assert_eq!(sql.matches("BEGIN").count(), 1, "{sql}");
        }
        assert!(sqlite_notify_trigger("vms_notify").is_err());
    }
}
