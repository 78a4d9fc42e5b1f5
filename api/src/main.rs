//! The `gsaasd` binary: serve the API, issue tokens, print the OpenAPI document.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use gsaasd::auth::{Keys, Role};
use gsaasd::config::Config;
use gsaasd::error::ErrorChain;

/// mimalloc rather than glibc's malloc: a launch allocates and frees many small buffers across
/// threads (requests, JSON, rows), and with glibc's arenas that was a fifth of the service's CPU
/// (the cycles bench: 15-20% more launch + terminate cycles a second with mimalloc, BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "gsaasd",
    version = gsaas_infra::version::LONG,
    about = "GSaaS: GPU scheduling as a service for OpenStack",
    after_help = "Every config key can also be set by a GSAAS_* variable (GSAAS_HTTP__BODY_TIMEOUT_SECS \
                  for http.body_timeout_secs). Precedence: flag, then variable, then file, then default."
)]
struct Cli {
    /// Log lines as text or as JSON objects (one per line).
    #[arg(long, global = true, value_enum, env = "GSAAS_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Settings of `serve` that beat the config file and the environment.
#[derive(clap::Args)]
struct ServeFlags {
    /// Where the REST API listens (listen).
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// Where the embedded database and the signing key live (data_dir).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// sqlite://PATH or postgres://... (database_url).
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,
}

impl ServeFlags {
    /// As (flag, config key, value).
    fn settings(&self) -> Vec<(&'static str, &'static str, toml::Value)> {
        let mut settings = Vec::new();
        if let Some(listen) = self.listen {
            settings.push(("--listen", "listen", toml::Value::from(listen.to_string())));
        }
        if let Some(dir) = &self.data_dir {
            settings.push(("--data-dir", "data_dir", toml::Value::from(dir.display().to_string())));
        }
        if let Some(url) = &self.database_url {
            settings.push(("--database-url", "database_url", toml::Value::from(url.as_str())));
        }
        settings
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve the REST API (no config file: the embedded default, SQLite + simulated cloud).
    Serve {
        #[arg(long, short)]
        config: Option<PathBuf>,
        #[command(flatten)]
        flags: ServeFlags,
    },
    /// Tokens for tenants, admins and agents.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Print gsaasd's public key (PEM), which agents need to verify its requests.
    PublicKey {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Print the OpenAPI document (checked in as openapi/gsaas.json).
    Openapi,
    /// Database maintenance.
    Db {
        #[command(subcommand)]
        command: DbCommand,
    },
    /// Who may do what: the policy rules.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Print the settings that the config file, the GSAAS_* variables and these flags resolve
    /// to (what `serve` would run with), or what is wrong with them.
    CheckConfig {
        #[arg(long, short)]
        config: Option<PathBuf>,
        #[command(flatten)]
        flags: ServeFlags,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Print every rule with its default and what it governs, as a policy file whose rules are
    /// commented out (as oslopolicy-sample-generator writes them).
    Dump,
    /// Check the policy file the config names ([auth] policy_file, or --file): what is wrong
    /// with it, with its line, as `serve` would refuse it.
    Check {
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// The policy file to check (default: the config's).
        #[arg(long)]
        file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum DbCommand {
    /// Delete the rows of VMs deleted longer ago than --older-than, with their events, attach
    /// keys and queue tickets (as `nova-manage db archive_deleted_rows`). Safe while gsaasd runs.
    Purge {
        /// How long ago: a number and a unit, d, h, m or s (30d, 12h).
        #[arg(long, value_parser = parse_age)]
        older_than: Duration,
        /// Count what would go; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// VMs per transaction.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        batch: u64,
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Copy the embedded SQLite store, online (gsaasd may run and write meanwhile: the copy is
    /// one consistent moment), to a new file, owner-only. Restore by stopping gsaasd and putting
    /// the copy at its database's path. PostgreSQL is backed up with its own tools
    /// (docs/operator/deployment.md, "Backup and restore").
    Backup {
        /// The copy's path; it must not exist yet.
        #[arg(long)]
        to: PathBuf,
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
}

/// Runs `work` on the configured database (migrated first), for the `db` commands.
fn on_database<T, F>(
    config: Option<&std::path::Path>,
    work: impl FnOnce(gsaasd::db::Db) -> F,
) -> Result<T, String>
where
    F: std::future::Future<Output = Result<T, gsaasd::db::Error>>,
{
    let config = load(config)?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| format!("cannot start: {e}"))?;
    runtime.block_on(async {
        let db = gsaasd::db::Db::connect(&config.database_url())
            .await
            .map_err(|e| format!("{}", ErrorChain(&e)))?;
        work(db).await.map_err(|e| format!("{}", ErrorChain(&e)))
    })
}

/// `30d`, `12h`, `90m`, `3600s`.
fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit_secs = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => return Err("must be a number and a unit, d, h, m or s (such as 30d)".into()),
    };
    let number: u64 = number.parse().map_err(|_| format!("{number:?} is not a whole number"))?;
    number
        .checked_mul(unit_secs)
        .filter(|&secs| secs <= 100 * 365 * 86_400)
        .map(Duration::from_secs)
        .ok_or_else(|| "must be at most 100 years".into())
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Issue a token signed with gsaasd's key.
    Issue {
        /// The tenant's project (members and admins).
        #[arg(long)]
        project: Option<String>,
        #[arg(long, value_enum, default_value = "member")]
        role: Role,
        /// For `--role agent`: the host the agent runs on.
        #[arg(long)]
        host: Option<String>,
        /// Who the token is for (default: the project's name, or the host).
        #[arg(long)]
        subject: Option<String>,
        /// Create the signing key if there is none (a first installation). Without it, a missing
        /// key is an error: a new key would sign tokens that no running gsaasd accepts.
        #[arg(long)]
        init: bool,
        /// Lifetime in seconds, at most a year (default: the config's auth.token_ttl_secs).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=gsaasd::auth::MAX_TOKEN_TTL_SECS))]
        ttl: Option<u64>,
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Revoke a token, and every renewal of it, on every replica within
    /// auth.revocation_refresh_secs. Needs the database (database_url or GSAAS_DATABASE_URL).
    Revoke {
        /// The token's id (its `jti` claim, or the `root` of a renewed agent token).
        #[arg(long, conflicts_with = "token", required_unless_present = "token")]
        jti: Option<String>,
        /// The token itself (its line is revoked).
        #[arg(long)]
        token: Option<String>,
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        // Each line one JSON object, with the fields of its spans (the request id).
        LogFormat::Json => logs.json().with_current_span(false).with_span_list(true).init(),
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("gsaasd: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The config from the file, the `GSAAS_*` variables (`GSAAS_DATABASE_URL`: a URL with a password
/// is better kept in a secret than in the file) and `flags`.
fn load_with(
    config: Option<&std::path::Path>,
    flags: &[(&str, &str, toml::Value)],
) -> Result<Config, String> {
    let vars = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)));
    Config::resolve(config, vars, flags).map_err(|e| format!("{}", ErrorChain(&e)))
}

fn load(config: Option<&std::path::Path>) -> Result<Config, String> {
    load_with(config, &[])
}

/// gsaasd's signing key, which must exist already.
fn existing_keys(config: &Config) -> Result<Keys, String> {
    let path = config.signing_key_path();
    if !path.exists() {
        return Err(format!(
            "no signing key at {}: a token signed by a new key would open no running gsaasd. Use \
             the config gsaasd serves with (--config), or pass --init to create the key for a new \
             installation",
            path.display()
        ));
    }
    Keys::load_or_create(&path).map_err(|e| format!("{}", ErrorChain(&e)))
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Serve { config, flags } => {
            let config = load_with(config.as_deref(), &flags.settings())?;
            let runtime =
                tokio::runtime::Runtime::new().map_err(|e| format!("cannot start: {e}"))?;
            runtime.block_on(async {
                let service = gsaasd::service::start(config)
                    .await
                    .map_err(|e| format!("{}", ErrorChain(&e)))?;
                println!("gsaasd serving on {}", service.url());
                println!("dashboard: {}/", service.url());
                println!("get a token: gsaasd token issue --project demo --role member");
                println!(
                    "then: curl -H \"Authorization: Bearer $TOKEN\" {}/v1/pool",
                    service.url()
                );
                service.wait().await;
                Ok(())
            })
        }
        Command::Token {
            command: TokenCommand::Issue { project, role, host, subject, ttl, init, config },
        } => {
            let config = load(config.as_deref())?;
            let keys = if init {
                Keys::load_or_create(&config.signing_key_path())
                    .map_err(|e| format!("{}", ErrorChain(&e)))?
            } else {
                existing_keys(&config)?
            };
            let ttl = Duration::from_secs(ttl.unwrap_or(config.auth.token_ttl_secs));
            let token = match role {
                Role::Agent => {
                    let host = host.ok_or("--role agent needs --host HOST")?;
                    gpgpums::HostId::new(&host).map_err(|e| format!("--host: {e}"))?;
                    keys.issue(&host, None, Role::Agent, ttl)
                }
                Role::Metrics => {
                    let subject = subject.unwrap_or_else(|| "metrics".into());
                    keys.issue(&subject, None, Role::Metrics, ttl)
                }
                Role::Member | Role::Admin => {
                    let project = project.ok_or("--project is required for members and admins")?;
                    if project.trim().is_empty() {
                        return Err("--project must not be empty".into());
                    }
                    let subject = subject.unwrap_or_else(|| project.clone());
                    keys.issue(&subject, Some(&project), role, ttl)
                }
            };
            println!("{token}");
            Ok(())
        }
        Command::Token { command: TokenCommand::Revoke { jti, token, config } } => {
            let config = load(config.as_deref())?;
            let id = match (jti, token) {
                (Some(jti), _) if !jti.trim().is_empty() => gsaasd::auth::TokenId {
                    line: jti.trim().to_owned(),
                    // Unknown: keep the row as long as any token can live.
                    expires: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_secs()
                        + gsaasd::auth::MAX_TOKEN_TTL_SECS,
                },
                (Some(_), _) => return Err("--jti must not be empty".into()),
                (None, Some(token)) => existing_keys(&config)?
                    .token_id(token.trim())
                    .map_err(|e| format!("--token {e}"))?,
                (None, None) => return Err("--jti or --token is required".into()),
            };
            let runtime =
                tokio::runtime::Runtime::new().map_err(|e| format!("cannot start: {e}"))?;
            runtime.block_on(async {
                let db = gsaasd::db::Db::connect(&config.database_url())
                    .await
                    .map_err(|e| format!("{}", ErrorChain(&e)))?;
                gsaasd::app::tokens::revoke(&db, &id)
                    .await
                    .map_err(|e| format!("{}", ErrorChain(&e)))
            })?;
            println!("revoked {}", id.line);
            Ok(())
        }
        Command::PublicKey { config } => {
            let config = load(config.as_deref())?;
            let keys = Keys::load_or_create(&config.signing_key_path())
                .map_err(|e| format!("{}", ErrorChain(&e)))?;
            print!("{}", keys.public_pem());
            Ok(())
        }
        Command::Db { command: DbCommand::Purge { older_than, dry_run, batch, config } } => {
            let purged = on_database(config.as_deref(), |db| async move {
                let before = gsaasd::db::now_ms()
                    .saturating_sub(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX));
                gsaasd::db::purge_deleted_vms(&db, before, batch as usize, dry_run).await
            })?;
            let verb = if dry_run { "would purge" } else { "purged" };
            println!("{verb} {} deleted VMs", purged.vms);
            Ok(())
        }
        Command::Db { command: DbCommand::Backup { to, config } } => {
            let copy = to.clone();
            let bytes =
                on_database(config.as_deref(), |db| async move { db.backup_to(&copy).await })?;
            println!("backed up to {} ({bytes} bytes)", to.display());
            Ok(())
        }
        Command::CheckConfig { config, flags } => {
            let config = load_with(config.as_deref(), &flags.settings())?;
            gsaasd::policy::Policy::load(config.auth.policy_file.as_deref())
                .map_err(|e| format!("{}", ErrorChain(&e)))?;
            println!("{config:#?}");
            Ok(())
        }
        Command::Policy { command: PolicyCommand::Dump } => {
            print!("{}", gsaasd::policy::dump());
            Ok(())
        }
        Command::Policy { command: PolicyCommand::Check { config, file } } => {
            let file = match file {
                Some(file) => file,
                None => load(config.as_deref())?.auth.policy_file.ok_or(
                    "the config names no policy file ([auth] policy_file): the defaults apply",
                )?,
            };
            gsaasd::policy::Policy::load(Some(&file)).map_err(|e| format!("{}", ErrorChain(&e)))?;
            println!("{}: valid", file.display());
            Ok(())
        }
        Command::Openapi => {
            print!("{}", gsaasd::http::openapi_document());
            Ok(())
        }
    }
}
