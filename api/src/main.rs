//! The `gsaasd` binary: serve the API, issue tokens, print the OpenAPI document.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use gsaasd::auth::{Keys, Role};
use gsaasd::config::Config;
use gsaasd::error::ErrorChain;

#[derive(Parser)]
#[command(name = "gsaasd", version, about = "GSaaS: GPU scheduling as a service for OpenStack")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the REST API (no config file: the embedded default, SQLite + simulated cloud).
    Serve {
        #[arg(long, short)]
        config: Option<PathBuf>,
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
    /// Check a config file and print the settings it resolves to.
    CheckConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("gsaasd: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The config file, with `GSAAS_DATABASE_URL` overriding `database_url` (a URL with a password is
/// better kept in a secret than in the file).
fn load(config: Option<&std::path::Path>) -> Result<Config, String> {
    let mut config = Config::load(config).map_err(|e| format!("{}", ErrorChain(&e)))?;
    if let Some(url) = std::env::var("GSAAS_DATABASE_URL").ok().filter(|u| !u.is_empty()) {
        config.database_url = Some(url);
    }
    Ok(config)
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
        Command::Serve { config } => {
            let config = load(config.as_deref())?;
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
        Command::CheckConfig { config } => {
            let config = load(Some(&config))?;
            println!("{config:#?}");
            Ok(())
        }
        Command::Openapi => {
            print!("{}", gsaasd::http::openapi_document());
            Ok(())
        }
    }
}
