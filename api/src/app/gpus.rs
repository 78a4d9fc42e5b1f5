//! GPUs' taints: a tainted GPU keeps the cGPUs it has and takes no new ones.
//!
//! Admins taint a GPU they distrust and untaint it when it is fixed. gsaasd taints one itself when
//! its own host's agent refuses routes to it (a route table names its target as at fault): placing
//! more cGPUs there would fail every launch while good GPUs stay idle. The taint says which agent
//! refused and why, for an admin to judge; a hostile agent can taint only its own host's GPUs (a
//! refusal that blames another host's GPU becomes an alert on the refusing host).

use gpgpums::GpuId;

use super::fields::truncate_chars;
use super::App;
use crate::error::Error;

/// The longest taint reason kept (an agent's words are cut there).
pub const MAX_TAINT_LEN: usize = 1024;

impl App {
    /// Taints `gpu` with `reason`, or untaints it (`None`), in the database and the pool.
    pub async fn set_gpu_taint(&self, gpu: &GpuId, reason: Option<String>) -> Result<(), Error> {
        let reason = reason.map(|r| truncate_chars(&r, MAX_TAINT_LEN).to_owned());
        let gpu = gpu.clone();
        self.with_pool(move |pool, tx| {
            Box::pin(async move {
                if reason.is_none() {
                    // A GPU quarantined for a shared endpoint serves again only if it is its own.
                    tx.claim_rcuda_endpoint(&gpu).await?;
                }
                if !tx.set_gpu_taint(&gpu, reason.as_deref()).await? {
                    return Err(Error::NotFound { kind: "GPU", id: gpu.to_string() });
                }
                pool.set_gpu_taint(&gpu, reason)?;
                Ok(())
            })
        })
        .await?;
        self.trigger_queue();
        Ok(())
    }
}
