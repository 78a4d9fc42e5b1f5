//! The kernel's firewall: the rendered transactions through `nft -j`, connection cuts through
//! `conntrack`. The one place the agent runs either program; `gsaasd` never links this.

use std::ffi::OsString;
use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddrV4;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rodvr_core::firewall::{describe, Firewall, FirewallError};
use rodvr_core::render::{RouteKey, RouteMap, Transaction};

use crate::conntrack::{Conntrack, TcpEntry};

/// An open connection as conntrack lists it: its original source, destination and ports, and
/// where it was sent (the reply's source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedConnection {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub sent_to: SocketAddrV4,
}

/// The DNATed TCP connections in `conntrack -L` output (lines of `key=value` fields: the first
/// `src dst sport dport` are the original direction's, the second the reply's).
pub fn tracked_connections(listing: &str) -> Vec<TrackedConnection> {
    listing
        .lines()
        .filter_map(|line| {
            let mut fields: Vec<(&str, &str)> =
                line.split_whitespace().filter_map(|f| f.split_once('=')).collect();
            let mut take = |key: &str| {
                let at = fields.iter().position(|(k, _)| *k == key)?;
                Some(fields.remove(at).1)
            };
            let endpoint = |ip: Option<&str>, port: Option<&str>| -> Option<SocketAddrV4> {
                Some(SocketAddrV4::new(ip?.parse().ok()?, port?.parse().ok()?))
            };
            let (src, dst) = (take("src"), take("dst"));
            let (sport, dport) = (take("sport"), take("dport"));
            let (reply_src, _reply_dst) = (take("src"), take("dst"));
            let reply_sport = take("sport");
            Some(TrackedConnection {
                src: endpoint(src, sport)?,
                dst: endpoint(dst, dport)?,
                sent_to: endpoint(reply_src, reply_sport)?,
            })
        })
        .collect()
}

/// The connections of `tracked` that a route of `routes` carries (same VM address and masked
/// endpoint) but that went to another target than every such route's.
pub fn stale_connections<'a>(
    tracked: &'a [TrackedConnection],
    routes: &RouteMap,
) -> Vec<&'a TrackedConnection> {
    tracked
        .iter()
        .filter(|c| {
            let mut targets = routes
                .iter()
                .filter(|(k, _)| k.ip == *c.src.ip() && k.masked == c.dst)
                .map(|(_, target)| *target)
                .peekable();
            targets.peek().is_some() && targets.all(|t| t != c.sent_to)
        })
        .collect()
}

/// Documents up to this size go through the long-lived `nft -j -i` session; larger ones (full
/// tables) through a one-shot `nft -j -f -`. The session reads its input through libedit, one
/// byte per `read()` (about 0.5 µs a byte), which beats a new process (start-up, and ~10 ms in
/// `close()` of its netlink socket after a transaction that deleted anything: the kernel waits
/// for an RCU grace period there) only for small documents.
pub const SESSION_MAX_DOC: usize = 16 * 1024;
/// The session is restarted after this many transactions (libedit keeps every line in its
/// in-memory history).
const SESSION_MAX_TRANSACTIONS: u32 = 500;
/// How long one session transaction may take before the session is killed.
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Sent after every document: its output marks where the document's own output (errors) ends.
/// It needs nothing from the kernel: a `list` command here would make nft 1.0.6 fetch the whole
/// ruleset, set elements included, before every transaction.
const SYNC_COMMAND: &str = "describe meta mark";
const SYNC_REPLY: &str = "meta expression, datatype mark";

/// The kernel, through the `nft` program (optionally wrapped, e.g. `ip netns exec NS nft`).
///
/// Small transactions (element updates) go to one long-lived `nft -j -i` process, one JSON
/// document per line; each line is one `nft_run_cmd_from_buffer`, i.e. one kernel transaction,
/// exactly as `nft -j -f` would run it. Its errors are read back before the next document, so a
/// failed transaction is reported per change. Full tables go through the `nftables` crate's
/// `nft -j -f -` helper.
#[derive(Debug)]
pub struct NftFirewall {
    program: OsString,
    args: Vec<OsString>,
    session: Option<NftSession>,
    /// How connections are cut.
    conntrack: ConntrackVia,
}

/// Where the agent cuts connections: through ctnetlink itself (the default), or by running a
/// `conntrack` program (`conntrack_command`).
#[derive(Debug)]
enum ConntrackVia {
    /// Its socket, opened on first use and again after a failure.
    Netlink(Option<Conntrack>),
    /// The program and its leading arguments (connections are cut with `-D`).
    Program(Vec<OsString>),
}

impl Clone for ConntrackVia {
    /// The same way, with a socket of its own.
    fn clone(&self) -> Self {
        match self {
            ConntrackVia::Netlink(_) => ConntrackVia::Netlink(None),
            ConntrackVia::Program(command) => ConntrackVia::Program(command.clone()),
        }
    }
}

impl NftFirewall {
    /// `command` is the program and its leading arguments; `-j -f -` (or `-j -i`) is appended.
    pub fn new(command: &[String]) -> Self {
        let (program, args) =
            command.split_first().map_or(("nft", &[][..]), |(p, a)| (p.as_str(), a));
        Self {
            program: program.into(),
            args: args.iter().map(OsString::from).collect(),
            session: None,
            conntrack: ConntrackVia::Netlink(None),
        }
    }

    /// Cuts connections by running `command` (the program and its leading arguments, e.g.
    /// `ip netns exec NS conntrack`) instead of through netlink; none: through netlink.
    pub fn with_conntrack(mut self, command: &[String]) -> Self {
        if !command.is_empty() {
            self.conntrack = ConntrackVia::Program(command.iter().map(OsString::from).collect());
        }
        self
    }

    /// The agent's ctnetlink socket, opened if need be.
    fn netlink(socket: &mut Option<Conntrack>) -> Result<&mut Conntrack, FirewallError> {
        if socket.is_none() {
            *socket = Some(Conntrack::open().map_err(|e| netlink_failed(&e))?);
        }
        Ok(socket.as_mut().expect("opened above"))
    }

    fn apply_in_session(&mut self, doc: &str) -> Result<(), FirewallError> {
        let mut current = self.session.take();
        if let Some(s) = &mut current {
            if s.transactions >= SESSION_MAX_TRANSACTIONS || !s.alive() {
                current = None;
            }
        }
        let session = match current {
            Some(s) => s,
            None => NftSession::spawn(&self.program, &self.args)
                .map_err(|e| FirewallError::Session(format!("cannot start nft: {e}")))?,
        };
        let session = self.session.insert(session);
        match session.apply(doc) {
            Ok(()) => Ok(()),
            Err(SessionError::Rejected(errors)) => Err(FirewallError::Rejected(errors)),
            Err(SessionError::Broken(why)) => {
                // Killed on drop; the next transaction starts a new session.
                self.session = None;
                Err(FirewallError::Session(why))
            }
        }
    }
}

impl Default for NftFirewall {
    fn default() -> Self {
        Self::new(&[])
    }
}

impl Clone for NftFirewall {
    /// The same `nft` command, with a session of its own.
    fn clone(&self) -> Self {
        Self {
            program: self.program.clone(),
            args: self.args.clone(),
            session: None,
            conntrack: self.conntrack.clone(),
        }
    }
}

impl NftFirewall {
    /// One `nft -j` document, one kernel transaction: small ones through the session.
    fn apply_document(&mut self, doc: &str) -> Result<(), FirewallError> {
        if doc.len() <= SESSION_MAX_DOC {
            return self.apply_in_session(doc);
        }
        nftables::helper::apply_ruleset_raw(doc, Some(&self.program), &self.args)
            .map(drop)
            .map_err(nft_failed)
    }
}

impl Firewall for NftFirewall {
    fn apply(&mut self, tx: &Transaction) -> Result<(), FirewallError> {
        self.apply_document(&tx.to_nft_string())
    }

    fn filter_servers(
        &mut self,
        filter: &rodvr_core::render::ServerFilter,
    ) -> Result<(), FirewallError> {
        self.apply_document(&filter.to_nft_string())
    }

    /// Deletes each connection's conntrack entry (matched by the VM's address, the masked
    /// endpoint and the old target as the reply's source). Its next packet then starts a new
    /// entry, is rerouted to the new target, which knows no such connection and resets it.
    fn cut(&mut self, connections: &[(RouteKey, SocketAddrV4)]) -> Result<(), FirewallError> {
        let socket = match &mut self.conntrack {
            ConntrackVia::Program(command) => return cut_by_program(command, connections),
            ConntrackVia::Netlink(_) if connections.is_empty() => return Ok(()),
            ConntrackVia::Netlink(socket) => socket,
        };
        let cut = (|| {
            let conntrack = Self::netlink(socket)?;
            let entries = conntrack.tcp_entries().map_err(|e| netlink_failed(&e))?;
            let cut_off = |e: &&TcpEntry| {
                connections.iter().any(|(key, old)| {
                    *e.src.ip() == key.ip && e.dst == key.masked && e.reply_src == *old
                })
            };
            for entry in entries.iter().filter(cut_off) {
                conntrack.delete(entry).map_err(|e| netlink_failed(&e))?;
            }
            Ok(())
        })();
        if cut.is_err() {
            // Opened again at the next cut.
            *socket = None;
        }
        cut
    }

    fn sweep(&mut self, routes: &RouteMap) -> Result<(), FirewallError> {
        let socket = match &mut self.conntrack {
            ConntrackVia::Program(command) => return sweep_by_program(command, routes),
            ConntrackVia::Netlink(socket) => socket,
        };
        let swept = (|| {
            let conntrack = Self::netlink(socket)?;
            let entries = conntrack.tcp_entries().map_err(|e| netlink_failed(&e))?;
            // The DNATed ones: answered by another than they were sent to.
            let tracked: Vec<TrackedConnection> = entries
                .iter()
                .filter(|e| e.reply_src != e.dst)
                .map(|e| TrackedConnection { src: e.src, dst: e.dst, sent_to: e.reply_src })
                .collect();
            for stale in stale_connections(&tracked, routes) {
                let entry = TcpEntry { src: stale.src, dst: stale.dst, reply_src: stale.sent_to };
                conntrack.delete(&entry).map_err(|e| netlink_failed(&e))?;
            }
            Ok(())
        })();
        if swept.is_err() {
            *socket = None;
        }
        swept
    }
}

fn netlink_failed(error: &std::io::Error) -> FirewallError {
    FirewallError::Cut(format!("conntrack over netlink: {error}"))
}

/// [`NftFirewall::cut`] by running `conntrack -D` once per connection.
fn cut_by_program(
    command: &[OsString],
    connections: &[(RouteKey, SocketAddrV4)],
) -> Result<(), FirewallError> {
    {
        let (program, args) = command.split_first().expect("a conntrack command");
        for (key, old) in connections {
            let output = Command::new(program)
                .args(args)
                .args(["-D", "-p", "tcp", "-s"])
                .arg(key.ip.to_string())
                .arg("-d")
                .arg(key.masked.ip().to_string())
                .arg("--dport")
                .arg(key.masked.port().to_string())
                .arg("-r")
                .arg(old.ip().to_string())
                .arg("--reply-port-src")
                .arg(old.port().to_string())
                .stdin(Stdio::null())
                .output()
                .map_err(|e| FirewallError::Cut(format!("cannot run conntrack: {e}")))?;
            let stderr = String::from_utf8_lossy(&output.stderr);
            // conntrack exits 1 when nothing matched: no connection was open.
            let none_open = output.status.code() == Some(1)
                && stderr.contains("0 flow entries have been deleted");
            if !output.status.success() && !none_open {
                return Err(FirewallError::Cut(format!(
                    "conntrack -D for {} -> {} failed: {}",
                    describe(key),
                    old,
                    stderr.trim()
                )));
            }
        }
        Ok(())
    }
}

/// [`NftFirewall::sweep`] by running `conntrack -L`, then `-D` per stale connection.
fn sweep_by_program(command: &[OsString], routes: &RouteMap) -> Result<(), FirewallError> {
    {
        let (program, args) = command.split_first().expect("a conntrack command");
        let listing = Command::new(program)
            .args(args)
            .args(["-L", "-p", "tcp", "--dst-nat"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| FirewallError::Cut(format!("cannot run conntrack: {e}")))?;
        if !listing.status.success() {
            let stderr = String::from_utf8_lossy(&listing.stderr);
            return Err(FirewallError::Cut(format!("conntrack -L failed: {}", stderr.trim())));
        }
        let tracked = tracked_connections(&String::from_utf8_lossy(&listing.stdout));
        for c in stale_connections(&tracked, routes) {
            let output = Command::new(program)
                .args(args)
                .args(["-D", "-p", "tcp", "-s"])
                .arg(c.src.ip().to_string())
                .arg("--sport")
                .arg(c.src.port().to_string())
                .arg("-d")
                .arg(c.dst.ip().to_string())
                .arg("--dport")
                .arg(c.dst.port().to_string())
                .stdin(Stdio::null())
                .output()
                .map_err(|e| FirewallError::Cut(format!("cannot run conntrack: {e}")))?;
            let stderr = String::from_utf8_lossy(&output.stderr);
            let gone = output.status.code() == Some(1)
                && stderr.contains("0 flow entries have been deleted");
            if !output.status.success() && !gone {
                return Err(FirewallError::Cut(format!(
                    "conntrack -D for {} -> {} failed: {}",
                    c.src,
                    c.dst,
                    stderr.trim()
                )));
            }
        }
        Ok(())
    }
}

/// What a one-shot `nft` said, stderr included (the kernel's reason for refusing a table).
fn nft_failed(error: nftables::helper::NftablesError) -> FirewallError {
    match error {
        nftables::helper::NftablesError::NftFailed { stderr, .. } if !stderr.trim().is_empty() => {
            FirewallError::Rejected(stderr.trim().to_owned())
        }
        other => FirewallError::Nft(other.to_string()),
    }
}

enum SessionError {
    /// nft ran the document and the kernel (or nft) refused it: nothing applied.
    Rejected(String),
    /// The process died, hung or could not be written to: the outcome is unknown.
    Broken(String),
}

/// A long-lived `nft -j -i` process; its stdout and stderr arrive, line by line, on `lines`.
struct NftSession {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    transactions: u32,
}

impl fmt::Debug for NftSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NftSession")
            .field("pid", &self.child.id())
            .field("transactions", &self.transactions)
            .finish()
    }
}

impl NftSession {
    fn spawn(program: &OsString, args: &[OsString]) -> std::io::Result<Self> {
        let (reader, writer) = std::io::pipe()?;
        let mut child = Command::new(program)
            .args(args)
            .args(["-j", "-i"])
            // Interactive nft reads and writes `$HOME/.nft.history`; there is none under a file.
            .env("HOME", "/dev/null")
            .stdin(Stdio::piped())
            .stdout(writer.try_clone()?)
            .stderr(writer)
            .spawn()?;
        let stdin = child.stdin.take().expect("stdin was piped");
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new().name("nft-session".into()).spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        })?;
        Ok(Self { child, stdin, lines, transactions: 0 })
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Runs `doc` (one line of JSON) as one transaction and waits for its outcome.
    fn apply(&mut self, doc: &str) -> Result<(), SessionError> {
        debug_assert!(!doc.contains('\n'), "one document is one line");
        self.transactions += 1;
        let sent = self
            .stdin
            .write_all(doc.as_bytes())
            .and_then(|()| self.stdin.write_all(b"\n"))
            .and_then(|()| self.stdin.write_all(SYNC_COMMAND.as_bytes()))
            .and_then(|()| self.stdin.write_all(b"\n"))
            .and_then(|()| self.stdin.flush());
        if let Err(e) = sent {
            return Err(SessionError::Broken(format!("cannot write to nft: {e}")));
        }
        let deadline = Instant::now() + SESSION_TIMEOUT;
        let mut errors = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(SYNC_REPLY) => break,
                Ok(line) => {
                    if !line.trim().is_empty() {
                        errors.push_str(line.trim_end());
                        errors.push('\n');
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(SessionError::Broken(format!(
                        "no answer from nft within {SESSION_TIMEOUT:?}"
                    )))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(SessionError::Broken(format!("nft exited: {}", errors.trim())))
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SessionError::Rejected(errors.trim_end().to_owned()))
        }
    }
}

impl Drop for NftSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rodvr_core::fixtures::routes;

    #[test]
    fn a_sweep_finds_connections_sent_elsewhere_than_their_route() {
        let listing = "tcp      6 431999 ESTABLISHED src=10.77.0.1 dst=100.127.0.1 sport=40001 \
            dport=9000 src=10.78.0.2 dst=10.232.0.1 sport=8301 dport=40001 [ASSURED] mark=0 use=1\n\
            tcp      6 431999 ESTABLISHED src=10.77.0.2 dst=100.127.0.1 sport=40002 dport=9000 \
            src=10.78.0.9 dst=10.232.0.1 sport=8308 dport=40002 [ASSURED] mark=0 use=1\n\
            tcp      6 117 TIME_WAIT src=10.1.1.1 dst=10.2.2.2 sport=1 dport=2 src=10.3.3.3 \
            dst=10.1.1.1 sport=2 dport=1 mark=0 use=1\n\
            conntrack v1.4.7 (conntrack-tools): 3 flow entries have been shown.\n";
        let tracked = tracked_connections(listing);
        assert_eq!(tracked.len(), 3, "{tracked:?}");
        assert_eq!(tracked[0].sent_to, "10.78.0.2:8301".parse().unwrap());
        // Route 1 goes where its connection went; route 2's went to another target; the third
        // connection is no masked route's (left alone: not the agent's).
        let stale = stale_connections(&tracked, &routes(3));
        assert_eq!(stale, vec![&tracked[1]]);
        assert!(stale_connections(&tracked, &RouteMap::new()).is_empty());
    }
}
