//! Where notifications go: RabbitMQ, as OpenStack services publish theirs (oslo.messaging's
//! notifier on its rabbit driver), behind the [`Broker`] trait with an in-memory twin for tests.
//!
//! A notification leaves in oslo.messaging's v2 envelope, `{"oslo.version": "2.0",
//! "oslo.message": "<JSON>"}`, the inner message carrying `message_id`, `publisher_id`,
//! `event_type`, `priority`, `payload` and `timestamp`: what Ceilometer's notification agent and
//! any oslo.messaging listener read. It goes to a topic exchange (`[notifications] exchange`,
//! Nova's would be `nova`) with routing key `<topic>.<priority>` (`notifications.info`), and a
//! queue of that name is declared and bound so that nothing published before a consumer listens
//! is dropped, as oslo.messaging's notifier does.
//!
//! Delivery is at least once: a message counts as sent only when the broker confirmed it
//! (publisher confirms), and is sent again otherwise, with the same `message_id`, which is
//! derived from the VM and the event's number so every retry carries it.

use std::fmt::Debug;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use serde_json::{json, Value};

use crate::model::NotificationRecord;

/// How long opening the broker's connection, or a batch's publishing and confirmations, may
/// take: a broker that accepts connections and then says nothing must not hold the publisher.
const BROKER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The namespace of notifications' message ids (UUID v5 of `<vm>/<seq>`).
const MESSAGE_IDS: uuid::Uuid = uuid::Uuid::from_u128(0x6e0c_9a3e_41d2_4b6f_9d0a_7a51_c2f4_b8e1);

/// A notification's `message_id`: the same for every attempt to send it.
pub fn message_id(vm: &str, seq: i64) -> uuid::Uuid {
    uuid::Uuid::new_v5(&MESSAGE_IDS, format!("{vm}/{seq}").as_bytes())
}

/// oslo.messaging's priority of an event: `ERROR` for a failure, else `INFO`.
pub fn priority(event_type: &str) -> &'static str {
    if event_type.ends_with(".error") {
        "ERROR"
    } else {
        "INFO"
    }
}

/// oslo's timestamp form (`str(datetime.utcnow())`) of `ms`: `2026-11-27 17:00:00.123000`.
pub fn oslo_timestamp(ms: i64) -> String {
    let rfc = crate::openstack::time::format_ms(ms);
    rfc.trim_end_matches('Z').replacen('T', " ", 1)
}

/// One message ready for the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub routing_key: String,
    pub message_id: String,
    pub body: Vec<u8>,
}

/// The notification in oslo.messaging's v2 envelope, for `topic`.
pub fn outgoing(n: &NotificationRecord, publisher_id: &str, topic: &str) -> Outgoing {
    let id = message_id(&n.vm, n.seq).to_string();
    let priority = priority(&n.event_type);
    // Written by the database's JSON functions; read back as JSON, or kept as text if not.
    let payload: Value =
        serde_json::from_str(&n.payload).unwrap_or_else(|_| Value::String(n.payload.clone()));
    let message = json!({
        "message_id": id,
        "publisher_id": publisher_id,
        "event_type": n.event_type,
        "priority": priority,
        "payload": payload,
        "timestamp": oslo_timestamp(n.created_ms),
    });
    let envelope = json!({ "oslo.version": "2.0", "oslo.message": message.to_string() });
    Outgoing {
        routing_key: format!("{topic}.{}", priority.to_lowercase()),
        message_id: id,
        body: envelope.to_string().into_bytes(),
    }
}

/// An oslo.messaging transport URL (`rabbit://user:password@host:5672/vhost`) as the AMQP URI
/// the client takes: `rabbit` is `amqp`, and no virtual host (or `/`) is RabbitMQ's default,
/// `/`. `amqp://` and `amqps://` are taken as they are.
pub fn amqp_uri(transport_url: &str) -> Result<String, String> {
    let (scheme, rest) = transport_url
        .split_once("://")
        .ok_or_else(|| "must be a URL: rabbit://user:password@host:5672/".to_owned())?;
    let scheme = match scheme {
        "rabbit" | "amqp" => "amqp",
        "amqps" => "amqps",
        other => return Err(format!("scheme {other:?} is not rabbit, amqp or amqps")),
    };
    let (authority, vhost) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() || authority.contains(',') {
        return Err("must name one broker (host[:port])".to_owned());
    }
    let vhost = if vhost.is_empty() { "%2f" } else { vhost };
    let uri = format!("{scheme}://{authority}/{vhost}");
    uri.parse::<lapin::uri::AMQPUri>().map_err(|e| format!("cannot be read: {e}"))?;
    Ok(uri)
}

/// Why a batch was not all sent.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BrokerError(pub String);

/// Where notifications are published.
#[async_trait::async_trait]
pub trait Broker: Send + Sync + Debug {
    /// Sends `batch` in order: how many of its first messages the broker confirmed (those are
    /// delivered), and what stopped the rest, if anything did.
    async fn publish(&self, batch: &[Outgoing]) -> (usize, Option<BrokerError>);
}

/// RabbitMQ, over one connection and channel (with publisher confirms), opened when first
/// needed and again after any failure.
#[derive(Debug)]
pub struct RabbitMq {
    uri: crate::secret_url::SecretUrl,
    exchange: String,
    topic: String,
    durable: bool,
    channel: tokio::sync::Mutex<Option<(Connection, Channel)>>,
}

impl RabbitMq {
    pub fn new(uri: String, exchange: String, topic: String, durable: bool) -> RabbitMq {
        RabbitMq {
            uri: uri.into(),
            exchange,
            topic,
            durable,
            channel: tokio::sync::Mutex::new(None),
        }
    }

    /// Connects, turns publisher confirms on, and declares the exchange and the queues of
    /// `<topic>.info` and `<topic>.error` bound to it.
    async fn open(&self) -> Result<(Connection, Channel), lapin::Error> {
        let connection =
            Connection::connect(self.uri.expose(), ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        let durable = self.durable;
        channel
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions { durable, ..Default::default() },
                FieldTable::default(),
            )
            .await?;
        for priority in ["info", "error"] {
            let queue = format!("{}.{priority}", self.topic);
            channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions { durable, ..Default::default() },
                    FieldTable::default(),
                )
                .await?;
            channel
                .queue_bind(
                    queue.as_str().into(),
                    self.exchange.as_str().into(),
                    queue.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok((connection, channel))
    }
}

#[async_trait::async_trait]
impl Broker for RabbitMq {
    async fn publish(&self, batch: &[Outgoing]) -> (usize, Option<BrokerError>) {
        let mut open = self.channel.lock().await;
        if open.is_none() {
            match tokio::time::timeout(BROKER_TIMEOUT, self.open()).await {
                Ok(Ok(opened)) => *open = Some(opened),
                Ok(Err(e)) => return (0, Some(BrokerError(format!("cannot reach RabbitMQ: {e}")))),
                Err(_) => {
                    let failure = format!("RabbitMQ did not answer within {BROKER_TIMEOUT:?}");
                    return (0, Some(BrokerError(failure)));
                }
            }
        }
        let (_, channel) = open.as_ref().expect("opened above");
        let mut confirms = Vec::with_capacity(batch.len());
        let mut failure = None;
        for message in batch {
            let properties = BasicProperties::default()
                .with_content_type("application/json".into())
                .with_message_id(message.message_id.as_str().into())
                .with_delivery_mode(if self.durable { 2 } else { 1 });
            match channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    message.routing_key.as_str().into(),
                    BasicPublishOptions::default(),
                    &message.body,
                    properties,
                )
                .await
            {
                Ok(confirm) => confirms.push(confirm),
                Err(e) => {
                    failure = Some(BrokerError(format!("publishing failed: {e}")));
                    break;
                }
            }
        }
        let mut confirmed = 0;
        let deadline = tokio::time::Instant::now() + BROKER_TIMEOUT;
        for confirm in confirms {
            let Ok(confirm) = tokio::time::timeout_at(deadline, confirm).await else {
                failure = Some(BrokerError(format!(
                    "RabbitMQ confirmed {confirmed} of {} within {BROKER_TIMEOUT:?}",
                    batch.len()
                )));
                break;
            };
            match confirm {
                Ok(c) if c.is_ack() => confirmed += 1,
                Ok(_) => {
                    failure = Some(BrokerError("RabbitMQ refused a message (nack)".to_owned()));
                    break;
                }
                Err(e) => {
                    failure = Some(BrokerError(format!("no confirmation from RabbitMQ: {e}")));
                    break;
                }
            }
        }
        if failure.is_some() {
            // Opened afresh for the next batch: a channel that failed may be closed.
            if let Some((connection, _)) = open.take() {
                let _ = connection.close(200, "reopening".into()).await;
            }
        }
        (confirmed, failure)
    }
}

/// The broker of tests without RabbitMQ: keeps what it was sent; `down` refuses everything.
#[derive(Debug, Default)]
pub struct MemoryBroker {
    pub sent: std::sync::Mutex<Vec<Outgoing>>,
    pub down: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Broker for MemoryBroker {
    async fn publish(&self, batch: &[Outgoing]) -> (usize, Option<BrokerError>) {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return (0, Some(BrokerError("the broker is down".to_owned())));
        }
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(batch);
        (batch.len(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_urls_become_amqp_uris() {
        let uri = |s: &str| amqp_uri(s);
        assert_eq!(
            uri("rabbit://guest:guest@127.0.0.1:5672/").unwrap(),
            "amqp://guest:guest@127.0.0.1:5672/%2f"
        );
        assert_eq!(uri("rabbit://u:p@mq:5672/openstack").unwrap(), "amqp://u:p@mq:5672/openstack");
        assert_eq!(uri("amqps://u:p@mq:5671").unwrap(), "amqps://u:p@mq:5671/%2f");
        for bad in ["", "mq:5672", "kafka://mq:9092/", "rabbit:///", "rabbit://a:1,b:2/"] {
            assert!(uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn notifications_leave_in_oslo_messagings_envelope_with_a_stable_id() {
        let n = NotificationRecord {
            vm: "01a2".into(),
            seq: 3,
            event_type: "gpu.vm.create.end".into(),
            payload: r#"{"project_id": "alpha", "ncgpus": 2}"#.into(),
            created_ms: 1_764_000_000_123,
        };
        let out = outgoing(&n, "gsaas.host-1", "notifications");
        assert_eq!(out.routing_key, "notifications.info");
        assert_eq!(out, outgoing(&n, "gsaas.host-1", "notifications"), "the same every time");
        let envelope: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(envelope["oslo.version"], "2.0");
        let message: Value =
            serde_json::from_str(envelope["oslo.message"].as_str().unwrap()).unwrap();
        assert_eq!(message["message_id"], out.message_id);
        assert_eq!(message["event_type"], "gpu.vm.create.end");
        assert_eq!(message["priority"], "INFO");
        assert_eq!(message["publisher_id"], "gsaas.host-1");
        assert_eq!(message["payload"]["ncgpus"], 2);
        assert_eq!(message["timestamp"], "2025-11-24 16:00:00.123000");
        let other = NotificationRecord { seq: 4, ..n.clone() };
        assert_ne!(outgoing(&other, "gsaas.host-1", "notifications").message_id, out.message_id);
        let error = NotificationRecord { event_type: "gpu.vm.create.error".into(), ..n };
        assert_eq!(outgoing(&error, "p", "notifications").routing_key, "notifications.error");
    }
}
