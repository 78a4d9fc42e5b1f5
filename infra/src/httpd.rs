//! The HTTP server both binaries run (gsaasd's API and the agent's), with the limits a server on
//! a shared network needs: axum's own `serve` sets none of them.
//!
//! - A client has [`HttpLimits::header_timeout_secs`] to send a request's headers, counted from
//!   when the server starts waiting for them, so it also closes idle keep-alive connections
//!   (hyper's header read timeout, which needs a timer that `axum::serve` does not give it).
//! - A request's whole body must arrive within [`HttpLimits::body_timeout_secs`]
//!   ([`read_body_within`], called by each server's middleware, which answers 408).
//! - An answer must make progress: a connection whose client stops reading (pipelining requests
//!   and never reading the answers) is closed once a write has waited
//!   [`HttpLimits::write_timeout_secs`].
//! - At most [`HttpLimits::max_connections`] connections are served at once; more wait in the
//!   kernel's accept queue instead of taking memory and file descriptors. One client address
//!   holds at most [`HttpLimits::max_connections_per_client`] of them (more are closed at once),
//!   so one client cannot take the server from the others (probes included).
//! - With [`TlsFiles`], every connection is TLS (1.2 or later, through the system's OpenSSL); the
//!   handshake must end within the header timeout. Bearer tokens then never cross the network in
//!   clear. [`http_client`] is the other side: it trusts the configured CA bundle only.
//!
//! Each request carries its peer's address as axum's `ConnectInfo<SocketAddr>`.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_io_timeout::TimeoutStream;
use tokio_native_tls::TlsAcceptor;
use tower::ServiceExt;

/// A server's certificate chain and private key, PEM files (`[tls]` in gsaasd's and the agent's
/// configs). The key may be PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no usable PEM private key")]
    Key {
        path: PathBuf,
        #[source]
        source: openssl::error::ErrorStack,
    },
    #[error("{cert} and {key} do not make a TLS identity (a PEM certificate chain and its key)")]
    Identity {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: native_tls::Error,
    },
    #[error("{path} holds no PEM certificate to trust")]
    Ca {
        path: PathBuf,
        #[source]
        source: Option<reqwest::Error>,
    },
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

impl TlsFiles {
    /// The acceptor serving this identity (TLS 1.2 or later).
    pub fn acceptor(&self) -> Result<TlsAcceptor, TlsError> {
        let cert = read(&self.cert)?;
        let key = openssl::pkey::PKey::private_key_from_pem(&read(&self.key)?)
            .and_then(|key| key.private_key_to_pem_pkcs8())
            .map_err(|source| TlsError::Key { path: self.key.clone(), source })?;
        let identity =
            |source| TlsError::Identity { cert: self.cert.clone(), key: self.key.clone(), source };
        let identity = native_tls::Identity::from_pkcs8(&cert, &key).map_err(identity)?;
        let acceptor = native_tls::TlsAcceptor::builder(identity)
            .min_protocol_version(Some(native_tls::Protocol::Tlsv12))
            .build()
            .map_err(|source| TlsError::Identity {
                cert: self.cert.clone(),
                key: self.key.clone(),
                source,
            })?;
        Ok(TlsAcceptor::from(acceptor))
    }
}

/// The HTTP client gsaasd calls agents with and agents call gsaasd with. With `ca`, a PEM bundle,
/// it trusts the certificates in it and nothing else; without, the system's CAs. Building one is
/// not free (it loads certificates): build it once and share it.
pub fn http_client(ca: Option<&Path>) -> Result<reqwest::Client, TlsError> {
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .connect_timeout(Duration::from_secs(5))
        .min_tls_version(reqwest::tls::Version::TLS_1_2);
    if let Some(path) = ca {
        let pem = read(path)?;
        let bad = |source| TlsError::Ca { path: path.to_owned(), source };
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| bad(Some(e)))?;
        if certs.is_empty() {
            return Err(bad(None));
        }
        builder = builder.tls_certs_only(certs);
    }
    builder.build().map_err(TlsError::Client)
}

/// Limits of an HTTP server (the `[http]` table of gsaasd's and the agent's configs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpLimits {
    /// Seconds a client has to send a request's headers, idle keep-alive time included.
    pub header_timeout_secs: u64,
    /// Seconds a client has to send a request's whole body.
    pub body_timeout_secs: u64,
    /// Seconds a write of an answer may wait for the client to read before the connection is
    /// closed.
    pub write_timeout_secs: u64,
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections one client address may hold at once (behind a proxy that hides clients'
    /// addresses, raise it to what the proxy opens).
    pub max_connections_per_client: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout_secs: 15,
            body_timeout_secs: 30,
            write_timeout_secs: 30,
            max_connections: 1024,
            max_connections_per_client: 256,
        }
    }
}

impl HttpLimits {
    /// Why the limits cannot be served with, naming the field.
    pub fn check(&self) -> Result<(), String> {
        for (field, secs) in [
            ("header_timeout_secs", self.header_timeout_secs),
            ("body_timeout_secs", self.body_timeout_secs),
            ("write_timeout_secs", self.write_timeout_secs),
        ] {
            if !(1..=3600).contains(&secs) {
                return Err(format!("http.{field}: must be between 1 and 3600"));
            }
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return Err("http.max_connections: must be between 1 and 1000000".into());
        }
        if !(1..=self.max_connections).contains(&self.max_connections_per_client) {
            return Err("http.max_connections_per_client: must be between 1 and \
                        http.max_connections"
                .into());
        }
        Ok(())
    }

    pub fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.body_timeout_secs)
    }
}

/// Why a request's body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the request body could not be read")]
    Failed(#[source] axum::Error),
}

/// Reads `request`'s whole body (at most `limit` bytes) within `timeout`, and gives the request
/// back with the body in memory.
pub async fn read_body_within(
    request: Request,
    limit: usize,
    timeout: Duration,
) -> Result<Request, BodyError> {
    let (parts, body) = request.into_parts();
    let bytes: Bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await
    {
        Err(_) => return Err(BodyError::TimedOut(timeout)),
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return Err(if too_large { BodyError::TooLarge(limit) } else { BodyError::Failed(e) });
        }
        Ok(Ok(bytes)) => bytes,
    };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// Serves `app` on `listener` under `limits` (over TLS with `tls`) until `shutdown` completes;
/// then stops accepting, lets open connections finish their request (for at most
/// `limits.header_timeout_secs`), and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Arc::new(ClientConnections::default());
    let (stop, stopping) = watch::channel(false);
    let header_timeout = Duration::from_secs(limits.header_timeout_secs);
    let write_timeout = Duration::from_secs(limits.write_timeout_secs);
    let tls = tls.map(Arc::new);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors or memory, or a connection reset before accept:
                    // not fatal, and not worth a busy loop.
                    eprintln!("httpd: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(held) = clients.clone().hold(peer.ip(), limits.max_connections_per_client) else {
            // Over its share: closed at once, its permit back.
            continue;
        };
        let mut stream = TimeoutStream::new(stream);
        stream.set_write_timeout(Some(write_timeout));
        let stream = Box::pin(stream);
        let (app, stopping, tls) = (app.clone(), stopping.clone(), tls.clone());
        tokio::spawn(async move {
            match tls {
                None => connection(stream, peer, app, header_timeout, stopping).await,
                Some(tls) => {
                    // The handshake counts against the header timeout.
                    let handshake = tokio::time::timeout(header_timeout, tls.accept(stream)).await;
                    if let Ok(Ok(stream)) = handshake {
                        connection(stream, peer, app, header_timeout, stopping).await;
                    }
                }
            }
            // The address's count first: a permit free means its holder no longer counts, so a
            // client at its share may connect again as soon as one of its connections closes.
            drop(held);
            drop(permit);
        });
    }
    let _ = stop.send(true);
    // Every permit back: every connection has closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(header_timeout, permits.acquire_many(all)).await;
    Ok(())
}

/// How many connections each client address holds.
#[derive(Debug, Default)]
struct ClientConnections(std::sync::Mutex<HashMap<IpAddr, usize>>);

/// One connection of `ip`'s, counted until dropped.
#[derive(Debug)]
struct HeldConnection {
    clients: Arc<ClientConnections>,
    ip: IpAddr,
}

impl ClientConnections {
    /// Counts a connection of `ip`'s, unless it holds `limit` already.
    fn hold(self: Arc<Self>, ip: IpAddr, limit: usize) -> Option<HeldConnection> {
        let mut held = self.0.lock().expect("client connections");
        let n = held.entry(ip).or_default();
        if *n >= limit {
            return None;
        }
        *n += 1;
        drop(held);
        Some(HeldConnection { clients: self, ip })
    }
}

impl Drop for HeldConnection {
    fn drop(&mut self) {
        let mut held = self.clients.0.lock().expect("client connections");
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// Serves one connection until it closes, or gracefully once `stopping` turns true.
async fn connection<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: IO,
    peer: SocketAddr,
    app: Router,
    header_timeout: Duration,
    mut stopping: watch::Receiver<bool>,
) {
    let service = hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        app.clone().oneshot(request.map(Body::new))
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(true);
    let connection = http.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let stopped = async {
        while !*stopping.borrow_and_update() {
            if stopping.changed().await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = connection.as_mut() => {}
        () = stopped => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// Where a request came from (set by [`serve`]).
pub fn peer(request: &Request) -> Option<SocketAddr> {
    request.extensions().get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(peer)| *peer)
}
