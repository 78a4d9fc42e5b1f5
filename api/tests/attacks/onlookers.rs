//! What an onlooker reads: a terminal shared on a call, a log shipped to a team, an error pasted
//! into a ticket. Configuration shown by `gsaasd check-config`, and the errors of a service that
//! cannot start, name the database and the broker but never their passwords.

use std::process::{Command, Output};

use crate::support::{gsaasd_binary, temp_dir};

const DB_PASSWORD: &str = "db-Hunter2";
const MQ_PASSWORD: &str = "mq-Hunter3";
const QUERY_PASSWORD: &str = "q-Hunter4";

fn gsaasd(args: &[&str], env: &[(&str, &str)]) -> (Output, String) {
    let mut command = Command::new(gsaasd_binary());
    command.args(args).env_remove("GSAAS_DATABASE_URL");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, text)
}

fn assert_no_password(text: &str, what: &str) {
    for secret in [DB_PASSWORD, MQ_PASSWORD, QUERY_PASSWORD] {
        assert!(!text.contains(secret), "{what} shows a password:\n{text}");
    }
}

/// From a flag, a variable and a file alike, `check-config` shows where the database and the
/// broker are, with `***` for the password of the user and of a `password=` parameter.
#[test]
fn check_config_redacts_the_credentials_of_every_url() {
    let dir = temp_dir();
    let file = dir.join("gsaasd.toml");
    std::fs::write(
        &file,
        format!(
            "database_url = \"postgres://gsaas:{DB_PASSWORD}@db.internal/gsaas\"\n\
             [notifications]\ntransport_url = \"rabbit://nova:{MQ_PASSWORD}@mq.internal:5672/\"\n"
        ),
    )
    .unwrap();
    let file = file.display().to_string();
    let from_flag = format!("postgres://db.internal/gsaas?user=gsaas&password={QUERY_PASSWORD}");
    let from_variable = format!("rabbit://nova:{MQ_PASSWORD}@mq.internal:5672/");
    for (args, env, shown) in [
        (vec!["check-config", "-c", &file], vec![], "postgres://gsaas:***@db.internal/gsaas"),
        (
            vec!["check-config", "--database-url", &from_flag],
            vec![("GSAAS_NOTIFICATIONS__TRANSPORT_URL", from_variable.as_str())],
            "postgres://db.internal/gsaas?user=gsaas&password=***",
        ),
    ] {
        let (out, text) = gsaasd(&args, &env);
        assert!(out.status.success(), "{args:?}: {text}");
        assert_no_password(&text, "check-config");
        assert!(text.contains(shown), "{args:?} shows where the database is:\n{text}");
        assert!(text.contains("rabbit://nova:***@mq.internal:5672/"), "{args:?}:\n{text}");
    }
}

/// A service that cannot start names what is wrong, not the password: a broker URL it cannot
/// read, and a database URL whose port is not a number.
#[test]
fn errors_of_a_service_that_cannot_start_name_no_password() {
    let dir = temp_dir();
    let data_dir = dir.join("data").display().to_string();
    for (args, env) in [
        (
            vec!["check-config".to_owned()],
            vec![(
                "GSAAS_NOTIFICATIONS__TRANSPORT_URL",
                format!("rabbit://nova:{MQ_PASSWORD}@mq.internal:port/"),
            )],
        ),
        (
            vec![
                "serve".to_owned(),
                "--listen=127.0.0.1:0".to_owned(),
                format!("--data-dir={data_dir}"),
                format!("--database-url=postgres://gsaas:{DB_PASSWORD}@127.0.0.1:port/gsaas"),
            ],
            vec![],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let (out, text) = gsaasd(&args, &env);
        assert!(!out.status.success(), "{args:?} fails: {text}");
        assert_no_password(&text, &format!("{args:?}"));
    }
}
