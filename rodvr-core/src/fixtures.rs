//! Test fixtures (feature `fixtures`): the table parameters tests and benches use unless they
//! test a parameter.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::render::{RouteKey, RouteMap, TableParams};

/// Masked range 100.127.0.0/16, GPU interface `gpu0`, no local rCUDA server, no metadata
/// listener, no agent API guard.
pub fn params() -> TableParams {
    TableParams {
        masked_range: "100.127.0.0/16".parse().expect("a CIDR"),
        gpu_interface: "gpu0".into(),
        local_rcuda: vec![],
        local_servers: None,
        metadata_listener: None,
        agent_api: None,
    }
}

/// `n` routes: VM 10.77.0.i on `tap<i>` reaching 100.127.0.1:9000, sent to 10.78.0.2:(8300 + i).
pub fn routes(n: u8) -> RouteMap {
    (0..n)
        .map(|i| {
            let key = RouteKey {
                tap: format!("tap{i}"),
                ip: Ipv4Addr::new(10, 77, 0, i),
                masked: SocketAddrV4::new(Ipv4Addr::new(100, 127, 0, 1), 9000),
            };
            (key, SocketAddrV4::new(Ipv4Addr::new(10, 78, 0, 2), 8300 + u16::from(i)))
        })
        .collect()
}
