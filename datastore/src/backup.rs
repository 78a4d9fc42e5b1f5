//! Backups of the embedded store: `gsaasd db backup --to PATH` (see docs/operator/deployment.md,
//! "Backup and restore"), online, while gsaasd serves.

use super::Db;
use crate::error::Error;

impl Db {
    /// Copies the SQLite store to `to` (a new file, created owner-only) at one consistent
    /// moment, while gsaasd may go on writing (`VACUUM INTO`, which also leaves the copy
    /// compact). Returns the copy's size. PostgreSQL has its own tools (`pg_dump`,
    /// `pg_basebackup`): refused with their names.
    pub async fn backup_to(&self, to: &std::path::Path) -> Result<u64, Error> {
        if self.backend() == super::Backend::Postgres {
            return Err(Error::invalid(
                "database",
                "gsaasd db backup copies the embedded SQLite store; back PostgreSQL up with \
                 pg_dump (a logical copy) or pg_basebackup (a physical one)",
            ));
        }
        if to.exists() {
            return Err(Error::invalid("to", format!("{} exists already", to.display())));
        }
        let path = to.to_str().ok_or_else(|| Error::invalid("to", "not a UTF-8 path"))?;
        // VACUUM INTO takes an empty file: created here, owner-only, as the store itself.
        gsaas_infra::files::open_private(to, true)
            .map_err(|e| Error::invalid("to", format!("cannot create {}: {e}", to.display())))?;
        let copied = sqlx::query(&format!("VACUUM INTO '{}'", path.replace('\'', "''")))
            .execute(&mut *self.connection().await?)
            .await;
        if let Err(e) = copied {
            let _ = std::fs::remove_file(to);
            return Err(e.into());
        }
        Ok(std::fs::metadata(to).map(|m| m.len()).unwrap_or(0))
    }
}
