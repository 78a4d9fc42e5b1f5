//! Clients that hold gsaasd's connections: headers or bodies that never end, answers never read,
//! a flood of connections from one address. gsaasd keeps serving everyone else, its health and
//! readiness probes included.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gsaas_infra::httpd::HttpLimits;
use tokio::io::AsyncWriteExt;

use crate::support::{Store, TestService};

/// Connections that never finish their headers or body are closed, past the connection limit
/// too, and gsaasd serves again once they are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stall_are_cut_off_and_gsaasd_keeps_serving() {
    let t = TestService::start_with(Store::Sqlite, |c| {
        c.http = HttpLimits {
            header_timeout_secs: 1,
            body_timeout_secs: 1,
            max_connections: 16,
            max_connections_per_client: 16,
            ..HttpLimits::default()
        };
    })
    .await;
    let addr = t.service().addr;
    let headers =
        crate::support::slow::stall(addr, b"GET /v1/vms HTTP/1.1\r\nHost: gsaas\r\nAuthor", 100)
            .await;
    let body = format!(
        "POST /v1/vms HTTP/1.1\r\nHost: gsaas\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"ncgpus\": 1",
        t.member()
    );
    let mut bodies = crate::support::slow::stall(addr, body.as_bytes(), 20).await;
    // A body that stalls is answered 408 before the connection closes.
    let mut first = bodies.remove(0);
    let mut answer = String::new();
    use tokio::io::AsyncReadExt;
    let read = first.read_to_string(&mut answer);
    tokio::time::timeout(Duration::from_secs(30), read).await.unwrap().unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    let limit = Duration::from_secs(60);
    assert_eq!(crate::support::slow::still_open_after(headers, limit).await, 0, "stalled headers");
    assert_eq!(crate::support::slow::still_open_after(bodies, limit).await, 0, "stalled bodies");
    assert_eq!(t.get(&t.member(), "/v1/vms").await.0, 200);
}

/// Connections from one address (127.0.0.2 here) that pipeline requests and never read the
/// answers, more of them than gsaasd serves at once: that address gets only its share
/// (`http.max_connections_per_client`), the ones it holds are closed once a write has waited
/// `http.write_timeout_secs`, and the probes (from another address) answer all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_that_never_reads_cannot_take_the_server() {
    let t = TestService::start_with(Store::Sqlite, |c| {
        c.http = HttpLimits {
            write_timeout_secs: 1,
            max_connections: 256,
            max_connections_per_client: 32,
            ..HttpLimits::default()
        };
    })
    .await;
    let addr = t.service().addr;
    // More answers (7 MB) than the kernel buffers between the two ends.
    let pipelined = "GET /openapi.json HTTP/1.1\r\nHost: gsaas\r\n\r\n".repeat(64);
    let mut flood = Vec::new();
    for _ in 0..300 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        // A small window: gsaasd's writes stall after a few answers.
        socket.set_recv_buffer_size(4096).unwrap();
        socket.bind(SocketAddr::new("127.0.0.2".parse().unwrap(), 0)).unwrap();
        let Ok(mut stream) = socket.connect(addr).await else { continue };
        // Closed at once past its share: the write may fail.
        let _ = stream.write_all(pipelined.as_bytes()).await;
        flood.push(stream);
    }
    // The probes and other clients are served while the flood holds on.
    let started = Instant::now();
    for path in ["/healthz", "/readyz", "/v1/vms"] {
        let (status, body) = tokio::time::timeout(Duration::from_secs(5), t.get(&t.member(), path))
            .await
            .unwrap_or_else(|_| panic!("{path} did not answer during the flood"));
        assert_eq!(status, 200, "{path}: {body}");
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    // Every connection of the flood is closed, unread: past the share at once, the rest once
    // their writes waited a second (reading them now only finds what was sent before).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let open = crate::support::slow::still_open_after(flood, Duration::from_secs(10)).await;
    assert_eq!(open, 0, "connections of a client that never reads stayed open");
}
