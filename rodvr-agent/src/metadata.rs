//! The VM-facing metadata server: each VM reads its own live remote-GPU environment.
//!
//! cGPUs come and go on a running VM (attach, detach, lost), so the environment cloud-init wrote
//! at boot goes stale. The agent already holds every VM's routes in attach order, so it answers
//! `GET /gpu.env` (`export` lines) and `GET /gpu.json` (the same variables as an object) on its
//! metadata listener: the VM's layer's variables and GSaaS's (`rodvr_contract::env`). The paths
//! of earlier releases, `GET /rcuda.env` and `/rcuda.json`, answer an rCUDA VM's rCUDA variables
//! alone, as they did (the `gsaas-env` of VMs booted then accepts nothing else), and a VM of
//! another layer 404. VMs reach the listener only through a route of their own, from the
//! masked metadata endpoint the controller names (keyed on the VM's tap and address like every
//! route: a VM that spoofs another VM's address arrives on its own tap and reaches nothing), and
//! the firewall closes the listener to everything else.
//!
//! The DNAT keeps the VM's source address, so the server answers for the VM whose address asks,
//! with that VM's devices only. Two VMs on this host with one address (overlapping tenant
//! networks) cannot be told apart here: both get 409 and keep their boot-time values, rather than
//! either getting the other's.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use gsaas_infra::httpd;
use rodvr_contract::protocol::GpuEnv;
use rodvr_core::agent::Agent;
use rodvr_core::firewall::Firewall;
use rodvr_core::vm_env::EnvError;

/// The metadata server's routes; the caller is the request's peer (see [`httpd::serve`]).
pub fn router<F: Firewall + 'static>(agent: Arc<Agent<F>>) -> Router {
    Router::new()
        .route("/gpu.env", get(env_lines::<F>))
        .route("/gpu.json", get(env_json::<F>))
        .route("/rcuda.env", get(rcuda_lines::<F>))
        .route("/rcuda.json", get(rcuda_json::<F>))
        .with_state(agent)
}

/// An [`EnvError`] as the metadata server answers it.
#[derive(Debug)]
struct EnvAnswer(EnvError);

impl From<EnvError> for EnvAnswer {
    fn from(error: EnvError) -> Self {
        Self(error)
    }
}

impl IntoResponse for EnvAnswer {
    fn into_response(self) -> Response {
        let status = match self.0 {
            EnvError::NotApplied => StatusCode::SERVICE_UNAVAILABLE,
            EnvError::Unknown => StatusCode::NOT_FOUND,
            EnvError::Ambiguous => StatusCode::CONFLICT,
        };
        (status, format!("{}\n", self.0)).into_response()
    }
}

/// The environment of the VM that asks: the request's peer.
fn caller_env<F: Firewall>(agent: &Agent<F>, request: &Request) -> Result<GpuEnv, EnvError> {
    let ip = match httpd::peer(request).map(|peer| peer.ip()) {
        Some(IpAddr::V4(ip)) => ip,
        Some(IpAddr::V6(ip)) => ip.to_ipv4_mapped().ok_or(EnvError::Unknown)?,
        None => return Err(EnvError::Unknown),
    };
    agent.environment(ip)
}

/// The caller's rCUDA variables alone; a VM of another layer has none.
fn caller_rcuda<F: Firewall>(
    agent: &Agent<F>,
    request: &Request,
) -> Result<Result<Vec<(String, String)>, Response>, EnvAnswer> {
    let env = caller_env(agent, request)?;
    if env.remoting != gpgpums::Remoting::Rcuda {
        let why = format!("this VM's cGPUs speak {}: read /gpu.env\n", env.remoting);
        return Ok(Err((StatusCode::NOT_FOUND, why).into_response()));
    }
    Ok(Ok(env.layer_variables()))
}

async fn rcuda_lines<F: Firewall + 'static>(
    State(agent): State<Arc<Agent<F>>>,
    request: Request,
) -> Result<Response, EnvAnswer> {
    Ok(match caller_rcuda(&agent, &request)? {
        Ok(variables) => text(rodvr_contract::env::export_lines(variables)),
        Err(refused) => refused,
    })
}

async fn rcuda_json<F: Firewall + 'static>(
    State(agent): State<Arc<Agent<F>>>,
    request: Request,
) -> Result<Response, EnvAnswer> {
    Ok(match caller_rcuda(&agent, &request)? {
        Ok(variables) => Json(variables.into_iter().collect::<BTreeMap<_, _>>()).into_response(),
        Err(refused) => refused,
    })
}

fn text(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

async fn env_lines<F: Firewall + 'static>(
    State(agent): State<Arc<Agent<F>>>,
    request: Request,
) -> Result<Response, EnvAnswer> {
    Ok(text(caller_env(&agent, &request)?.export_lines()))
}

async fn env_json<F: Firewall + 'static>(
    State(agent): State<Arc<Agent<F>>>,
    request: Request,
) -> Result<Json<BTreeMap<String, String>>, EnvAnswer> {
    Ok(Json(caller_env(&agent, &request)?.variables().into_iter().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpgpums::VmId;
    use rodvr_contract::fixtures;
    use rodvr_contract::protocol::{LostCgpu, Route, RouteTable, VmPort};
    use rodvr_core::vm_env::environment_of;

    fn route(vm: u128, tap: &str, ip: &str, port: u16, gpu_number: u32) -> Route {
        let masked = format!("100.127.0.1:{port}");
        Route { gpu_number, ..fixtures::route(vm, tap, ip, &masked, "10.1.0.2:8308") }
    }

    fn port(vm: u128, tap: &str, ip: &str) -> VmPort {
        VmPort {
            vm: VmId::from_uuid(uuid::Uuid::from_u128(vm)),
            vm_ip: ip.parse().unwrap(),
            vm_tap: tap.into(),
            remoting: Default::default(),
        }
    }

    #[test]
    fn each_vm_gets_its_own_devices_in_table_order_and_a_shared_address_gets_none() {
        let table = RouteTable {
            generation: 1,
            routes: vec![
                route(1, "tap1", "10.0.0.2", 8310, 1),
                route(2, "tap2", "10.0.0.3", 8308, 0),
                route(1, "tap1", "10.0.0.2", 8308, 0),
                route(3, "tap3", "10.0.0.4", 8308, 0),
                route(4, "tap4", "10.0.0.4", 8308, 0),
            ],
            metadata: Some("100.127.0.1:80".parse().unwrap()),
            vms_without_cgpus: vec![port(5, "tap5", "10.0.0.5"), port(6, "tap6", "10.0.0.4")],
            lost: vec![],
            servers: vec![],
        };
        let env = environment_of(&table, "10.0.0.2".parse().unwrap()).unwrap();
        assert_eq!(
            env.export_lines(),
            "export RCUDA_DEVICE_COUNT=2\nexport RCUDA_DEVICE_0=100.127.0.1@8310:1\n\
             export RCUDA_DEVICE_1=100.127.0.1@8308:0\n\
             export GSAAS_CGPUS=0,1\nexport GSAAS_CGPUS_MISSING=\n"
        );
        assert_eq!(environment_of(&table, "10.0.0.9".parse().unwrap()), Err(EnvError::Unknown));
        assert_eq!(environment_of(&table, "10.0.0.4".parse().unwrap()), Err(EnvError::Ambiguous));
        // A VM whose cGPUs were all detached reads an empty environment, not its boot-time one.
        let idle = environment_of(&table, "10.0.0.5".parse().unwrap()).unwrap();
        assert_eq!(
            idle.export_lines(),
            "export RCUDA_DEVICE_COUNT=0\nexport GSAAS_CGPUS=\nexport GSAAS_CGPUS_MISSING=\n"
        );
    }

    #[test]
    fn a_lupine_vm_lists_its_servers_and_says_which_cgpus_are_missing() {
        let lupine = |port, index| Route {
            index: Some(index),
            remoting: gpgpums::Remoting::Lupine,
            ..route(1, "tap1", "10.0.0.2", port, 0)
        };
        let vm = |n| VmId::from_uuid(uuid::Uuid::from_u128(n));
        let table = RouteTable {
            generation: 1,
            routes: vec![lupine(8308, 0), lupine(8311, 3)],
            metadata: Some("100.127.0.1:80".parse().unwrap()),
            vms_without_cgpus: vec![VmPort {
                remoting: gpgpums::Remoting::Lupine,
                ..port(2, "tap2", "10.0.0.3")
            }],
            lost: vec![LostCgpu::new(vm(1), 2), LostCgpu::new(vm(1), 1), LostCgpu::new(vm(2), 0)],
            servers: vec![],
        };
        table.validate(None).unwrap();
        let env = environment_of(&table, "10.0.0.2".parse().unwrap()).unwrap();
        assert_eq!(
            env.export_lines(),
            "export LUPINE_SERVER=100.127.0.1:8308,100.127.0.1:8311\n\
             export LUPINE_DISABLE_LOCAL=1\nexport GSAAS_CGPUS=0,3\n\
             export GSAAS_CGPUS_MISSING=1,2\n"
        );
        // Every cGPU lost: no server listed, in its own layer, and it says which are missing.
        let all_lost = environment_of(&table, "10.0.0.3".parse().unwrap()).unwrap();
        assert_eq!(
            all_lost.export_lines(),
            "export LUPINE_SERVER=\nexport LUPINE_DISABLE_LOCAL=1\nexport GSAAS_CGPUS=\n\
             export GSAAS_CGPUS_MISSING=0\n"
        );
        // A lost cGPU of a VM the table does not list, or listed twice: refused.
        let mut stray = table.clone();
        stray.lost.push(LostCgpu::new(vm(9), 0));
        assert_eq!(stray.validate(None).unwrap_err().entry, "lost[3].vm");
        let mut twice = table.clone();
        twice.lost.push(LostCgpu::new(vm(1), 3));
        assert_eq!(twice.validate(None).unwrap_err().entry, "lost[3].index");
        // One VM, two layers: refused.
        let mut mixed = table;
        mixed.routes[1].remoting = gpgpums::Remoting::Rcuda;
        assert_eq!(mixed.validate(None).unwrap_err().entry, "routes[1].remoting");
    }
}
