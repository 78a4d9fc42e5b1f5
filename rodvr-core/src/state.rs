//! The agent's ledger: the last accepted route table, persisted before it is applied.
//!
//! Generation rules (the controller is the only writer): an older generation is refused, the same
//! generation with the same content is accepted again (a retried request), and the same generation
//! with different content is refused (two writers, or a controller bug). The table is written to a
//! temporary file, synced, and renamed over the state file, so a crash leaves either the old or the
//! new table on disk, never a torn one; on start the agent re-applies it without the controller.
//! The file is 0600: it names every VM's tap and the real rCUDA servers, which VMs must not learn.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rodvr_contract::protocol::RouteTable;

/// A state-file problem; always names the file.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("cannot read state file {path}")]
    Read { path: PathBuf, source: io::Error },
    #[error("state file {path} is not a valid route table")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("cannot write state file {path}")]
    Write { path: PathBuf, source: io::Error },
}

/// Why an offered table is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerationConflict {
    #[error("generation {offered} is older than the current generation {current}")]
    Older { offered: u64, current: u64 },
    #[error("generation {generation} was already accepted with different content")]
    DifferentContent { generation: u64 },
}

/// How an acceptable table relates to the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    New,
    Unchanged,
}

#[derive(Debug)]
pub struct Ledger {
    /// The state file; `None` keeps the table in memory only.
    path: Option<PathBuf>,
    current: Option<RouteTable>,
}

impl Ledger {
    /// Opens the ledger at `path`; a missing file means no table was ever accepted.
    pub fn load(path: impl Into<PathBuf>) -> Result<Self, StateFileError> {
        let path = path.into();
        let current = match fs::read(&path) {
            Ok(bytes) => {
                gsaas_infra::files::restrict(&path, gsaas_infra::files::FILE_MODE)
                    .map_err(|source| StateFileError::Write { path: path.clone(), source })?;
                Some(
                    serde_json::from_slice(&bytes)
                        .map_err(|source| StateFileError::Parse { path: path.clone(), source })?,
                )
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(source) => return Err(StateFileError::Read { path, source }),
        };
        Ok(Self { path: Some(path), current })
    }

    /// A ledger without a state file, for agents inside a controller whose database is the source
    /// of truth: after a restart they hold nothing, and the controller's reconciler pushes their
    /// tables again.
    pub fn in_memory() -> Self {
        Self { path: None, current: None }
    }

    pub fn current(&self) -> Option<&RouteTable> {
        self.current.as_ref()
    }

    /// Applies the generation rules to `offered` without changing anything.
    pub fn admit(&self, offered: &RouteTable) -> Result<Admission, GenerationConflict> {
        let Some(current) = &self.current else { return Ok(Admission::New) };
        if offered.generation < current.generation {
            return Err(GenerationConflict::Older {
                offered: offered.generation,
                current: current.generation,
            });
        }
        if offered.generation > current.generation {
            return Ok(Admission::New);
        }
        if offered == current {
            Ok(Admission::Unchanged)
        } else {
            Err(GenerationConflict::DifferentContent { generation: offered.generation })
        }
    }

    /// Durably replaces the persisted table with `table` (temp file, fsync, rename, fsync dir).
    pub fn persist(&mut self, table: RouteTable) -> Result<(), StateFileError> {
        if let Some(path) = &self.path {
            write_atomically(path, &table)?;
        }
        self.current = Some(table);
        Ok(())
    }
}

fn write_atomically(path: &Path, table: &RouteTable) -> Result<(), StateFileError> {
    let write_err = |source| StateFileError::Write { path: path.to_owned(), source };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{}.tmp", file_name.as_deref().unwrap_or("state")));
    let bytes = serde_json::to_vec_pretty(table).expect("route tables always serialize");
    let write = || -> io::Result<()> {
        let mut f = gsaas_infra::files::open_private(&tmp, false)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(&dir)?.sync_all()
    };
    write().map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpgpums::ids::VmId;
    use rodvr_contract::protocol::Route;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rodvr-state-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn table(generation: u64, port: u16) -> RouteTable {
        RouteTable {
            generation,
            routes: vec![Route {
                vm: VmId::from_uuid(uuid::Uuid::from_u128(7)),
                vm_ip: "10.0.0.2".parse().unwrap(),
                vm_tap: "tap1".into(),
                masked: "100.127.0.1:9000".parse().unwrap(),
                target: format!("10.1.0.2:{port}").parse().unwrap(),
                gpu_number: 0,
                index: None,
                remoting: Default::default(),
            }],
            metadata: None,
            vms_without_cgpus: vec![],
            lost: vec![],
            servers: vec![],
        }
    }

    #[test]
    fn generation_rules() {
        let dir = temp_dir("gen");
        let mut ledger = Ledger::load(dir.join("routes.json")).unwrap();
        assert_eq!(ledger.admit(&table(5, 1)), Ok(Admission::New));
        ledger.persist(table(5, 1)).unwrap();
        assert_eq!(ledger.admit(&table(5, 1)), Ok(Admission::Unchanged));
        assert_eq!(
            ledger.admit(&table(5, 2)),
            Err(GenerationConflict::DifferentContent { generation: 5 })
        );
        assert_eq!(
            ledger.admit(&table(4, 1)),
            Err(GenerationConflict::Older { offered: 4, current: 5 })
        );
        assert_eq!(ledger.admit(&table(6, 2)), Ok(Admission::New));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn persisted_table_survives_reload_and_errors_name_the_file() {
        let dir = temp_dir("reload");
        let path = dir.join("routes.json");
        Ledger::load(&path).unwrap().persist(table(3, 1)).unwrap();
        assert_eq!(Ledger::load(&path).unwrap().current(), Some(&table(3, 1)));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!dir.join(".routes.json.tmp").exists());

        fs::write(&path, b"{not json").unwrap();
        let err = Ledger::load(&path).unwrap_err();
        assert!(err.to_string().contains(&path.display().to_string()), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }
}
