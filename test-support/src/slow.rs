//! Slow and stalled HTTP clients, as an attacker holding a server's connections would be: used
//! against the agent's and gsaasd's servers.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Opens `n` connections to `addr` that each send `partial` and then nothing.
pub async fn stall(addr: SocketAddr, partial: &[u8], n: usize) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(partial).await.expect("send the partial request");
        streams.push(stream);
    }
    streams
}

/// Waits until the server has closed each of `streams` (whatever it answered first), for at
/// most `limit` in all; returns how many were still open then.
pub async fn still_open_after(streams: Vec<TcpStream>, limit: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + limit;
    let mut open = 0;
    for mut stream in streams {
        let mut buf = [0u8; 1024];
        let closed = loop {
            match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break true,
                Ok(Ok(_)) => continue,
                Err(_) => break false,
            }
        };
        open += usize::from(!closed);
    }
    open
}
