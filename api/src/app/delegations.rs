//! Creating a queued launch's server as its tenant, on a cloud whose projects own their servers
//! (see [`crate::openstack::trusts`] for why a delegation and not the tenant's token).
//!
//! The launch delegates before it is reserved, so whichever replica's round starts it finds the
//! delegation. The saga redeems it for the tenant's credential (kept in memory, like a token
//! handed in by the launch), and the delegation ends once the server is up, or the launch ends
//! without one. One that cannot be ended then (Keystone down) is ended by a later reconciler pass,
//! and its row (which `gsaasd db purge` keeps) goes only once Keystone confirms the trust gone.
//! Every trust ends by itself too: at the queue deadline, and a queued launch on such a cloud
//! waits at most [`MAX_DELEGATED_WAIT`].

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gpgpums::VmId;

use super::sagas::StepError;
use super::App;
use crate::cloud::{CloudError, Delegation, TenantToken};
use crate::error::{Error, ErrorChain};

/// How long a delegation outlives its launch's queue deadline: the start that comes just before
/// the deadline still has the time its server takes to become active.
const DELEGATION_MARGIN: Duration = Duration::from_secs(60);

pub use super::shared::MAX_DELEGATED_WAIT;

/// How many delegations one reconciler pass ends at most.
const ENDED_PER_PASS: i64 = 100;

impl App {
    /// Delegates `tenant`'s right to create `vm`'s server until the launch may still start (its
    /// queue deadline, and the time to become active).
    pub(crate) async fn delegate_for_queue(
        &self,
        vm: VmId,
        tenant: &TenantToken,
        now_ms: i64,
    ) -> Result<Delegation, Error> {
        let active = Duration::from_secs(self.config.launch.active_timeout_secs);
        let deadline_ms = self
            .queue_deadline(now_ms)
            .unwrap_or_else(|| now_ms.saturating_add(MAX_DELEGATED_WAIT.as_millis() as i64));
        let until = Some(
            SystemTime::UNIX_EPOCH
                + Duration::from_millis(deadline_ms.max(0) as u64)
                + active
                + DELEGATION_MARGIN,
        );
        let delegation =
            self.cloud.delegate(tenant, until).await.map_err(super::vms::cloud_error)?;
        let stored = async { self.db.insert_delegation(vm, &delegation.0, now_ms).await };
        if let Err(e) = stored.await {
            let _ = self.cloud.revoke(&delegation, tenant).await;
            return Err(e.into());
        }
        Ok(delegation)
    }

    /// The credential `vm`'s server is created with, when the cloud needs one: the token the
    /// launch handed in, or its redeemed delegation. Kept in this process's memory only, until
    /// the server is up.
    pub(crate) async fn tenant_credential(
        &self,
        vm: VmId,
    ) -> Result<Option<TenantToken>, StepError> {
        if let Some(token) =
            self.sagas.tenant_tokens.lock().expect("tenant tokens").get(&vm).cloned()
        {
            return Ok(Some(token));
        }
        if !self.cloud.needs_tenant_token() {
            return Ok(None);
        }
        let delegation = self.db.delegation_of(vm).await?;
        let Some(trust) = delegation else {
            return Err(StepError::Failed(
                "the VM's server was not created before gsaasd restarted, and the tenant's \
                 Keystone token is kept in memory only: launch it again"
                    .into(),
            ));
        };
        let token = self.cloud.redeem(&Delegation(trust)).await.map_err(|e| match e {
            CloudError::NotFound(what) => {
                StepError::Failed(format!("cannot create the server as its tenant: {what}"))
            }
            e => super::sagas::cloud_failure("create", &e),
        })?;
        self.sagas.tenant_tokens.lock().expect("tenant tokens").insert(vm, token.clone());
        Ok(Some(token))
    }

    /// Ends the delegations of VMs that no longer need them (see [`db::delegations_to_end`]): the
    /// ones whose ending failed (Keystone down), or that a crash left. Returns how many ended.
    pub(crate) async fn end_stale_delegations(&self) -> Result<usize, Error> {
        if !self.cloud.needs_tenant_token() {
            return Ok(0);
        }
        let vms = self.db.delegations_to_end(ENDED_PER_PASS).await?;
        let mut ended = 0;
        for vm in vms {
            ended += usize::from(self.end_delegation(vm, None).await);
        }
        Ok(ended)
    }

    /// Ends `vm`'s delegation, if it has one: with `tenant` (the launch's own token) or the
    /// redeemed credential, and forgets the credential. Its row goes only once Keystone confirms
    /// the trust gone (deleted now, or expired or deleted before); a failure is logged, and the
    /// reconciler tries again ([`Self::end_stale_delegations`]). Whether it ended.
    async fn end_delegation(&self, vm: VmId, tenant: Option<TenantToken>) -> bool {
        // Without the launch's own token, the credential redeemed for the server, if kept.
        let tenant = match tenant {
            Some(tenant) => Some(tenant),
            None => self.sagas.tenant_tokens.lock().expect("tenant tokens").remove(&vm),
        };
        let ended = async {
            let Some(trust) = self.db.delegation_of(vm).await? else { return Ok(()) };
            let delegation = Delegation(trust);
            let credential = match tenant {
                Some(credential) => Some(credential),
                None => match self.cloud.redeem(&delegation).await {
                    Ok(credential) => Some(credential),
                    // Expired or revoked already.
                    Err(CloudError::NotFound(_)) => None,
                    Err(e) => return Err(Error::unavailable("cloud", e)),
                },
            };
            if let Some(credential) = credential {
                self.cloud
                    .revoke(&delegation, &credential)
                    .await
                    .map_err(|e| Error::unavailable("cloud", e))?;
            }
            Ok(self.db.delete_delegation(vm).await?)
        };
        match ended.await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(vm = %vm, error = %ErrorChain(&e), "ending a delegation; the reconciler tries again");
                false
            }
        }
    }

    /// [`Self::end_delegation`] in the background, on a cloud that takes delegations.
    pub(crate) fn spawn_end_delegation(self: &Arc<Self>, vm: VmId, tenant: Option<TenantToken>) {
        if !self.cloud.needs_tenant_token() {
            return;
        }
        let app = self.clone();
        tokio::spawn(async move {
            app.end_delegation(vm, tenant).await;
        });
    }
}
