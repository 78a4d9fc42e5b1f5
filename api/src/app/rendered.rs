//! Each VM's view as last rendered, reused while the VM and its cGPUs are at the same versions.
//!
//! A client following a boot polls its VM every few tens of milliseconds, and a VM of 75 cGPUs
//! is an answer of 11-30 KB: rendering it (75 endpoints formatted, the rCUDA environment, the
//! JSON) cost more than reading it. A view is a function of the VM's `version`, its
//! `cgpus_version` and whether the caller is an admin, as long as the VM has neither queue
//! entries nor events (see [`super::shared::Extras`]); every write of a VM or of its cGPUs bumps
//! one of the two versions (`db::update_vms`, `db::cgpus`' rule), so a view kept under them is
//! the view the read would render.
//!
//! Bounded by the bytes it holds; when full, it starts again empty.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use gpgpums::VmId;

use super::shared::{ViewVersions, VmDetails};

/// The most bytes of rendered views kept.
const KEPT_BYTES: usize = 32 << 20;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct RenderedViews {
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// Per VM and role (admin or not): the versions it was rendered at and the body.
    by_view: HashMap<(VmId, bool), (ViewVersions, Bytes)>,
    bytes: usize,
}

impl RenderedViews {
    /// VM `id`'s view for an admin or not at `versions`: the one kept for them, or `render`'s,
    /// kept when the versions are known.
    fn view(
        &self,
        id: VmId,
        admin: bool,
        versions: Option<ViewVersions>,
        render: impl FnOnce() -> Bytes,
    ) -> Bytes {
        let Some(versions) = versions else {
            return render();
        };
        let key = (id, admin);
        if let Some((kept_at, body)) = self.held.lock().expect("rendered views").by_view.get(&key) {
            if *kept_at == versions {
                return body.clone();
            }
        }
        let body = render();
        let mut held = self.held.lock().expect("rendered views");
        if let Some((_, gone)) = held.by_view.remove(&key) {
            held.bytes -= gone.len();
        }
        if body.len() <= KEPT_BYTES {
            if held.bytes + body.len() > KEPT_BYTES {
                *held = Held::default();
            }
            held.bytes += body.len();
            held.by_view.insert(key, (versions, body.clone()));
        }
        body
    }
}

impl super::App {
    /// The view of `details` for an admin or not, rendered by `render` unless the one kept for
    /// its versions serves (see the module docs).
    pub fn rendered_view(
        &self,
        details: &VmDetails,
        admin: bool,
        render: impl FnOnce() -> Bytes,
    ) -> Bytes {
        self.rendered.view(details.vm.id, admin, details.extras.versions(), render)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn a_view_is_kept_per_vm_role_and_versions() {
        let views = RenderedViews::default();
        let renders = Cell::new(0);
        let view = |id: VmId, admin: bool, versions: Option<(i64, i64)>, body: &'static str| {
            let versions = versions.map(|(vm, cgpus)| ViewVersions { vm, cgpus });
            views.view(id, admin, versions, || {
                renders.set(renders.get() + 1);
                Bytes::from_static(body.as_bytes())
            })
        };
        let (a, b) = (VmId::from_uuid(uuid::Uuid::now_v7()), VmId::from_uuid(uuid::Uuid::now_v7()));
        assert_eq!(view(a, false, Some((1, 1)), "a"), "a");
        assert_eq!(view(a, false, Some((1, 1)), "other"), "a", "kept");
        assert_eq!(renders.get(), 1);
        assert_eq!(view(a, true, Some((1, 1)), "admin"), "admin", "each role its own");
        assert_eq!(view(b, false, Some((1, 1)), "b"), "b", "each VM its own");
        assert_eq!(view(a, false, Some((2, 1)), "vm changed"), "vm changed");
        assert_eq!(view(a, false, Some((2, 2)), "cgpus changed"), "cgpus changed");
        assert_eq!(view(a, false, Some((2, 2)), "other"), "cgpus changed");
        assert_eq!(view(a, true, Some((1, 1)), "other"), "admin");
        assert_eq!(renders.get(), 5);
        // Unknown versions (a VM with queue entries or events): rendered every time.
        assert_eq!(view(a, false, None, "x"), "x");
        assert_eq!(view(a, false, None, "y"), "y");
        assert_eq!(renders.get(), 7);
    }

    #[test]
    fn what_it_holds_is_bounded() {
        let views = RenderedViews::default();
        let big = Bytes::from(vec![b'x'; KEPT_BYTES / 2 + 1]);
        for _ in 0..3 {
            let id = VmId::from_uuid(uuid::Uuid::now_v7());
            views.view(id, false, Some(ViewVersions { vm: 0, cgpus: 0 }), || big.clone());
            let held = views.held.lock().unwrap();
            assert!(held.bytes <= KEPT_BYTES);
            assert_eq!(held.bytes, held.by_view.values().map(|(_, b)| b.len()).sum::<usize>());
        }
    }
}
