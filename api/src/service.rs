//! Wiring: from a [`Config`] to a running service (used by `gsaasd serve` and by tests, which start
//! it on port 0 with their own data directory).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gsaas_infra::httpd;
use tokio::net::TcpListener;

use crate::agents::{HostAgents, InProcessAgents, RemoteAgents};
use crate::app::{App, Backends};
use crate::auth::Keys;
use crate::cloud::nova::{NovaCloud, NovaSetupError};
use crate::cloud::sim::SimCloud;
use crate::cloud::Cloud;
use crate::config::{AuthMode, CloudConfig, Config, HostsBackend};
use crate::db::Db;
use crate::error::{Error, ErrorChain};
use crate::openstack::keystone::{AdminScope, ValidatorSettings};
use crate::openstack::TokenValidator;

/// A running gsaasd.
#[derive(Debug)]
pub struct Service {
    pub app: Arc<App>,
    pub addr: SocketAddr,
    /// Where `/metrics` is served without a token, when `metrics.listen` is set.
    pub metrics_addr: Option<SocketAddr>,
    /// The simulated cloud, when that is the backend (tests inspect it and inject faults).
    pub sim: Option<Arc<SimCloud>>,
    server: tokio::task::JoinHandle<()>,
    /// The `metrics.listen` server, when configured.
    metrics_server: Option<tokio::task::JoinHandle<()>>,
}

impl Service {
    pub fn url(&self) -> String {
        let scheme = if self.app.config.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Stops at once, sagas included, where they stand (tests use it to simulate a crash: nothing
    /// is flushed or unwound).
    pub fn abort(self) {
        self.server.abort();
        self.stop_the_rest();
        self.app.abort_sagas();
    }

    /// Serves until the process is asked to stop.
    pub async fn wait(mut self) {
        let _ = (&mut self.server).await;
        self.stop_the_rest();
    }

    /// Stops the background tasks and the metrics server.
    fn stop_the_rest(&self) {
        self.app.stop_background_tasks();
        if let Some(metrics) = &self.metrics_server {
            metrics.abort();
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Keys(#[from] crate::auth::KeyError),
    #[error("TLS is not usable")]
    Tls(#[from] httpd::TlsError),
    #[error("cannot open the database")]
    Database(#[source] Error),
    #[error("cannot set up the Nova cloud")]
    Cloud(#[source] NovaSetupError),
    #[error("cannot start the database writer thread")]
    Writer(#[source] std::io::Error),
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    #[error("cannot register the inventory")]
    Inventory(#[source] Error),
    #[error("{0}")]
    Notifications(String),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Opens storage, builds the backends, registers the inventory (in-process agents), starts the
/// reconciler (whose first pass resumes interrupted sagas) and serves on `config.listen`.
pub async fn start(config: Config) -> Result<Service, StartError> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| StartError::Listen { addr: config.listen, source })?;
    start_on(config, listener).await
}

pub async fn start_on(config: Config, listener: TcpListener) -> Result<Service, StartError> {
    start_with_sim(config, listener, None).await
}

/// Like [`start_on`], reusing an existing simulated cloud: the cloud outlives a restart of gsaasd,
/// as Nova does (crash-recovery tests use it).
pub async fn start_with_sim(
    config: Config,
    listener: TcpListener,
    existing_sim: Option<Arc<SimCloud>>,
) -> Result<Service, StartError> {
    let metrics_listener = match config.metrics.listen {
        Some(addr) => Some(
            TcpListener::bind(addr).await.map_err(|source| StartError::Listen { addr, source })?,
        ),
        None => None,
    };
    let tls = config.tls.as_ref().map(httpd::TlsFiles::acceptor).transpose()?;
    let policy = crate::policy::LivePolicy::load(config.auth.policy_file.as_deref())?;
    let keys = Keys::load_or_create(&config.signing_key_path())?;
    let db =
        Db::connect(&config.database_url()).await.map_err(|e| StartError::Database(e.into()))?;
    let (agents, in_process_agents): (Arc<dyn HostAgents>, _) = match config.hosts.backend {
        HostsBackend::InProcess => {
            let agents = Arc::new(InProcessAgents::new(config.masking.range));
            (agents.clone(), Some(agents))
        }
        HostsBackend::Agent => {
            let http = httpd::http_client(config.hosts.agent_ca.as_deref())?;
            (Arc::new(RemoteAgents::new(keys.agent_signer(), config.hosts.clone(), http)), None)
        }
    };
    let mut keystone = None;
    let (cloud, sim): (Arc<dyn Cloud>, Option<Arc<SimCloud>>) = match &config.cloud {
        CloudConfig::Sim { sim } => {
            let sim = existing_sim.unwrap_or_else(|| Arc::new(SimCloud::new(sim.clone(), vec![])));
            (sim.clone(), Some(sim))
        }
        CloudConfig::Nova { nova } => {
            let nova = Arc::new(NovaCloud::from_config(nova).map_err(StartError::Cloud)?);
            if config.auth.mode == AuthMode::Keystone {
                let auth = &config.auth;
                let scope = &auth.keystone_admin_scope;
                let settings = ValidatorSettings {
                    admin: AdminScope {
                        roles: auth.keystone_admin_roles.clone(),
                        system: scope.system,
                        project: scope.project.clone(),
                        project_domain: scope.project_domain.clone(),
                    },
                    capacity: auth.keystone_cache_capacity,
                    max_age: Duration::from_secs(auth.keystone_cache_secs),
                    refusal_ttl: Duration::from_secs(auth.keystone_refusal_cache_secs),
                    per_client_per_minute: auth.keystone_validations_per_minute,
                };
                keystone = Some(Arc::new(TokenValidator::new(nova.keystone(), settings)));
            }
            (nova as Arc<dyn Cloud>, None)
        }
    };
    let in_process = config.hosts.backend == HostsBackend::InProcess;
    let notifications = &config.notifications;
    let broker = notifications.amqp_uri().map_err(StartError::Notifications)?.map(|uri| {
        let rabbit = crate::notifier::RabbitMq::new(
            uri,
            notifications.exchange.clone(),
            notifications.topic.clone(),
            notifications.durable,
        );
        Arc::new(rabbit) as Arc<dyn crate::notifier::Broker>
    });
    let backends =
        Backends { cloud, agents, sim: sim.clone(), in_process_agents, keystone, broker };
    let app = App::new(config, db, keys, policy, backends).map_err(StartError::Writer)?;
    if in_process {
        app.register_inventory().await.map_err(StartError::Inventory)?;
        app.record_nominal_rtts().await.map_err(StartError::Inventory)?;
    }
    app.sync_sim_hosts().await.map_err(StartError::Inventory)?;
    app.refresh_revocations().await.map_err(StartError::Database)?;
    app.configure_notifier().await.map_err(StartError::Database)?;
    app.start_background_tasks();
    reload_policy_on_sighup(&app);
    let addr = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr: app.config.listen, source })?;
    let limits = app.config.http;
    let serve = |listener, router| {
        let tls = tls.clone();
        async move {
            let shutdown = stop_requested();
            if let Err(e) = httpd::serve(listener, router, limits, tls, shutdown).await {
                tracing::error!(error = %ErrorChain(&e), "server stopped");
            }
        }
    };
    let metrics_addr = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());
    let metrics_server = metrics_listener
        .map(|listener| tokio::spawn(serve(listener, crate::http::metrics_router(app.clone()))));
    let server = tokio::spawn(serve(listener, crate::http::router(app.clone())));
    Ok(Service { app, addr, metrics_addr, sim, server, metrics_server })
}

/// SIGHUP reads the policy file again (as oslo.policy services do), while the service lives.
fn reload_policy_on_sighup(app: &Arc<App>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGHUP: the policy file is read on its timer only");
            return;
        }
    };
    let app = Arc::downgrade(app);
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let Some(app) = app.upgrade() else { return };
            tracing::info!("SIGHUP: reading the policy file again");
            app.trigger_policy_reload();
        }
    });
}

/// SIGINT or SIGTERM (what a supervisor such as Kubernetes sends before it replaces a replica):
/// the server stops accepting and finishes the requests it has, so a rolling upgrade cuts none.
async fn stop_requested() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM: only SIGINT stops gsaasd gracefully");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
