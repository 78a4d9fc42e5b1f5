//! Files that hold secrets or tenants' data: owner-only, 0600 files in 0700 directories.
//!
//! The agent's state file names every VM's tap and real rCUDA server (where the GPUs are), and
//! gsaasd's data directory holds its signing key and the database (tenants' user_data). Both
//! binaries create such files only through here, so nothing depends on the umask; files and
//! directories found open to others are closed, not trusted as they are.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of private files.
pub const FILE_MODE: u32 = 0o600;
/// Mode of the directories that hold them.
pub const DIR_MODE: u32 = 0o700;

/// Creates `dir` (and missing parents) as 0700, or makes an existing `dir` 0700; but a shared
/// directory (sticky, as `/tmp`) is never anyone's to close: it is left as it is, and what goes
/// in it is 0600 all the same.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)?;
    if fs::metadata(dir)?.permissions().mode() & 0o1000 != 0 {
        return Ok(());
    }
    restrict(dir, DIR_MODE)
}

/// Makes an existing file or directory `mode` if group or others have any access.
pub fn restrict(path: &Path, mode: u32) -> io::Result<()> {
    let current = fs::metadata(path)?.permissions().mode();
    if current & 0o077 != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Opens `path` for writing, created 0600 (`create_new`: fails if it exists) or truncated and
/// made 0600.
pub fn open_private(path: &Path, create_new: bool) -> io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).mode(FILE_MODE);
    if create_new {
        options.create_new(true);
    } else {
        options.create(true).truncate(true);
    }
    let file = options.open(path)?;
    file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn private_files_and_directories_are_owner_only() {
        let root = std::env::temp_dir().join(format!("rodvr-files-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = root.join("a/b");
        create_private_dir(&dir).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&root.join("a")), mode(&dir)), (0o700, 0o700));
        let file = dir.join("secret");
        fs::write(&file, "old").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        open_private(&file, false).unwrap().write_all(b"new").unwrap();
        assert_eq!(mode(&file), 0o600);
        assert!(open_private(&file, true).is_err(), "create_new refuses an existing file");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700, "an open directory is closed");
        // A shared (sticky) directory, as /tmp, is not closed for a key put in it.
        let shared = root.join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        create_private_dir(&shared).unwrap();
        assert_eq!(fs::metadata(&shared).unwrap().permissions().mode() & 0o7777, 0o1777);
        fs::remove_dir_all(&root).unwrap();
    }
}
