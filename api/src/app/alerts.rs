//! Host alerts: what a host's agent tried that was refused or that outlived its bound, recorded
//! against that host for admins (`GET /v1/hosts`), counted in `/metrics`
//! (`gsaas_host_alerts_total{kind}`) and logged. Recording one never fails the caller: the
//! refusal it explains stands either way.

use gpgpums::HostId;

use super::fields::truncate_chars;
use super::App;
use crate::db::{now_ms, HostAlert};
use crate::error::ErrorChain;
use crate::model::AlertKind;

/// The longest alert kept (an agent's words inside it are cut there).
pub const MAX_ALERT_LEN: usize = 2048;

impl App {
    /// Records an alert against `host` (see the module docs).
    pub(crate) async fn alert_host(&self, host: &HostId, kind: AlertKind, detail: String) {
        let detail = truncate_chars(&detail, MAX_ALERT_LEN).to_owned();
        tracing::warn!(%host, kind = kind.as_str(), %detail, "host alert");
        self.metrics.count_host_alert(kind);
        let alert = HostAlert { at_ms: now_ms(), kind: kind.as_str().into(), detail };
        let recorded = async { self.db.insert_host_alert(host, &alert).await };
        if let Err(e) = recorded.await {
            tracing::warn!(%host, error = %ErrorChain(&e), "recording a host alert");
        }
    }
}
