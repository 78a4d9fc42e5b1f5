//! Test fixtures (feature `fixtures`): the table parameters tests and benches use unless they
//! test a parameter.

use crate::render::TableParams;

/// Masked range 100.127.0.0/16, GPU interface `gpu0`, no local rCUDA server, no metadata
/// listener, no agent API guard.
pub fn params() -> TableParams {
    TableParams {
        masked_range: "100.127.0.0/16".parse().expect("a CIDR"),
        gpu_interface: "gpu0".into(),
        local_rcuda: vec![],
        metadata_listener: None,
        agent_api: None,
    }
}
