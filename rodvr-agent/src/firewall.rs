//! Where rendered transactions go: the kernel (`nft`) or an in-memory model of the same table.
//!
//! [`Firewall`] is the one side effect of the data plane. [`NftFirewall`] sends the rendered JSON
//! through `nft -j -f -` (one kernel transaction). [`MemoryFirewall`] applies the same
//! [`Transaction`]s to an in-memory table with the kernel's all-or-nothing semantics and its
//! element rules (deleting a missing element fails), and answers where a VM's connection would
//! be sent; `gsaasd` runs it as its default host backend and tests use it without root.
//!
//! [`Dataplane`] decides *how* to reach a desired route set: an element diff against what it last
//! installed, or a full table replace when nothing is known to be installed or the diff fails
//! (for instance because someone deleted the table behind the agent's back).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::render::{resolve, targets, RouteKey, RouteMap, TableParams, Transaction};

/// Why a transaction did not apply. Nothing of it was applied.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("nft rejected or failed the transaction")]
    Nft(#[source] nftables::helper::NftablesError),
    #[error("the agent's table does not exist")]
    NoTable,
    #[error("element {0} does not exist")]
    MissingElement(String),
    #[error("element {0} already exists with different data")]
    ConflictingElement(String),
    #[error("element {0} jumps to a target chain that does not exist")]
    MissingChain(String),
}

/// Applies one transaction atomically.
pub trait Firewall: Send + fmt::Debug {
    fn apply(&mut self, tx: &Transaction) -> Result<(), FirewallError>;
}

/// The kernel, through the `nft` program (optionally wrapped, e.g. `ip netns exec NS nft`).
#[derive(Debug, Clone)]
pub struct NftFirewall {
    program: OsString,
    args: Vec<OsString>,
}

impl NftFirewall {
    /// `command` is the program and its leading arguments; `-j -f -` is appended.
    pub fn new(command: &[String]) -> Self {
        let (program, args) =
            command.split_first().map_or(("nft", &[][..]), |(p, a)| (p.as_str(), a));
        Self { program: program.into(), args: args.iter().map(OsString::from).collect() }
    }
}

impl Default for NftFirewall {
    fn default() -> Self {
        Self::new(&[])
    }
}

impl Firewall for NftFirewall {
    fn apply(&mut self, tx: &Transaction) -> Result<(), FirewallError> {
        let doc = tx.to_nft_string();
        nftables::helper::apply_ruleset_raw(&doc, Some(&self.program), &self.args)
            .map(drop)
            .map_err(FirewallError::Nft)
    }
}

/// The agent's table as the memory firewall holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryTable {
    pub params: TableParams,
    pub routes: RouteMap,
    /// rCUDA endpoints that have a target chain.
    pub chains: BTreeSet<SocketAddrV4>,
}

/// An in-memory firewall holding the same table the kernel would.
#[derive(Debug, Clone, Default)]
pub struct MemoryFirewall {
    table: Option<MemoryTable>,
    transactions: u64,
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

fn describe(key: &RouteKey) -> String {
    format!("{:?} -> {}", key.source, key.masked)
}

impl Firewall for MemoryFirewall {
    fn apply(&mut self, tx: &Transaction) -> Result<(), FirewallError> {
        match tx {
            Transaction::Replace { params, routes } => {
                let chains = targets(routes);
                self.table =
                    Some(MemoryTable { params: params.clone(), routes: routes.clone(), chains });
            }
            Transaction::Update { new_targets, delete, add } => {
                let table = self.table.as_ref().ok_or(FirewallError::NoTable)?;
                let mut routes = table.routes.clone();
                let mut chains = table.chains.clone();
                chains.extend(new_targets.iter().copied());
                for key in delete {
                    routes
                        .remove(key)
                        .ok_or_else(|| FirewallError::MissingElement(describe(key)))?;
                }
                for (key, target) in add {
                    if !chains.contains(target) {
                        return Err(FirewallError::MissingChain(describe(key)));
                    }
                    if let Some(old) = routes.insert(key.clone(), *target) {
                        if old != *target {
                            return Err(FirewallError::ConflictingElement(describe(key)));
                        }
                    }
                }
                let table = self.table.as_mut().ok_or(FirewallError::NoTable)?;
                table.routes = routes;
                table.chains = chains;
            }
        }
        self.transactions += 1;
        Ok(())
    }
}

impl<F: Firewall + ?Sized> Firewall for Box<F> {
    fn apply(&mut self, tx: &Transaction) -> Result<(), FirewallError> {
        (**self).apply(tx)
    }
}

/// Drives a [`Firewall`] towards a desired route set, as cheaply as it safely can.
#[derive(Debug)]
pub struct Dataplane<F> {
    firewall: F,
    params: TableParams,
    installed: Option<Installed>,
}

/// What the dataplane knows is in the firewall.
#[derive(Debug)]
struct Installed {
    routes: RouteMap,
    chains: BTreeSet<SocketAddrV4>,
}

impl<F: Firewall> Dataplane<F> {
    pub fn new(firewall: F, params: TableParams) -> Self {
        Self { firewall, params, installed: None }
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
    pub fn converge(&mut self, routes: RouteMap) -> Result<(), FirewallError> {
        if let Some(installed) = &mut self.installed {
            let tx = Transaction::diff(&installed.routes, &installed.chains, &routes);
            if tx.is_noop() || self.firewall.apply(&tx).is_ok() {
                if let Transaction::Update { new_targets, .. } = tx {
                    installed.chains.extend(new_targets);
                }
                installed.routes = routes;
                return Ok(());
            }
        }
        self.replace(routes)
    }

    /// Rebuilds the whole table, whatever is installed.
    pub fn replace(&mut self, routes: RouteMap) -> Result<(), FirewallError> {
        self.installed = None;
        let tx = Transaction::Replace { params: self.params.clone(), routes };
        self.firewall.apply(&tx)?;
        let Transaction::Replace { routes, .. } = tx else { unreachable!("built above") };
        self.installed = Some(Installed { chains: targets(&routes), routes });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::VmSource;

    fn params() -> TableParams {
        TableParams {
            masked_range: "100.127.0.0/16".parse().unwrap(),
            gpu_interface: "gpu0".into(),
            local_rcuda: vec![],
        }
    }

    fn routes(n: u8) -> RouteMap {
        (0..n)
            .map(|i| {
                let key = RouteKey {
                    source: VmSource::Ip(Ipv4Addr::new(10, 77, 0, i)),
                    masked: SocketAddrV4::new(Ipv4Addr::new(100, 127, 0, 1), 9000),
                };
                (key, SocketAddrV4::new(Ipv4Addr::new(10, 78, 0, 2), 8300 + u16::from(i)))
            })
            .collect()
    }

    #[test]
    fn memory_updates_are_all_or_nothing() {
        let mut fw = MemoryFirewall::new();
        let update = Transaction::diff(&RouteMap::new(), &BTreeSet::new(), &routes(2));
        assert!(matches!(fw.apply(&update), Err(FirewallError::NoTable)));
        fw.apply(&Transaction::Replace { params: params(), routes: routes(1) }).unwrap();
        // The second half of this update is fine, the first deletes an element that is not there.
        let bad = Transaction::Update {
            new_targets: vec![],
            delete: vec![routes(2).into_keys().nth(1).unwrap()],
            add: routes(3).into_iter().skip(2).collect(),
        };
        assert!(matches!(fw.apply(&bad), Err(FirewallError::MissingElement(_))));
        assert_eq!(fw.table().unwrap().routes, routes(1));
        // Like the kernel, a route cannot jump to a chain that was never created.
        let no_chain = Transaction::Update {
            new_targets: vec![],
            delete: vec![],
            add: routes(3).into_iter().skip(2).collect(),
        };
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
            dp.firewall().resolve(src, "tapx", masked),
            Some("10.78.0.2:8304".parse().unwrap())
        );

        dp.firewall_mut().lose_table();
        dp.converge(routes(2)).unwrap();
        assert_eq!(dp.firewall().table().unwrap().routes, routes(2));
        assert_eq!(dp.firewall().resolve(src, "tapx", masked), None);
    }

    fn arbitrary_routes() -> impl proptest::strategy::Strategy<Value = RouteMap> {
        use proptest::prelude::*;
        proptest::collection::btree_map((0u8..12, 0u16..3, any::<bool>()), 0u16..4, 0..16).prop_map(
            |m| {
                m.into_iter()
                    .map(|((vm, masked_port, by_tap), target_port)| {
                        let source = if by_tap {
                            VmSource::Tap(format!("tap{vm}"))
                        } else {
                            VmSource::Ip(Ipv4Addr::new(10, 77, 0, vm))
                        };
                        let masked =
                            SocketAddrV4::new(Ipv4Addr::new(100, 127, 0, 1), 9000 + masked_port);
                        let target =
                            SocketAddrV4::new(Ipv4Addr::new(10, 78, 0, 2), 8308 + target_port);
                        (RouteKey { source, masked }, target)
                    })
                    .collect()
            },
        )
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
