//! Publishing the notifications' outbox: what the database's triggers wrote with each change
//! (`db::notifications`) goes to the broker ([`crate::notifier`]), oldest first, each VM's events
//! in their order, and is forgotten once the broker confirmed it.
//!
//! One replica publishes at a time (a lease in the database, renewed every pass): two publishing
//! at once could interleave a VM's events. When the broker is down nothing is lost: the outbox
//! keeps growing, each pass tries again (backing off to 30 s), and everything goes out in order
//! once it is back. A crash between the broker's confirmation and the outbox's deletion sends
//! those notifications again, with the same `message_id`: at least once, never silently dropped.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::Config;
use crate::db::now_ms;
use crate::error::Error;
use crate::metrics::inc;
use crate::notifier::{outgoing, BrokerError};

/// Notifications sent per broker round trip.
const BATCH: usize = 500;
/// How long the publisher's lease lasts without renewal.
const LEASE_MS: i64 = 10_000;

/// What a pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    pub sent: usize,
    /// Another replica holds the lease.
    pub not_ours: bool,
}

impl App {
    /// Turns the outbox on when this replica publishes, off when nobody does (see
    /// [`db::configure_notifier`]).
    pub async fn configure_notifier(&self) -> Result<(), Error> {
        Ok(self.db.configure_notifier(self.broker.is_some(), now_ms()).await?)
    }

    /// The `publisher_id` of this process's notifications.
    fn publisher_id(&self) -> String {
        static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        self.config.notifications.publisher_id.clone().unwrap_or_else(|| {
            let host = HOST.get_or_init(|| {
                let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                name.trim().to_owned()
            });
            format!("gsaas.{host}")
        })
    }

    /// Sends every waiting notification, if this replica holds (or takes) the publisher's lease,
    /// until the outbox is empty or the broker fails.
    pub async fn publish_notifications(&self) -> Result<Published, Error> {
        let Some(broker) = &self.broker else { return Ok(Published::default()) };
        let (publisher, topic) = (self.publisher_id(), &self.config.notifications.topic);
        let mut published = Published::default();
        loop {
            let now = now_ms();
            if !self.db.take_notifier_lease(&self.instance, now, now + LEASE_MS).await? {
                published.not_ours = true;
                return Ok(published);
            }
            let waiting = self.db.waiting_notifications(BATCH).await?;
            if waiting.is_empty() {
                return Ok(published);
            }
            let batch: Vec<_> = waiting.iter().map(|n| outgoing(n, &publisher, topic)).collect();
            let (confirmed, failure) = broker.publish(&batch).await;
            self.db.forget_notifications(&waiting[..confirmed]).await?;
            published.sent += confirmed;
            self.metrics.notifications_published.fetch_add(confirmed as u64, Ordering::Relaxed);
            if let Some(BrokerError(reason)) = failure {
                inc(&self.metrics.notification_failures);
                return Err(Error::unavailable("notification broker", reason));
            }
        }
    }
}

/// Runs only where a broker is configured.
#[derive(Debug)]
pub(crate) struct Notifications;

#[async_trait]
impl Task for Notifications {
    fn name(&self) -> TaskName {
        TaskName::Notifications
    }
    fn describe(&self) -> &'static str {
        "Publishes the notifications' outbox to the broker, one replica at a time."
    }
    fn period(&self, config: &Config) -> Duration {
        Duration::from_millis(config.notifications.poll_ms)
    }
    /// While the broker is down, tries less often (up to every 30 s).
    fn backs_off(&self) -> bool {
        true
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let published = app.publish_notifications().await?;
        let report = Report::default().with("sent", published.sent);
        Ok(report.with("not_ours", u64::from(published.not_ours)))
    }
}
