//! `rodvr-agent --config PATH`: the RODVR endpoint daemon. `rodvr-agent gpus [--config PATH]
//! [--watch-secs N]` prints what GPU discovery finds (NVML where a driver is loaded, else the
//! config's GPUs) and their health after watching for N seconds (default 2), and exits.
//!
//! Start-up order matters: the state file is re-applied before the API listens, so after a reboot
//! every route is back without the controller. A failed apply is not fatal (the API still serves
//! read-back, and a retry timer re-applies), while a broken config, key or state file is: those
//! need an operator. The first line on stdout is `rodvr-agent listening on ADDR`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use gsaas_infra::httpd;
use rodvr_agent::config::{Config, ConfigError};
use rodvr_agent::credential;
use rodvr_agent::discovery::{default_discovery, host_kind, inventory, DiscoveryError};
use rodvr_agent::nft::NftFirewall;
use rodvr_agent::server::{after_answer, log_error, router};
use rodvr_contract::auth::{KeyError, TokenVerifier};
use rodvr_contract::client::ControllerClient;
use rodvr_contract::protocol::InvalidEntry;
use rodvr_core::agent::{Agent, HostFacts};
use rodvr_core::firewall::{Dataplane, Firewall};
use rodvr_core::render::TableParams;
use rodvr_core::state::{Ledger, StateFileError};

#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error(
        "usage: rodvr-agent --config PATH, rodvr-agent gpus [--config PATH] [--watch-secs N], or \
         rodvr-agent --version"
    )]
    Usage,
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    StateFile(#[from] StateFileError),
    #[error("cannot read controller public key {path}")]
    ReadKey { path: PathBuf, source: std::io::Error },
    #[error("controller public key {path} is unusable")]
    Key { path: PathBuf, source: KeyError },
    #[error("GPU discovery failed")]
    Discovery(#[from] DiscoveryError),
    #[error("the host's own report would be refused")]
    Report(#[source] InvalidEntry),
    #[error("cannot listen on {addr}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("the API server failed")]
    Serve(#[source] std::io::Error),
    #[error("TLS is not usable")]
    Tls(#[from] httpd::TlsError),
    #[error(transparent)]
    Servers(#[from] rodvr_agent::servers::ServersError),
}

/// What the command line asks for.
enum Invocation {
    Version,
    Serve(PathBuf),
    Gpus { config: Option<PathBuf>, watch: Duration },
}

fn invocation() -> Result<Invocation, StartError> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match args.as_slice() {
        [flag] if flag == "--version" || flag == "-V" => Ok(Invocation::Version),
        [flag, path] if flag == "--config" => Ok(Invocation::Serve(PathBuf::from(path))),
        [command, rest @ ..] if command == "gpus" => {
            let (mut config, mut watch) = (None, Duration::from_secs(2));
            let mut rest = rest.iter();
            while let Some(flag) = rest.next() {
                let value = rest.next().ok_or(StartError::Usage)?;
                match flag.to_str() {
                    Some("--config") => config = Some(PathBuf::from(value)),
                    Some("--watch-secs") => {
                        let secs = value.to_str().and_then(|v| v.parse::<u64>().ok());
                        watch = Duration::from_secs(
                            secs.filter(|s| *s <= 3600).ok_or(StartError::Usage)?,
                        );
                    }
                    _ => return Err(StartError::Usage),
                }
            }
            Ok(Invocation::Gpus { config, watch })
        }
        _ => Err(StartError::Usage),
    }
}

/// `rodvr-agent gpus`: discovery and the health watch, printed.
fn print_gpus(config: Option<PathBuf>, watch: Duration) -> Result<(), StartError> {
    let configured = match config {
        Some(path) => Config::load(&path)?.gpus,
        None => Vec::new(),
    };
    let discovery = default_discovery(&configured);
    println!("discovery: {}", discovery.source());
    // The health watch (NVML's XID events) runs on its own threads meanwhile.
    std::thread::sleep(watch);
    let found = discovery.gpus()?;
    if found.is_empty() {
        println!("no GPU found");
    }
    print!("{}", rodvr_agent::discovery::describe(&found));
    // What the managed servers' memory watch reads.
    let mut held: Vec<(u32, u64)> = discovery.process_memory().into_iter().flatten().collect();
    held.sort_unstable();
    for (pid, bytes) in held {
        println!("process {pid}: {} MiB of GPU memory", bytes >> 20);
    }
    Ok(())
}

fn main() -> ExitCode {
    let result = invocation().and_then(|invocation| match invocation {
        Invocation::Version => {
            println!("rodvr-agent {}", gsaas_infra::version::LONG);
            Ok(())
        }
        Invocation::Gpus { config, watch } => print_gpus(config, watch),
        Invocation::Serve(path) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(StartError::Runtime)?
            .block_on(run(path)),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log_error("fatal", &e);
            ExitCode::FAILURE
        }
    }
}

async fn run(config_path: PathBuf) -> Result<(), StartError> {
    let config = Config::load(&config_path)?;
    let key_path = config.controller_public_key.clone();
    let pem = std::fs::read(&key_path)
        .map_err(|source| StartError::ReadKey { path: key_path.clone(), source })?;
    let verifier = TokenVerifier::from_public_pem(&pem, config.host.clone())
        .map_err(|source| StartError::Key { path: key_path, source })?;

    let discovery: Arc<dyn rodvr_agent::discovery::GpuDiscovery> =
        Arc::from(default_discovery(&config.gpus));
    let found = discovery.gpus()?;
    let gpus = inventory(&config.host, found, config.rcuda.as_ref())?;
    let ledger = Ledger::load(&config.state_file)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| StartError::Bind { addr: config.listen, source })?;
    let bound =
        listener.local_addr().map_err(|source| StartError::Bind { addr: config.listen, source })?;
    let managed = config.rcuda.as_ref().filter(|servers| servers.managed);
    let params = TableParams {
        masked_range: config.masked_range,
        gpu_interface: config.gpu_interface.clone(),
        local_rcuda: gpus.iter().map(|g| g.rcuda.socket_addr()).collect(),
        local_servers: managed.and_then(|servers| {
            let ports = servers.ports?;
            Some(rodvr_core::render::LocalServers {
                address: servers.address,
                first_port: ports.first,
                last_port: ports.last,
            })
        }),
        metadata_listener: config.metadata_listen,
        agent_api: Some(bound),
    };

    let facts = HostFacts {
        host: config.host.clone(),
        kind: host_kind(&gpus),
        agent_url: config.agent_url(bound),
        gpus,
        topology: config.topology.clone(),
        local_vms: config.local_vms.map(|offers| offers.resources()),
        gpu_address: rodvr_agent::servers::interface_address(&config.gpu_interface),
    };
    let firewall = NftFirewall::new(&config.nft_command).with_conntrack(&config.conntrack_command);
    let dataplane = Dataplane::new(firewall, params);
    // The servers of the table in the ledger are adopted (or started by the first apply).
    let supervisor = match managed {
        Some(servers) => {
            let settings = rodvr_agent::servers::Settings::from_config(servers)?;
            let keep = ledger.current().map(|t| t.servers.clone()).unwrap_or_default();
            // The memory watch reads what the driver counts (nothing without NVML).
            let watched = discovery.clone();
            let memory: rodvr_agent::servers::MemoryReader =
                Box::new(move || watched.process_memory());
            Some(rodvr_agent::servers::ProcessSupervisor::start_watching(
                settings,
                &facts.gpus,
                &keep,
                Some(memory),
            )?)
        }
        None => None,
    };
    let mut agent = Agent::new(ledger, dataplane, facts);
    if let Some(supervisor) = &supervisor {
        agent = agent.with_servers(supervisor.clone());
    }
    let agent = Arc::new(agent);
    agent.host_report().validate(config.masked_range).map_err(StartError::Report)?;

    reapply(&agent).await;
    println!("rodvr-agent listening on {bound}");
    let server_changes = supervisor.as_ref().map(|s| s.changes());
    if let Some(supervisor) = supervisor {
        let agent = agent.clone();
        std::thread::Builder::new()
            .name("servers".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(100));
                // A server that moved: its clients follow it to its new port.
                if supervisor.tick() {
                    if let Err(e) = agent.refresh_server_filter() {
                        log_error("filtering the servers' clients", &e);
                    }
                }
            })
            .map_err(StartError::Runtime)?;
    }

    tokio::spawn(retry_failed_applies(
        agent.clone(),
        Duration::from_secs(config.retry_interval_secs),
    ));
    if let Some(addr) = config.metadata_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr: addr.into(), source })?;
        let app = rodvr_agent::metadata::router(agent.clone());
        // One VM (one address: the DNAT keeps it) holds only so many of the listener's
        // connections, so it cannot starve its neighbours' environments.
        let limits = httpd::HttpLimits {
            max_connections_per_client: config.metadata_max_connections_per_vm,
            ..config.http
        };
        tokio::spawn(async move {
            if let Err(e) = httpd::serve(listener, app, limits, None, shutdown_signal()).await {
                log_error("the metadata server stopped", &e);
            }
        });
        println!("rodvr-agent serving VMs' GPU environments on {addr}");
    }
    let tls = config.tls.as_ref().map(httpd::TlsFiles::acceptor).transpose()?;
    if let Some(controller) = &config.controller {
        let renewed = credential::renewed_token_path(&config.state_file);
        let token = credential::current_token(&controller.token, &renewed);
        let http = httpd::http_client(controller.ca.as_deref())?;
        let client = Arc::new(ControllerClient::with_http(http, &controller.url, token));
        let every = controller.heartbeat_interval();
        let (registered, first_registration) = tokio::sync::watch::channel(false);
        if let Some(schedule) = controller.rtt_schedule() {
            tokio::spawn(measure_rtts(
                agent.clone(),
                client.clone(),
                config.host.clone(),
                schedule,
                first_registration,
            ));
        }
        tokio::spawn(heartbeat(
            agent.clone(),
            discovery,
            client,
            renewed,
            every,
            registered,
            server_changes,
        ));
    }
    let app = router(agent, Arc::new(verifier), config.http.body_timeout());
    httpd::serve(listener, app, config.http, tls, shutdown_signal())
        .await
        .map_err(StartError::Serve)
}

async fn reapply<F: Firewall + 'static>(agent: &Arc<Agent<F>>) {
    let agent = agent.clone();
    let applying = agent.clone();
    let result = tokio::task::spawn_blocking(move || applying.reapply()).await;
    match result {
        Ok(Ok(())) => after_answer(agent),
        Ok(Err(e)) => log_error("re-applying the state file", &e),
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}

async fn retry_failed_applies<F: Firewall + 'static>(agent: Arc<Agent<F>>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        if agent.needs_apply() {
            reapply(&agent).await;
        } else {
            after_answer(agent.clone());
        }
    }
}

/// Measures round trips to the GPU hosts gsaasd names, every round of `schedule` (interval,
/// connect timeout, how often the targets are asked again), for the heartbeats to report. It
/// starts once a heartbeat has registered the host (`registered` turns true): gsaasd answers
/// 404 for a host it does not know yet.
async fn measure_rtts<F: Firewall + 'static>(
    agent: Arc<Agent<F>>,
    client: Arc<ControllerClient>,
    host: gpgpums::HostId,
    (every, timeout, refresh): (Duration, Duration, Duration),
    mut registered: tokio::sync::watch::Receiver<bool>,
) {
    if registered.wait_for(|yes| *yes).await.is_err() {
        return; // The heartbeats stopped: nothing would report what was measured.
    }
    let mut targets = Vec::new();
    let mut ask_at = std::time::Instant::now();
    // After a failed ask, or one that named no host: the next round first (the host, or the
    // GPU hosts, may not be registered yet), then twice as long each time, up to a minute.
    let mut retry = every;
    let mut samples = rodvr_agent::rtt::RttSamples::default();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Due within half a round: rounds and asks fall on the same ticks.
        if std::time::Instant::now() + every / 2 >= ask_at {
            // A controller that does not answer (down, not knowing the host yet, or too old to
            // know the path) is asked again sooner; the old targets serve meanwhile.
            match client.rtt_targets(&host).await {
                // None named yet (GPU hosts still registering): asked again sooner, as after
                // a failure.
                Ok(named) if named.is_empty() => {
                    targets = named;
                    ask_at = std::time::Instant::now() + retry.min(refresh);
                    retry = (retry * 2).min(Duration::from_secs(60));
                }
                Ok(named) => {
                    targets = named;
                    ask_at = std::time::Instant::now() + refresh;
                    retry = every;
                }
                Err(e) => {
                    log_error("asking the controller which GPU hosts to measure", &e);
                    ask_at = std::time::Instant::now() + retry.min(refresh);
                    retry = (retry * 2).min(Duration::from_secs(60));
                }
            }
        }
        let round = rodvr_agent::rtt::probe(&targets, timeout).await;
        samples.record(&round);
        agent.set_rtts(samples.medians());
    }
}

/// Registers the host every `every`, and at once when a server's state or port changed
/// (`server_changes`), renewing the agent's token (kept in `renewed`) once half of its life is
/// gone; `registered` turns true at the first registration that succeeds.
async fn heartbeat<F: Firewall + 'static>(
    agent: Arc<Agent<F>>,
    discovery: Arc<dyn rodvr_agent::discovery::GpuDiscovery>,
    client: Arc<ControllerClient>,
    renewed: PathBuf,
    every: Duration,
    registered: tokio::sync::watch::Sender<bool>,
    server_changes: Option<Arc<tokio::sync::Notify>>,
) {
    let mut tick = tokio::time::interval(every);
    // A controller that is down must not cause a burst of catch-up heartbeats when it returns.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let changed = async || match &server_changes {
        Some(notify) => notify.notified().await,
        None => std::future::pending().await,
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = changed() => {}
        }
        let asked = discovery.clone();
        match tokio::task::spawn_blocking(move || asked.health()).await {
            Ok(health) => agent.set_gpu_health(health),
            Err(e) => log_error("asking the GPUs' health", &e),
        }
        let report = agent.host_report();
        if credential::needs_renewal(&client.token()) {
            match client.renew(&report.host).await {
                Ok(token) => {
                    if let Err(e) = credential::keep(&renewed, &token) {
                        log_error(
                            &format!("keeping the renewed token in {}", renewed.display()),
                            &e,
                        );
                    }
                }
                Err(e) => log_error("renewing the agent's token", &e),
            }
        }
        match client.register(&report).await {
            Ok(()) => {
                registered.send_replace(true);
            }
            Err(e) => log_error("heartbeat to the controller", &e),
        }
    }
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            log_error("cannot watch SIGTERM", &e);
            std::future::pending::<()>().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
