//! Where gsaasd's settings come from, as twelve-factor operators expect: a command-line flag
//! beats a `GSAAS_*` environment variable, which beats the config file, which beats the default.
//!
//! Every config key has its variable: the key's path, upper-case, sections joined by `__`
//! (`http.body_timeout_secs` is `GSAAS_HTTP__BODY_TIMEOUT_SECS`, `cloud.sim.fixed_ip_range` is
//! `GSAAS_CLOUD__SIM__FIXED_IP_RANGE`). A value is read as a TOML value (`30`, `true`,
//! `["a", "b"]`, `{ k = "v" }`), and as a string when it is not one; a string that looks like a
//! number is quoted (`GSAAS_X='"123"'`). An empty variable counts as unset. Variables whose first
//! part names no top-level key belong to other tools (`GSAAS_URL`, the CLI's) and are left alone.
//!
//! The layers are merged as TOML tables and the result is read like a file, so a variable or flag
//! is checked exactly as the same line in the file would be; an error names the variable or flag
//! that caused it.

use std::path::Path;

use serde::de::{self, Deserialize, Deserializer, Visitor};

use super::{Config, ConfigError};

/// The prefix of gsaasd's environment variables.
pub const ENV_PREFIX: &str = "GSAAS_";

/// One setting given outside the file: by a variable or a flag.
#[derive(Debug, Clone)]
struct Setting {
    /// Where it came from, as the user wrote it (`GSAAS_LISTEN`, `--listen`).
    source: String,
    /// The config key's path (`["http", "body_timeout_secs"]`).
    key: Vec<String>,
    value: toml::Value,
}

/// `GSAAS_*` variables that are not gsaasd's settings: the CLI's and the log format's.
const OTHER_TOOLS: [&str; 6] = ["URL", "TOKEN", "CONFIG", "IMAGE", "FLAVOR", "LOG_FORMAT"];

/// The settings of `GSAAS_*` variables among `vars`, in name order. A variable that names no
/// key is warned about (a typo must not pass unseen), unless it is another tool's.
fn env_settings(vars: impl IntoIterator<Item = (String, String)>) -> Vec<Setting> {
    let top_level = top_level_keys();
    let mut settings: Vec<Setting> = vars
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .filter_map(|(name, value)| {
            let rest = name.strip_prefix(ENV_PREFIX)?;
            let key: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
            if !top_level.contains(&key[0].as_str()) {
                if !OTHER_TOOLS.contains(&rest) {
                    tracing::warn!(variable = %name, "not a gsaasd setting (GSAAS_<KEY>, sections joined by __); ignored");
                }
                return None;
            }
            Some(Setting { source: name.clone(), key, value: toml_value(&value) })
        })
        .collect();
    settings.sort_by(|a, b| a.source.cmp(&b.source));
    settings
}

/// `raw` as a TOML value, or as a string when it is not one.
fn toml_value(raw: &str) -> toml::Value {
    match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut table) if table.len() == 1 => table.remove("v").expect("one key, v"),
        _ => toml::Value::String(raw.to_owned()),
    }
}

/// Sets `setting` in `table`, creating its sections.
fn apply(table: &mut toml::Table, setting: &Setting) -> Result<(), String> {
    let (last, sections) = setting.key.split_last().expect("a key has a name");
    let mut at = table;
    for (depth, section) in sections.iter().enumerate() {
        let entry =
            at.entry(section.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        at = entry.as_table_mut().ok_or_else(|| {
            format!("{} is a value, not a section", setting.key[..=depth].join("."))
        })?;
    }
    match (at.get_mut(last), &setting.value) {
        // A section given whole adds to the file's, key by key.
        (Some(toml::Value::Table(old)), toml::Value::Table(new)) => merge_tables(old, new),
        _ => {
            at.insert(last.clone(), setting.value.clone());
        }
    }
    Ok(())
}

/// `new`'s keys over `old`'s, sections merged the same way.
fn merge_tables(old: &mut toml::Table, new: &toml::Table) {
    for (key, value) in new {
        match (old.get_mut(key), value) {
            (Some(toml::Value::Table(old)), toml::Value::Table(new)) => merge_tables(old, new),
            _ => {
                old.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Fills in what a partial section leaves out and no default can: `[cloud.sim]` or
/// `[cloud.nova]` alone names its backend.
fn complete_sections(table: &mut toml::Table) -> Result<(), String> {
    let Some(cloud) = table.get_mut("cloud").and_then(toml::Value::as_table_mut) else {
        return Ok(());
    };
    if cloud.contains_key("backend") {
        return Ok(());
    }
    let backend = match (cloud.contains_key("sim"), cloud.contains_key("nova")) {
        (_, false) => "sim",
        (false, true) => "nova",
        (true, true) => {
            return Err("cloud: [cloud.sim] and [cloud.nova] both given; set cloud.backend".into())
        }
    };
    cloud.insert("backend".into(), toml::Value::String(backend.into()));
    Ok(())
}

/// What is wrong with a config: at which key (`.`: the whole), and what.
struct Wrong {
    path: String,
    message: String,
}

impl std::fmt::Display for Wrong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path == "." {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// `table` as a config, or what is wrong with it.
fn read(table: &toml::Table) -> Result<Config, Wrong> {
    serde_path_to_error::deserialize(toml::Value::Table(table.clone())).map_err(|e| Wrong {
        path: e.path().to_string(),
        message: e.into_inner().message().trim().to_owned(),
    })
}

/// The last of `settings` on the path of `wrong` (a key at, above or below it): the one to blame.
fn culprit<'a>(settings: &'a [Setting], wrong: &Wrong) -> Option<&'a Setting> {
    let wrong_path: Vec<&str> = wrong
        .path
        .split('.')
        .filter(|p| !p.is_empty())
        .map(|p| p.split('[').next().unwrap_or(p))
        .collect();
    settings.iter().rev().find(|s| {
        let n = s.key.len().min(wrong_path.len());
        n > 0 && s.key[..n].iter().zip(&wrong_path[..n]).all(|(a, b)| a == b)
    })
}

/// The config from every source (see the module docs): `file` (its path), the `GSAAS_*`
/// variables among `vars`, and `flags` as (flag, key path, value).
pub fn resolve(
    file: Option<&Path>,
    vars: impl IntoIterator<Item = (String, String)>,
    flags: &[(&str, &str, toml::Value)],
) -> Result<Config, ConfigError> {
    let mut table = toml::Table::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        // The file alone first: its errors point at its own lines.
        table = toml::from_str(&text)
            .map_err(|source| ConfigError::Parse { path: path.to_owned(), source })?;
        let mut completed = table.clone();
        let invalid = |reason| ConfigError::Invalid { origin: path.display().to_string(), reason };
        complete_sections(&mut completed).map_err(invalid)?;
        if completed == table {
            toml::from_str::<Config>(&text)
                .map_err(|source| ConfigError::Parse { path: path.to_owned(), source })?;
        } else {
            read(&completed).map_err(|wrong| invalid(wrong.to_string()))?;
        }
        table = completed;
    }
    let mut settings = env_settings(vars);
    settings.extend(flags.iter().map(|(flag, key, value)| Setting {
        source: (*flag).to_owned(),
        key: key.split('.').map(str::to_owned).collect(),
        value: value.clone(),
    }));
    for setting in &settings {
        apply(&mut table, setting)
            .map_err(|reason| ConfigError::Setting { setting: setting.source.clone(), reason })?;
    }
    let invalid = |reason| ConfigError::Invalid { origin: origin(file, &settings), reason };
    complete_sections(&mut table).map_err(invalid)?;
    // Settings are read together (some only make sense together, as tls.cert and tls.key); an
    // error names the setting on its path.
    let mut config = read(&table).map_err(|wrong| match culprit(&settings, &wrong) {
        Some(setting) => {
            ConfigError::Setting { setting: setting.source.clone(), reason: wrong.to_string() }
        }
        None => invalid(wrong.to_string()),
    })?;
    config.apply_cloud_defaults();
    config.check().map_err(invalid)?;
    Ok(config)
}

/// What a resolved config came from, for its errors.
fn origin(file: Option<&Path>, settings: &[Setting]) -> String {
    let mut parts: Vec<String> = file.map(|p| p.display().to_string()).into_iter().collect();
    parts.extend(settings.iter().map(|s| s.source.clone()));
    if parts.is_empty() {
        "the defaults".into()
    } else {
        parts.join(", ")
    }
}

/// The names of [`Config`]'s top-level keys, as serde reads them.
fn top_level_keys() -> &'static [&'static str] {
    /// A deserializer that only records the fields a struct asks for.
    struct Fields(Option<&'static [&'static str]>);

    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = de::value::Error;

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = Some(fields);
            Err(de::Error::custom("fields recorded"))
        }

        fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    let mut fields = Fields(None);
    let _ = Config::deserialize(&mut fields);
    fields.0.expect("Config is a struct")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn write(dir: &Path, text: &str) -> std::path::PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("gsaasd.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("gsaas-sources-{name}-{}", std::process::id()))
    }

    #[test]
    fn a_flag_beats_a_variable_which_beats_the_file_which_beats_the_default() {
        let dir = scratch("precedence");
        let file = write(&dir, "listen = \"127.0.0.1:1001\"\n[http]\nbody_timeout_secs = 11\n");
        let env =
            vars(&[("GSAAS_LISTEN", "127.0.0.1:1002"), ("GSAAS_HTTP__BODY_TIMEOUT_SECS", "12")]);
        let flag = [("--listen", "listen", toml::Value::from("127.0.0.1:1003"))];

        let default = resolve(None, vars(&[]), &[]).unwrap();
        assert_eq!(default.listen.port(), 8080);
        let from_file = resolve(Some(&file), vars(&[]), &[]).unwrap();
        assert_eq!((from_file.listen.port(), from_file.http.body_timeout_secs), (1001, 11));
        let from_env = resolve(Some(&file), env.clone(), &[]).unwrap();
        assert_eq!((from_env.listen.port(), from_env.http.body_timeout_secs), (1002, 12));
        let from_flag = resolve(Some(&file), env.clone(), &flag).unwrap();
        assert_eq!((from_flag.listen.port(), from_flag.http.body_timeout_secs), (1003, 12));
        // Without a file, a variable still beats the default.
        let env_only = resolve(None, env, &[]).unwrap();
        assert_eq!(env_only.http.body_timeout_secs, 12);
        assert_eq!(env_only.http.header_timeout_secs, default.http.header_timeout_secs);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_key_has_its_variable_and_other_tools_variables_are_left_alone() {
        let env = vars(&[
            ("GSAAS_DATA_DIR", "/srv/gsaas"),
            ("GSAAS_DEFAULT_POLICY", "best-fit"),
            ("GSAAS_QUEUE__BACKFILL", "false"),
            ("GSAAS_CLOUD__SIM__FIXED_IP_RANGE", "10.9.0.0/24"),
            ("GSAAS_AUTH__KEYSTONE_ADMIN_ROLES", "[\"admin\", \"gpu-admin\"]"),
            ("GSAAS_QUOTAS", "{ cgpus = 8 }"),
            ("GSAAS_URL", "http://elsewhere"),
            ("GSAAS_TOKEN", "not ours"),
            ("GSAAS_DATABASE_URL", ""),
            ("HOME", "/root"),
        ]);
        let config = resolve(None, env, &[]).unwrap();
        assert_eq!(config.data_dir, Path::new("/srv/gsaas"));
        assert_eq!(config.default_policy, "best-fit");
        assert!(!config.queue.backfill);
        assert_eq!(config.auth.keystone_admin_roles, ["admin", "gpu-admin"]);
        assert_eq!(config.quotas.cgpus, Some(8));
        assert_eq!(config.database_url, None, "an empty variable is unset");
        let mut cloud = config.cloud;
        assert_eq!(cloud.sim_mut().unwrap().fixed_ip_range.to_string(), "10.9.0.0/24");
    }

    #[test]
    fn settings_that_go_together_come_from_separate_variables_and_sections_merge() {
        let dir = scratch("together");
        let file = write(
            &dir,
            "[quotas]\nvms = 5\nmax_priority = 3\n[quotas.models.\"H100 80GB\"]\ncgpus = 4\n",
        );
        let env = vars(&[
            ("GSAAS_TLS__CERT", "/etc/gsaas/tls.crt"),
            ("GSAAS_TLS__KEY", "/etc/gsaas/tls.key"),
            ("GSAAS_QUOTAS", "{ cgpus = 8 }"),
        ]);
        let config = resolve(Some(&file), env, &[]).unwrap();
        assert!(config.tls.is_some(), "cert and key from two variables");
        assert_eq!(
            (config.quotas.cgpus, config.quotas.vms, config.quotas.max_priority),
            (Some(8), Some(5), 3),
            "a section given whole adds to the file's"
        );
        assert_eq!(config.quotas.models["H100 80GB"].cgpus, Some(4), "limits per model");
        let err = resolve(Some(&file), vars(&[("GSAAS_TLS__CERT", "/x")]), &[]).unwrap_err();
        assert!(err.to_string().starts_with("GSAAS_TLS__CERT"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_partial_section_needs_no_restated_defaults() {
        let dir = scratch("partial");
        let file = write(&dir, "[cloud.sim]\nfixed_ip_range = \"10.8.0.0/24\"\n");
        let mut config = resolve(Some(&file), vars(&[]), &[]).unwrap();
        assert_eq!(config.cloud.sim_mut().unwrap().fixed_ip_range.to_string(), "10.8.0.0/24");
        let file = write(&dir, "[cloud.nova]\n");
        let mut config = resolve(Some(&file), vars(&[]), &[]).unwrap();
        assert!(config.cloud.sim_mut().is_none(), "[cloud.nova] alone is the nova backend");
        let file = write(&dir, "[cloud.sim]\n[cloud.nova]\n");
        let err = resolve(Some(&file), vars(&[]), &[]).unwrap_err().to_string();
        assert!(err.contains("cloud.backend"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_name_the_variable_or_flag_at_fault() {
        for (env, flags, culprit) in [
            (
                vars(&[("GSAAS_HTTP__BODY_TIMEOUT_SECS", "soon")]),
                vec![],
                "GSAAS_HTTP__BODY_TIMEOUT_SECS",
            ),
            (vars(&[("GSAAS_LISTN", "x")]), vec![], ""),
            (vars(&[("GSAAS_HTTP__NO_SUCH_KEY", "1")]), vec![], "GSAAS_HTTP__NO_SUCH_KEY"),
            (vars(&[("GSAAS_LISTEN__PORT", "1")]), vec![], "GSAAS_LISTEN__PORT"),
            (
                vars(&[]),
                vec![("--listen", "listen", toml::Value::from("not an address"))],
                "--listen",
            ),
        ] {
            let result = resolve(None, env, &flags);
            if culprit.is_empty() {
                assert!(result.is_ok(), "not a key: another tool's variable");
                continue;
            }
            let err = result.unwrap_err().to_string();
            assert!(err.starts_with(culprit), "{err}");
        }
        // What only the whole config can check names where it came from.
        let err = resolve(None, vars(&[("GSAAS_DEFAULT_POLICY", "worst-fit")]), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("GSAAS_DEFAULT_POLICY") && err.contains("worst-fit"), "{err}");
    }
}
