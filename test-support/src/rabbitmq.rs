//! A throwaway RabbitMQ (Debian's `rabbitmq-server`) for a test: its own epmd, node name, ports
//! and directories, on loopback, killed with the test binary (`setpriv --pdeathsig KILL` from
//! threads that wait on them). [`Rabbit::stop`] and [`Rabbit::start_again`] take the broker down
//! and bring it back on the same data (durable queues and persistent messages survive), as an
//! outage would. The recipe is `scripts/openstack-dev.sh`'s: the listener is set in
//! `rabbitmq.conf`, since this version's `RABBITMQ_NODE_PORT` ends in `eaddrinuse`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::Value;

/// How long a broker may take to boot and take connections.
const BOOT: Duration = Duration::from_secs(120);
const SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

static NEXT: AtomicU32 = AtomicU32::new(0);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// One broker of a test.
#[derive(Debug)]
pub struct Rabbit {
    dir: PathBuf,
    pub amqp_port: u16,
    epmd_port: u16,
    dist_port: u16,
    node: String,
    /// The broker's process group, while it runs.
    pgid: Mutex<Option<i32>>,
}

/// Runs `cmd` in a process group of its own from a thread that waits for it, so
/// `--pdeathsig` (set by the caller) fires when that thread, or the test binary, ends. Returns
/// its pid.
fn spawn_waited(mut cmd: Command) -> i32 {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0).stdin(Stdio::null());
    let (tell, told) = std::sync::mpsc::channel();
    std::thread::spawn(move || match cmd.spawn() {
        Ok(mut child) => {
            let _ = tell.send(Ok(child.id() as i32));
            let _ = child.wait();
        }
        Err(e) => {
            let _ = tell.send(Err(e.to_string()));
        }
    });
    told.recv().expect("the spawning thread answers").unwrap_or_else(|e| panic!("{e}"))
}

impl Rabbit {
    /// Starts a broker and waits (bounded) until it takes AMQP connections.
    pub async fn start() -> Rabbit {
        assert!(
            std::path::Path::new(SERVER).exists(),
            "RabbitMQ is not installed ({SERVER} missing); scripts/test.sh installs it"
        );
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("gsaas-rabbit-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["mnesia", "log", "home"] {
            std::fs::create_dir_all(dir.join(sub)).expect("the broker's directories");
        }
        let rabbit = Rabbit {
            amqp_port: free_port(),
            epmd_port: free_port(),
            dist_port: free_port(),
            node: format!("gsaas-test-{}-{n}@localhost", std::process::id()),
            dir,
            pgid: Mutex::new(None),
        };
        std::fs::write(rabbit.dir.join("enabled_plugins"), "[].\n").unwrap();
        std::fs::write(
            rabbit.dir.join("rabbitmq.conf"),
            format!("loopback_users = none\nlisteners.tcp.1 = 127.0.0.1:{}\n", rabbit.amqp_port),
        )
        .unwrap();
        let epmd = std::fs::read_dir("/usr/lib/erlang")
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin/epmd"))
            .find(|p| p.exists())
            .expect("epmd under /usr/lib/erlang/erts-*/bin (erlang-base)");
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(epmd)
            .args(["-address", "127.0.0.1", "-port", &rabbit.epmd_port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        spawn_waited(cmd);
        rabbit.start_again().await;
        rabbit
    }

    /// oslo.messaging's transport URL of this broker.
    pub fn transport_url(&self) -> String {
        format!("rabbit://guest:guest@127.0.0.1:{}/", self.amqp_port)
    }

    /// The AMQP URI of this broker (its default virtual host).
    pub fn amqp_uri(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    /// Starts the broker on its data (after [`Self::stop`]) and waits until it takes AMQP
    /// connections (at most 120 s: an Erlang node boots slowly on a loaded 2-core CI machine; one
    /// took over 60 s while the whole suite ran).
    pub async fn start_again(&self) {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--", SERVER])
            .env("HOME", self.dir.join("home"))
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", self.dir.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq"))
            .env("RABBITMQ_PID_FILE", self.dir.join("pid"))
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .stdout(std::fs::File::create(self.dir.join("server.out")).unwrap())
            .stderr(Stdio::null());
        let pgid = spawn_waited(cmd);
        *self.pgid.lock().unwrap() = Some(pgid);
        let deadline = Instant::now() + BOOT;
        loop {
            // Bounded: a broker still booting may take the connection and not answer it.
            let connected = tokio::time::timeout(
                Duration::from_secs(5),
                lapin::Connection::connect(
                    &self.amqp_uri(),
                    lapin::ConnectionProperties::default(),
                ),
            )
            .await;
            if let Ok(Ok(connection)) = connected {
                let _ = connection.close(200, "ready".into()).await;
                return;
            }
            let out = std::fs::read_to_string(self.dir.join("server.out")).unwrap_or_default();
            assert!(Instant::now() < deadline, "RabbitMQ did not start within {BOOT:?}:\n{out}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the broker (SIGTERM, as an operator's stop; SIGKILL after 30 s) and waits until it
    /// is gone.
    pub async fn stop(&self) {
        let Some(pgid) = self.pgid.lock().unwrap().take() else { return };
        let kill = |signal: &str| {
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), "--", &format!("-{pgid}")])
                .stderr(Stdio::null())
                .status();
        };
        kill("TERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::path::Path::new(&format!("/proc/{pgid}")).exists() {
            if Instant::now() > deadline {
                kill("KILL");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Nothing listens any more (the group's other processes go with the leader).
        while std::net::TcpStream::connect(("127.0.0.1", self.amqp_port)).is_ok() {
            kill("KILL");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Consumes `queue` (declared durable, as gsaasd declares it) in the background, acking each
    /// message; what arrives, parsed as JSON, goes to the inbox.
    pub async fn consume(&self, queue: &str) -> Inbox {
        let received = Arc::new(Mutex::new(Vec::new()));
        let connection = tokio::time::timeout(
            Duration::from_secs(30),
            lapin::Connection::connect(&self.amqp_uri(), lapin::ConnectionProperties::default()),
        )
        .await
        .expect("the test's consumer connects within 30 s")
        .expect("the test's consumer connects");
        let channel = connection.create_channel().await.expect("a channel");
        let durable = QueueDeclareOptions { durable: true, ..Default::default() };
        channel.queue_declare(queue.into(), durable, FieldTable::default()).await.expect("queue");
        let consumer = channel
            .basic_consume(
                queue.into(),
                "gsaas-test".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("basic.consume");
        let into = received.clone();
        consumer.set_delegate(move |delivery: lapin::message::DeliveryResult| {
            let into = into.clone();
            async move {
                if let Ok(Some(delivery)) = delivery {
                    let value = serde_json::from_slice(&delivery.data)
                        .unwrap_or_else(|_| Value::String(format!("{:?}", delivery.data)));
                    into.lock().unwrap().push((delivery.delivery_tag, value));
                    let _ = delivery.ack(BasicAckOptions::default()).await;
                }
            }
        });
        Inbox { received, _connection: connection }
    }
}

/// What a consumer received, while its connection lasts: each message with its delivery tag
/// (the channel numbers deliveries in the order the broker sent them; the delegate that records
/// them may run concurrently).
#[derive(Debug)]
pub struct Inbox {
    received: Arc<Mutex<Vec<(u64, Value)>>>,
    _connection: lapin::Connection,
}

impl Inbox {
    /// What arrived so far, in the order the broker delivered it.
    pub fn messages(&self) -> Vec<Value> {
        let mut received = self.received.lock().unwrap().clone();
        received.sort_by_key(|(tag, _)| *tag);
        received.into_iter().map(|(_, value)| value).collect()
    }

    /// Waits (at most `within`) until `done` holds for what arrived; what arrived then.
    pub async fn wait_for(&self, within: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + within;
        loop {
            let messages = self.messages();
            if done(&messages) {
                return messages;
            }
            assert!(Instant::now() < deadline, "never arrived; got {messages:#?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid.lock().unwrap().take() {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
