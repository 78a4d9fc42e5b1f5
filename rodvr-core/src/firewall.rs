//! Where rendered transactions go: the kernel (`nft`) or an in-memory model of the same table.
//!
//! [`Firewall`] is the one side effect of the data plane. The agent binary's `NftFirewall`
//! sends the rendered JSON to `nft -j` (one kernel transaction per document). [`MemoryFirewall`]
//! applies the same [`Transaction`]s to an in-memory table with the kernel's all-or-nothing
//! semantics and its element rules (deleting a missing element fails), and answers where a VM's
//! connection would be sent; `gsaasd` runs it as its default host backend and tests use it
//! without root.
//!
//! [`Dataplane`] decides *how* to reach a desired route set: an element diff against what it last
//! installed, or a full table replace when nothing is known to be installed or the diff fails
//! (for instance because someone deleted the table behind the agent's back).

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::render::{
    resolve, target_ids, RouteKey, RouteMap, ServerFilter, TableParams, TargetIds, Transaction,
};

/// Why a transaction did not apply. Nothing of it was applied.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("nft rejected or failed the transaction: {0}")]
    Nft(String),
    #[error("nft rejected the transaction: {0}")]
    Rejected(String),
    #[error("the nft session failed: {0}")]
    Session(String),
    #[error("the agent's table does not exist")]
    NoTable,
    #[error("element {0} does not exist")]
    MissingElement(String),
    #[error("element {0} already exists with different data")]
    ConflictingElement(String),
    #[error("element {0} refers to a target that does not exist")]
    MissingChain(String),
    #[error("could not cut the connections of re-targeted routes: {0}")]
    Cut(String),
}

/// Applies one transaction atomically, and cuts connections.
pub trait Firewall: Send + fmt::Debug {
    fn apply(&mut self, tx: &Transaction) -> Result<(), FirewallError>;

    /// Cuts the open connections of routes that were re-targeted: each is a route's key and the
    /// target its connections were sent to before. The filters already reset such a connection
    /// at its next packet (see `render::still_routed_rules`) where the marks they carry the
    /// route's target in are free; the cut ends its conntrack entry, and is what holds it where
    /// they are not.
    fn cut(&mut self, connections: &[(RouteKey, SocketAddrV4)]) -> Result<(), FirewallError>;

    /// Cuts every open connection that was sent to a target other than its route's in `routes`
    /// (after a full replace: the cuts of a re-target may have been lost with an agent that
    /// stopped between applying a table and cutting, or whose cut failed).
    fn sweep(&mut self, routes: &RouteMap) -> Result<(), FirewallError>;

    /// Replaces the filter that keeps a managed host's cGPU servers to their own clients.
    fn filter_servers(&mut self, filter: &ServerFilter) -> Result<(), FirewallError>;
}

/// The agent's table as the memory firewall holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryTable {
    pub params: TableParams,
    pub routes: RouteMap,
    /// rCUDA endpoints that have a target chain, with the id route elements use for them.
    pub targets: TargetIds,
}

/// An in-memory firewall holding the same table the kernel would.
#[derive(Debug, Clone, Default)]
pub struct MemoryFirewall {
    table: Option<MemoryTable>,
    server_filter: Option<ServerFilter>,
    transactions: u64,
    /// Every connection cut asked for, in order.
    cuts: Vec<(RouteKey, SocketAddrV4)>,
}

impl MemoryFirewall {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn table(&self) -> Option<&MemoryTable> {
        self.table.as_ref()
    }

    /// Number of transactions that applied.
    pub fn transactions(&self) -> u64 {
        self.transactions
    }

    /// The connections cut so far: each route's key and the target it no longer reaches.
    pub fn cuts(&self) -> &[(RouteKey, SocketAddrV4)] {
        &self.cuts
    }

    /// Whether a connection from `client` off the host reaches the managed server on `port` (no
    /// filter: this host runs none, so nothing keeps it out).
    pub fn server_allows(&self, client: Ipv4Addr, port: u16) -> bool {
        self.server_filter.as_ref().is_none_or(|f| f.allowed.contains(&(client, port)))
    }

    /// Drops the table, as a reboot or an operator's `nft delete table` would.
    pub fn lose_table(&mut self) {
        self.table = None;
    }

    /// Where a new connection from a VM (source `src`, arriving on `iif`) to `masked` is sent;
    /// `None` when it is dropped.
    pub fn resolve(&self, src: Ipv4Addr, iif: &str, masked: SocketAddrV4) -> Option<SocketAddrV4> {
        resolve(&self.table.as_ref()?.routes, src, iif, masked)
    }
}

/// A route as errors name it.
pub fn describe(key: &RouteKey) -> String {
    format!("{} {} -> {}", key.tap, key.ip, key.masked)
}

impl Firewall for MemoryFirewall {
    fn apply(&mut self, tx: &Transaction) -> Result<(), FirewallError> {
        match tx {
            Transaction::Replace { params, routes } => {
                let targets = target_ids(routes);
                self.table =
                    Some(MemoryTable { params: params.clone(), routes: routes.clone(), targets });
            }
            Transaction::Update { new_targets, delete, add } => {
                let table = self.table.as_ref().ok_or(FirewallError::NoTable)?;
                let mut routes = table.routes.clone();
                let mut targets = table.targets.clone();
                targets.extend(new_targets.iter().map(|t| (t.addr, t.id)));
                for key in delete {
                    routes
                        .remove(key)
                        .ok_or_else(|| FirewallError::MissingElement(describe(key)))?;
                }
                for (key, target) in add {
                    // The kernel would take an id without a target, and drop the route's
                    // connections; the renderer never writes one.
                    if targets.get(&target.addr) != Some(&target.id) {
                        return Err(FirewallError::MissingChain(describe(key)));
                    }
                    if let Some(old) = routes.insert(key.clone(), target.addr) {
                        if old != target.addr {
                            return Err(FirewallError::ConflictingElement(describe(key)));
                        }
                    }
                }
                let table = self.table.as_mut().ok_or(FirewallError::NoTable)?;
                table.routes = routes;
                table.targets = targets;
            }
        }
        self.transactions += 1;
        Ok(())
    }

    fn cut(&mut self, connections: &[(RouteKey, SocketAddrV4)]) -> Result<(), FirewallError> {
        self.cuts.extend_from_slice(connections);
        Ok(())
    }

    /// The memory firewall tracks no connections.
    fn sweep(&mut self, _routes: &RouteMap) -> Result<(), FirewallError> {
        Ok(())
    }

    fn filter_servers(&mut self, filter: &ServerFilter) -> Result<(), FirewallError> {
        self.server_filter = Some(filter.clone());
        self.transactions += 1;
        Ok(())
    }
}

impl<F: Firewall + ?Sized> Firewall for Box<F> {
    fn apply(&mut self, tx: &Transaction) -> Result<(), FirewallError> {
        (**self).apply(tx)
    }

    fn cut(&mut self, connections: &[(RouteKey, SocketAddrV4)]) -> Result<(), FirewallError> {
        (**self).cut(connections)
    }

    fn sweep(&mut self, routes: &RouteMap) -> Result<(), FirewallError> {
        (**self).sweep(routes)
    }

    fn filter_servers(&mut self, filter: &ServerFilter) -> Result<(), FirewallError> {
        (**self).filter_servers(filter)
    }
}

/// Drives a [`Firewall`] towards a desired route set, as cheaply as it safely can.
///
/// The filters hold every open connection to its route as it is now (see
/// `render::still_routed_rules`): a removed route's connections are dropped and a re-targeted
/// one's reset at their next packet. So a table counts as applied once its transaction is in;
/// the conntrack entries of re-targeted routes are cut afterwards ([`Self::tidy_connections`],
/// after the table's answer), which only tidies up, except where another ruleset holds both
/// marks the filters carry a route's target in.
#[derive(Debug)]
pub struct Dataplane<F> {
    firewall: F,
    params: TableParams,
    installed: Option<Installed>,
    /// Re-targeted routes whose old connections are not cut yet (a cut that failed is retried
    /// at the next tidy-up).
    pending_cuts: Vec<(RouteKey, SocketAddrV4)>,
    /// A full replace happened since the last sweep: what was pending before it is unknown.
    sweep_due: bool,
    /// The servers' filter in place, as last applied (none: unknown).
    server_filter: Option<ServerFilter>,
}

/// What the dataplane knows is in the firewall.
#[derive(Debug)]
struct Installed {
    routes: RouteMap,
    targets: TargetIds,
}

impl<F: Firewall> Dataplane<F> {
    pub fn new(firewall: F, params: TableParams) -> Self {
        Self {
            firewall,
            params,
            installed: None,
            pending_cuts: Vec::new(),
            sweep_due: false,
            server_filter: None,
        }
    }

    pub fn firewall(&self) -> &F {
        &self.firewall
    }

    pub fn firewall_mut(&mut self) -> &mut F {
        &mut self.firewall
    }

    pub fn params(&self) -> &TableParams {
        &self.params
    }

    /// Makes the firewall hold exactly `routes`: by element diff when the installed table is
    /// known, otherwise (or if the diff fails) by replacing the whole table.
    /// A route whose target changes has its open connections cut at the next
    /// [`Self::tidy_connections`].
    pub fn converge(&mut self, routes: RouteMap) -> Result<(), FirewallError> {
        if let Some(installed) = &mut self.installed {
            let retargeted = routes.iter().filter_map(|(key, target)| {
                let old = installed.routes.get(key)?;
                (old != target).then(|| (key.clone(), *old))
            });
            let retargeted: Vec<_> = retargeted.collect();
            if let Some(tx) = Transaction::diff(&installed.routes, &installed.targets, &routes) {
                if tx.is_noop() || self.firewall.apply(&tx).is_ok() {
                    if let Transaction::Update { new_targets, .. } = tx {
                        installed.targets.extend(new_targets.iter().map(|t| (t.addr, t.id)));
                    }
                    installed.routes = routes;
                    self.pending_cuts.extend(retargeted);
                    return Ok(());
                }
            }
        }
        self.replace(routes)
    }

    /// Rebuilds the whole table, whatever is installed; the next [`Self::tidy_connections`]
    /// cuts every connection sent to another target than its route's (see [`Firewall::sweep`]).
    pub fn replace(&mut self, routes: RouteMap) -> Result<(), FirewallError> {
        self.installed = None;
        let tx = Transaction::Replace { params: self.params.clone(), routes };
        self.firewall.apply(&tx)?;
        let Transaction::Replace { routes, .. } = tx else { unreachable!("built above") };
        self.installed = Some(Installed { targets: target_ids(&routes), routes });
        self.sweep_due = true;
        Ok(())
    }

    /// Whether [`Self::tidy_connections`] has anything to do.
    pub fn connections_to_tidy(&self) -> bool {
        self.installed.is_some() && (self.sweep_due || !self.pending_cuts.is_empty())
    }

    /// Cuts the conntrack entries of connections whose route's target changed (all of them after
    /// a full replace, else those of the re-targets since the last call, except those routed to
    /// their old target again meanwhile). What fails stays due for the next call.
    pub fn tidy_connections(&mut self) -> Result<(), FirewallError> {
        let Some(installed) = self.installed.as_ref().map(|i| &i.routes) else { return Ok(()) };
        if self.sweep_due {
            self.firewall.sweep(installed)?;
            self.sweep_due = false;
            self.pending_cuts.clear();
            return Ok(());
        }
        self.pending_cuts.retain(|(key, old)| installed.get(key) != Some(old));
        self.pending_cuts.sort();
        self.pending_cuts.dedup();
        if self.pending_cuts.is_empty() {
            return Ok(());
        }
        self.firewall.cut(&self.pending_cuts)?;
        self.pending_cuts.clear();
        Ok(())
    }

    /// Lets each (client, port) of `allowed` reach this host's managed server on that port, and
    /// nothing else from off the host reach the servers' range (see [`ServerFilter`]). Nothing
    /// to do on a host that runs no servers, or when the filter in place already says that (a
    /// server for a VM of this host changes no client).
    pub fn filter_servers(
        &mut self,
        allowed: std::collections::BTreeSet<(Ipv4Addr, u16)>,
    ) -> Result<(), FirewallError> {
        let Some(servers) = self.params.local_servers else { return Ok(()) };
        let filter = ServerFilter { masked_range: self.params.masked_range, servers, allowed };
        if self.server_filter.as_ref() == Some(&filter) {
            return Ok(());
        }
        self.server_filter = None;
        self.firewall.filter_servers(&filter)?;
        self.server_filter = Some(filter);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{params, routes};
    use crate::render::Target;

    #[test]
    fn memory_updates_are_all_or_nothing() {
        let mut fw = MemoryFirewall::new();
        let update = Transaction::diff(&RouteMap::new(), &TargetIds::new(), &routes(2)).unwrap();
        assert!(matches!(fw.apply(&update), Err(FirewallError::NoTable)));
        fw.apply(&Transaction::Replace { params: params(), routes: routes(1) }).unwrap();
        let third: Vec<(RouteKey, Target)> =
            routes(3).into_iter().skip(2).map(|(k, addr)| (k, Target { addr, id: 2 })).collect();
        // The second half of this update is fine, the first deletes an element that is not there.
        let bad = Transaction::Update {
            new_targets: vec![third[0].1],
            delete: vec![routes(2).into_keys().nth(1).unwrap()],
            add: third.clone(),
        };
        assert!(matches!(fw.apply(&bad), Err(FirewallError::MissingElement(_))));
        assert_eq!(fw.table().unwrap().routes, routes(1));
        assert_eq!(fw.table().unwrap().targets, target_ids(&routes(1)));
        // A route never refers to a target that was not created (or to a target's old id).
        let no_chain = Transaction::Update { new_targets: vec![], delete: vec![], add: third };
        assert!(matches!(fw.apply(&no_chain), Err(FirewallError::MissingChain(_))));
    }

    #[test]
    fn dataplane_diffs_then_recovers_a_lost_table() {
        let mut dp = Dataplane::new(MemoryFirewall::new(), params());
        dp.converge(routes(3)).unwrap();
        dp.converge(routes(5)).unwrap();
        assert_eq!(dp.firewall().transactions(), 2);
        let src = Ipv4Addr::new(10, 77, 0, 4);
        let masked = SocketAddrV4::new(Ipv4Addr::new(100, 127, 0, 1), 9000);
        assert_eq!(
            dp.firewall().resolve(src, "tap4", masked),
            Some("10.78.0.2:8304".parse().unwrap())
        );

        dp.firewall_mut().lose_table();
        dp.converge(routes(2)).unwrap();
        assert_eq!(dp.firewall().table().unwrap().routes, routes(2));
        assert_eq!(dp.firewall().resolve(src, "tap4", masked), None);
    }

    /// The memory firewall, whose cuts fail while `fail` is set; counts the servers' filters
    /// it is given.
    #[derive(Debug)]
    struct FlakyCuts {
        inner: MemoryFirewall,
        fail: bool,
        filters: u32,
    }

    impl Firewall for FlakyCuts {
        fn apply(&mut self, tx: &Transaction) -> Result<(), FirewallError> {
            self.inner.apply(tx)
        }

        fn cut(&mut self, connections: &[(RouteKey, SocketAddrV4)]) -> Result<(), FirewallError> {
            if self.fail {
                return Err(FirewallError::Cut("conntrack is missing".into()));
            }
            self.inner.cut(connections)
        }

        fn sweep(&mut self, routes: &RouteMap) -> Result<(), FirewallError> {
            self.inner.sweep(routes)
        }

        fn filter_servers(&mut self, filter: &ServerFilter) -> Result<(), FirewallError> {
            self.filters += 1;
            self.inner.filter_servers(filter)
        }
    }

    #[test]
    fn the_servers_filter_is_applied_only_when_it_changes() {
        let fw = FlakyCuts { inner: MemoryFirewall::new(), fail: false, filters: 0 };
        let mut params = params();
        params.local_servers = Some(crate::render::LocalServers {
            address: Ipv4Addr::new(10, 78, 0, 2),
            first_port: 20000,
            last_port: 20009,
        });
        let mut dp = Dataplane::new(fw, params);
        let client = Ipv4Addr::new(10, 78, 0, 9);
        dp.filter_servers([(client, 20000)].into()).unwrap();
        dp.filter_servers([(client, 20000)].into()).unwrap();
        assert_eq!(dp.firewall().filters, 1, "an unchanged filter was applied again");
        assert!(dp.firewall().inner.server_allows(client, 20000));
        dp.filter_servers([(client, 20001)].into()).unwrap();
        assert_eq!(dp.firewall().filters, 2);
        assert!(!dp.firewall().inner.server_allows(client, 20000));
        assert!(dp.firewall().inner.server_allows(client, 20001));
    }

    #[test]
    fn retargeted_routes_have_their_connections_cut_after_the_table_until_it_succeeds() {
        let fw = FlakyCuts { inner: MemoryFirewall::new(), fail: false, filters: 0 };
        let mut dp = Dataplane::new(fw, params());
        dp.converge(routes(3)).unwrap();
        assert!(dp.connections_to_tidy(), "a full replace is swept after");
        dp.tidy_connections().unwrap();
        assert!(!dp.connections_to_tidy());
        let mut moved = routes(3);
        let key = moved.keys().nth(1).unwrap().clone();
        let old = moved[&key];
        let new_target = SocketAddrV4::new(Ipv4Addr::new(10, 78, 0, 3), 8308);
        moved.insert(key.clone(), new_target);
        // Only the re-targeted route's connections are cut; adding and removing routes cuts
        // nothing (the filters drop a removed route's connections). The table is in before any
        // cut, and a failed cut does not undo it.
        dp.firewall_mut().fail = true;
        dp.converge(moved.clone()).unwrap();
        assert_eq!(dp.firewall().inner.table().unwrap().routes, moved, "the table is in");
        assert!(dp.firewall().inner.cuts().is_empty(), "nothing is cut with the table");
        assert!(matches!(dp.tidy_connections(), Err(FirewallError::Cut(_))));
        assert!(dp.connections_to_tidy(), "a failed cut stays due");
        dp.firewall_mut().fail = false;
        dp.tidy_connections().unwrap();
        assert_eq!(dp.firewall().inner.cuts(), &[(key.clone(), old)]);
        dp.converge(routes(4)).unwrap();
        dp.tidy_connections().unwrap();
        assert_eq!(dp.firewall().inner.cuts().len(), 2, "moving back is a re-target too");
        // A cut still pending when its route goes back to that old target is not due any more.
        dp.converge(moved.clone()).unwrap();
        dp.converge(routes(4)).unwrap();
        dp.tidy_connections().unwrap();
        let expected = [(key.clone(), old), (key.clone(), new_target), (key, new_target)];
        // The last one is that of the move back; the pending one was dropped.
        assert_eq!(dp.firewall().inner.cuts(), &expected, "the pending cut was no longer due");
    }

    fn arbitrary_routes() -> impl proptest::strategy::Strategy<Value = RouteMap> {
        use proptest::prelude::*;
        proptest::collection::btree_map((0u8..12, 0u16..3, 0u8..2), 0u16..4, 0..16).prop_map(|m| {
            m.into_iter()
                .map(|((vm, masked_port, net), target_port)| {
                    let (tap, ip) = (format!("tap{vm}"), Ipv4Addr::new(10, 77, net, vm));
                    let masked =
                        SocketAddrV4::new(Ipv4Addr::new(100, 127, 0, 1), 9000 + masked_port);
                    let target = SocketAddrV4::new(Ipv4Addr::new(10, 78, 0, 2), 8308 + target_port);
                    (RouteKey { tap, ip, masked }, target)
                })
                .collect()
        })
    }

    proptest::proptest! {
        #[test]
        fn any_sequence_of_tables_converges_by_updates(
            tables in proptest::collection::vec(arbitrary_routes(), 1..6)
        ) {
            let mut dp = Dataplane::new(MemoryFirewall::new(), params());
            for routes in &tables {
                dp.converge(routes.clone()).unwrap();
                proptest::prop_assert_eq!(&dp.firewall().table().unwrap().routes, routes);
            }
            // The first table was a replace; every later one applied as one element update.
            let changed = 1 + tables.windows(2).filter(|w| w[0] != w[1]).count() as u64;
            proptest::prop_assert_eq!(dp.firewall().transactions(), changed);
        }
    }
}
