//! A server's share state: the small file the memory interposer (`gpu-share/`, preloaded into
//! every managed server) maps to count what all of the server's processes hold against one limit.
//! Its layout is `gpu-share/include/gsaas_share.h`'s; the agent creates it (root, 0600, in its
//! 0700 run directory) and hands the server an open descriptor (`GSAAS_SHARE_FD`), so no other
//! server can open it by its path.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The file's size: a 64-byte header and 128 slots of 32 bytes.
pub const STATE_BYTES: u64 = 64 + 128 * 32;
/// "GSSH" in little-endian bytes.
pub const MAGIC: u32 = 0x4853_5347;
pub const VERSION: u32 = 1;
/// A limit that limits nothing (an exclusive cGPU has its whole GPU).
pub const UNLIMITED: u64 = u64::MAX;
const SLOTS: u32 = 128;

/// What the interposer counted, as read from the state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub refused_allocations: u64,
    pub refused_sharing: u64,
    pub peak_bytes: u64,
}

/// One server's share state, open.
#[derive(Debug)]
pub struct ShareState {
    file: File,
    path: PathBuf,
}

impl ShareState {
    /// Creates (or resets) the state at `path` with its limits (bytes; [`UNLIMITED`]).
    pub fn create(path: &Path, limit_bytes: u64, pinned_limit_bytes: u64) -> io::Result<Self> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(gsaas_infra::files::FILE_MODE)
            .open(path)?;
        file.set_permissions(std::fs::Permissions::from_mode(gsaas_infra::files::FILE_MODE))?;
        file.set_len(STATE_BYTES)?;
        let mut header = [0u8; 32];
        header[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4..8].copy_from_slice(&VERSION.to_le_bytes());
        header[8..16].copy_from_slice(&limit_bytes.to_le_bytes());
        header[16..24].copy_from_slice(&pinned_limit_bytes.to_le_bytes());
        header[28..32].copy_from_slice(&SLOTS.to_le_bytes());
        // Read through the page cache by the server and by a restarted agent alike: a state
        // matters only while its server runs, which a host crash ends too, so no sync.
        file.write_all_at(&header, 0)?;
        Ok(Self { file, path: path.to_owned() })
    }

    /// Opens an existing state (a server adopted after the agent's restart).
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        let state = Self { file, path: path.to_owned() };
        let mut magic = [0u8; 8];
        state.file.read_exact_at(&mut magic, 0)?;
        if magic[0..4] != MAGIC.to_le_bytes() || state.file.metadata()?.len() != STATE_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not a share state"));
        }
        Ok(state)
    }

    /// The descriptor the server inherits.
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets the device memory limit (a warm spare's, at its handover to a cGPU). The
    /// interposer reads it at each allocation; a spare's starts at 0, so a read that crossed this
    /// write sees at most the new limit.
    pub fn set_limit_bytes(&self, limit: u64) -> io::Result<()> {
        // The server reads it through its mapping of the same pages: no sync needed.
        self.file.write_all_at(&limit.to_le_bytes(), 8)
    }

    /// The device memory limit in force (bytes).
    pub fn limit_bytes(&self) -> io::Result<u64> {
        self.read_u64(8)
    }

    /// The interposer's counters.
    pub fn counters(&self) -> io::Result<Counters> {
        Ok(Counters {
            refused_allocations: self.read_u64(32)?,
            refused_sharing: self.read_u64(40)?,
            peak_bytes: self.read_u64(48)?,
        })
    }

    fn read_u64(&self, offset: u64) -> io::Result<u64> {
        let mut bytes = [0u8; 8];
        self.file.read_exact_at(&mut bytes, offset)?;
        Ok(u64::from_le_bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_has_the_interposers_layout() {
        let dir = std::env::temp_dir().join(format!("rodvr-share-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.share");
        let state = ShareState::create(&path, 2 << 30, UNLIMITED).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, STATE_BYTES);
        assert_eq!(&bytes[0..4], b"GSSH");
        assert_eq!(u64::from_le_bytes(bytes[8..16].try_into().unwrap()), 2 << 30);
        assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()), u64::MAX);
        assert_eq!(u32::from_le_bytes(bytes[28..32].try_into().unwrap()), 128);
        assert!(bytes[32..].iter().all(|b| *b == 0));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(ShareState::open(&path).unwrap().limit_bytes().unwrap(), 2 << 30);
        assert_eq!(state.counters().unwrap(), Counters::default());
        std::fs::write(&path, b"junk").unwrap();
        assert!(ShareState::open(&path).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
