//! Route table -> nftables transaction, as pure functions.
//!
//! Everything the agent does to the kernel is one `nft -j` document, and one document is one
//! kernel transaction: it applies entirely or not at all. Two shapes exist:
//!
//! * [`Transaction::Replace`] rebuilds the agent's own table (`table ip rodvr`) from scratch with
//!   the add/delete/add idiom, so it works whether or not the table exists and never touches
//!   another table;
//! * [`Transaction::Update`] only deletes and adds map elements (and adds a target the first time
//!   it appears), so a change of a few routes costs the same at 10 routes as at 10,000.
//!
//! Each route is **one** element of a data map keyed on (VM tap, VM address, masked address, masked
//! port) whose value is the id of the route's real rCUDA endpoint (its *target*). Both the tap the
//! packet arrived on and its source address must be the VM's: a VM that takes another VM's address
//! still arrives on its own tap, and matches none of the other VM's routes. A map with the
//! textbook concatenated `ipv4_addr . inet_service` value is not possible: nft 1.0.6 (Debian 12)
//! cannot declare it in JSON (it silently creates a set, and a rule using it crashes nft). So the
//! first packet of a connection takes two hash lookups in the NAT prerouting chain: the route map
//! gives the target id, carried in the packet mark to a small verdict map (one element per
//! target) that jumps to the target's chain, which puts the mark back and DNATs. A JSON rule
//! cannot feed a map's value straight into a verdict map, hence the carrier:
//!
//! * the packet mark when it is 0 (the usual case), reset to 0 by the target chain;
//! * otherwise the conntrack mark when it is 0, reset to 0 by the target's `_ct` chain;
//! * otherwise (another ruleset marked both before DNAT) the connection is not rerouted and the
//!   forward filter drops it: it fails closed, and no mark is ever left changed.
//!
//! Conntrack keeps an open connection going after its route is removed or re-targeted, so the
//! forward and input filters also look up, per packet, a masked connection's original tuple in
//! the route map: no route, and the packet is dropped; a route whose target id is not the one
//! the connection was sent to (the id and the connection's reply source checked against a set
//! of one element per target, `live_targets`), and it is reset. A re-target so needs no
//! conntrack dump before it counts (the agent cuts the old entries after answering). That is why
//! the routes are a data map and not a verdict map: the kernel refuses a lookup from a filter
//! chain into a verdict map whose target chains DNAT, and two elements per route (a verdict map
//! plus a key set) doubled what nft parses for a full table.
//!
//! Targets (their chains and verdict-map elements) are never deleted by an update; an unused one
//! is unreachable and disappears with the next full replace.
//!
//! IPv6 gets no routes (masked endpoints are IPv4), only filters, in a `table ip6 rodvr` replaced
//! in the same transaction: nothing a VM sends over IPv6 is forwarded into the GPU network, and on
//! a compute-GPU host VMs cannot reach the local rCUDA servers' ports over IPv6 either. `ct original ip daddr` matches use
//! the `"ip daddr"` key form, which nft 1.0.6 byte-orders correctly. Table and chain objects and
//! rules are JSON values, and map elements are
//! written straight into the document string (building a `serde_json::Value` per element made
//! rendering 10,000 routes cost as much as nft's own work).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use serde_json::{json, Value};

use rodvr_contract::protocol::{Ipv4Cidr, RouteTable};

/// The agent's tables: `ip rodvr` (routes and IPv4 filters) and `ip6 rodvr` (IPv6 filters).
pub const TABLE: &str = "rodvr";
/// The route map: (VM tap, VM address, masked address, masked port) -> target id.
pub const MAP_ROUTES: &str = "routes";
/// Target id -> `goto` the target's chain, with the packet mark (resp. conntrack mark) as carrier.
pub const MAP_TARGETS: &str = "targets";
pub const MAP_TARGETS_CT: &str = "targets_ct";
pub const SET_LOCAL_RCUDA: &str = "local_rcuda";
/// (target id, target address, target port): what each id DNATs to, for the filters' check that
/// an open connection still goes where its route does.
pub const SET_LIVE_TARGETS: &str = "live_targets";

/// Host facts the table depends on besides the routes; fixed for the life of an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableParams {
    /// Addresses VMs use for their cGPUs; traffic to them never leaves unmasked.
    pub masked_range: Ipv4Cidr,
    /// Interface on the GPU network: masqueraded, and closed to VM traffic that is not a route.
    pub gpu_interface: String,
    /// This host's own rCUDA servers (compute-GPU hosts); VMs reach them only through a route.
    pub local_rcuda: Vec<SocketAddrV4>,
    /// The address and ports of the cGPU servers this host runs itself (`[gpu_servers]
    /// managed`): VMs reach them only through a route too.
    pub local_servers: Option<LocalServers>,
    /// Where the agent serves VMs their rCUDA environment (see the agent's `metadata` module):
    /// each VM of a table that names a metadata endpoint gets a route from it to here, and reaches
    /// it no other way.
    pub metadata_listener: Option<SocketAddrV4>,
    /// Where the agent's own API (and `/metrics`) listens: the host's management address. A
    /// packet to it that arrives on an interface other than the one holding that address (a VM's
    /// tap, through the VM's gateway) is dropped.
    pub agent_api: Option<SocketAddr>,
}

/// Where a host's managed cGPU servers listen: one address, a range of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalServers {
    pub address: Ipv4Addr,
    pub first_port: u16,
    pub last_port: u16,
}

impl LocalServers {
    fn ports(&self) -> Value {
        json!({"range": [self.first_port, self.last_port]})
    }
}

impl TableParams {
    /// This host's endpoints that VMs reach only through a route: its rCUDA servers and the
    /// metadata listener.
    fn local_endpoints(&self) -> impl Iterator<Item = SocketAddrV4> + '_ {
        self.local_rcuda.iter().copied().chain(self.metadata_listener)
    }
}

/// The table that keeps a managed host's cGPU servers to their own clients (see
/// [`ServerFilter`]); replaced whole, apart from `table ip rodvr`.
pub const SERVERS_TABLE: &str = "rodvr_servers";
/// (client address, server port) pairs allowed to reach a server from off the host.
pub const SET_SERVER_CLIENTS: &str = "clients";

/// Who may reach each cGPU server a host runs from off the host: its VM's host (whose agent
/// masquerades the VM's traffic behind its GPU-network address), on that server's port only.
/// Anything else from the GPU network to the servers' range is dropped: a host that knows a
/// server's port, or one of another cGPU, reaches nothing. The host's own VMs reach their
/// servers through their routes (the DNAT leaves their connections' original destination
/// masked), and the agent's own readiness probes come over loopback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFilter {
    pub masked_range: Ipv4Cidr,
    pub servers: LocalServers,
    pub allowed: BTreeSet<(Ipv4Addr, u16)>,
}

impl ServerFilter {
    /// The `nft -j` document that replaces `table ip rodvr_servers` (one kernel transaction).
    pub fn to_nft_string(&self) -> String {
        let servers = self.servers;
        let table = |verb: &str| json!({ verb: {"table": {"family": "ip", "name": SERVERS_TABLE}}});
        let rule = |expr: Vec<Value>| {
            json!({"add": {"rule": {"family": "ip", "table": SERVERS_TABLE, "chain": "input",
                "expr": expr}}})
        };
        let mut cmds = vec![
            table("add"),
            table("delete"),
            table("add"),
            json!({"add": {"set": {"family": "ip", "table": SERVERS_TABLE,
                "name": SET_SERVER_CLIENTS, "type": ["ipv4_addr", "inet_service"]}}}),
            json!({"add": {"chain": {"family": "ip", "table": SERVERS_TABLE, "name": "input",
                "type": "filter", "hook": "input", "prio": -5, "policy": "accept"}}}),
            rule(vec![
                matches("!=", meta("iifname"), json!("lo")),
                matches("==", payload("ip", "daddr"), json!(servers.address.to_string())),
                matches("==", payload("tcp", "dport"), servers.ports()),
                matches("!=", ct_original_daddr(), range(self.masked_range)),
                matches(
                    "!=",
                    json!({"concat": [payload("ip", "saddr"), payload("tcp", "dport")]}),
                    json!(format!("@{SET_SERVER_CLIENTS}")),
                ),
                json!({"drop": null}),
            ]),
        ];
        if !self.allowed.is_empty() {
            let elems: Vec<Value> = self
                .allowed
                .iter()
                .map(|(client, port)| json!({"concat": [client.to_string(), port]}))
                .collect();
            cmds.push(json!({"add": {"element": {"family": "ip", "table": SERVERS_TABLE,
                "name": SET_SERVER_CLIENTS, "elem": elems}}}));
        }
        json!({ "nftables": cmds }).to_string()
    }
}

/// The key of one route-map element.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteKey {
    /// The VM's tap: packets must arrive on it.
    pub tap: String,
    /// The VM's address: packets must come from it.
    pub ip: Ipv4Addr,
    pub masked: SocketAddrV4,
}

/// The data plane's view of a route table: key -> real rCUDA endpoint.
pub type RouteMap = BTreeMap<RouteKey, SocketAddrV4>;

/// Reduces a validated table to map elements: its routes, and with `listener` (the agent's
/// metadata listener, when the table names a metadata endpoint) one more per VM, those without
/// cGPUs too, from the endpoint to the listener.
pub fn route_map(table: &RouteTable, listener: Option<SocketAddrV4>) -> RouteMap {
    let mut map: RouteMap = table
        .routes
        .iter()
        .map(|r| (RouteKey { tap: r.vm_tap.clone(), ip: r.vm_ip, masked: r.masked }, r.target))
        .collect();
    if let Some((masked, listener)) = table.metadata.zip(listener) {
        let routed = table.routes.iter().map(|r| (&r.vm_tap, r.vm_ip));
        let idle = table.vms_without_cgpus.iter().map(|p| (&p.vm_tap, p.vm_ip));
        for (tap, ip) in routed.chain(idle) {
            map.insert(RouteKey { tap: tap.clone(), ip, masked }, listener);
        }
    }
    map
}

/// The rCUDA endpoints of `routes`, each of which needs a target chain.
pub fn targets(routes: &RouteMap) -> BTreeSet<SocketAddrV4> {
    routes.values().copied().collect()
}

/// Target -> the id route-map elements carry (never 0: 0 is "no mark").
pub type TargetIds = BTreeMap<SocketAddrV4, u32>;

/// The ids a full replace gives the targets of `routes`: 1, 2, ... in address order.
pub fn target_ids(routes: &RouteMap) -> TargetIds {
    targets(routes).into_iter().zip(1..).collect()
}

/// A target as installed: its endpoint and the id route elements use for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    pub addr: SocketAddrV4,
    pub id: u32,
}

/// The chain that DNATs to `target` after a lookup carried in the packet mark.
pub fn target_chain(target: SocketAddrV4) -> String {
    format!("to_{}_{}", target.ip(), target.port())
}

/// The chain that DNATs to `target` after a lookup carried in the conntrack mark.
pub fn target_chain_ct(target: SocketAddrV4) -> String {
    format!("to_{}_{}_ct", target.ip(), target.port())
}

/// One kernel transaction on the agent's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transaction {
    /// Replace the whole table with these parameters and routes.
    Replace { params: TableParams, routes: RouteMap },
    /// Create new targets, then delete and add route-map elements in the existing table.
    Update { new_targets: Vec<Target>, delete: Vec<RouteKey>, add: Vec<(RouteKey, Target)> },
}

impl Transaction {
    /// The changes from `old` (with the targets `installed` in place) to `new`; a changed target
    /// is a delete plus an add. A target not in `installed` gets the next free id; `None` when
    /// ids ran out (only a full replace, which renumbers, can go on).
    pub fn diff(old: &RouteMap, installed: &TargetIds, new: &RouteMap) -> Option<Self> {
        // Both maps are sorted by key: one merge pass, no lookups (this runs on every table push,
        // so it must stay cheap at 10,000 routes).
        let (mut delete, mut add) = (Vec::new(), Vec::new());
        let (mut old_it, mut new_it) = (old.iter().peekable(), new.iter().peekable());
        loop {
            match (old_it.peek(), new_it.peek()) {
                (Some((ko, vo)), Some((kn, vn))) => match ko.cmp(kn) {
                    std::cmp::Ordering::Less => {
                        delete.push((*ko).clone());
                        old_it.next();
                    }
                    std::cmp::Ordering::Greater => {
                        add.push(((*kn).clone(), **vn));
                        new_it.next();
                    }
                    std::cmp::Ordering::Equal => {
                        if vo != vn {
                            delete.push((*ko).clone());
                            add.push(((*kn).clone(), **vn));
                        }
                        old_it.next();
                        new_it.next();
                    }
                },
                (Some((ko, _)), None) => {
                    delete.push((*ko).clone());
                    old_it.next();
                }
                (None, Some((kn, vn))) => {
                    add.push(((*kn).clone(), **vn));
                    new_it.next();
                }
                (None, None) => break,
            }
        }
        let mut next = installed.values().max().map_or(Some(1), |id| id.checked_add(1));
        let mut new_targets: BTreeMap<SocketAddrV4, u32> = BTreeMap::new();
        let mut id_of = |addr: SocketAddrV4| -> Option<Target> {
            if let Some(&id) = installed.get(&addr).or_else(|| new_targets.get(&addr)) {
                return Some(Target { addr, id });
            }
            let id = next?;
            next = id.checked_add(1);
            new_targets.insert(addr, id);
            Some(Target { addr, id })
        };
        let add = add
            .into_iter()
            .map(|(key, addr)| Some((key, id_of(addr)?)))
            .collect::<Option<Vec<_>>>()?;
        let mut new_targets: Vec<Target> =
            new_targets.into_iter().map(|(addr, id)| Target { addr, id }).collect();
        new_targets.sort_by_key(|t| t.id);
        Some(Self::Update { new_targets, delete, add })
    }

    pub fn is_noop(&self) -> bool {
        matches!(self, Self::Update { new_targets, delete, add }
            if new_targets.is_empty() && delete.is_empty() && add.is_empty())
    }

    /// The `nft -j -f -` document for this transaction.
    pub fn to_nft_string(&self) -> String {
        let mut out = String::from(r#"{"nftables":["#);
        let push = |out: &mut String, cmd: Value| {
            out.push_str(&cmd.to_string());
            out.push(',');
        };
        match self {
            Self::Replace { params, routes } => {
                for cmd in skeleton_commands(params) {
                    push(&mut out, cmd);
                }
                let ids = target_ids(routes);
                let targets: Vec<Target> =
                    ids.iter().map(|(&addr, &id)| Target { addr, id }).collect();
                write_target_commands(&mut out, &targets, push);
                let adds = routes.iter().map(|(k, v)| (k, ids[v]));
                write_element_commands(&mut out, std::iter::empty(), adds);
            }
            Self::Update { new_targets, delete, add } => {
                write_target_commands(&mut out, new_targets, push);
                write_element_commands(&mut out, delete.iter(), add.iter().map(|(k, t)| (k, t.id)));
            }
        }
        if out.ends_with(',') {
            out.pop();
        }
        out.push_str("]}");
        out
    }

    /// The same document as a JSON value (for inspection and tests).
    pub fn to_nft_json(&self) -> Value {
        serde_json::from_str(&self.to_nft_string()).expect("the renderer writes valid JSON")
    }
}

/// `{"add"|"delete": {"table": {"family": .., "name": "rodvr"}}}`.
fn table_command(verb: &str, family: &str) -> Value {
    json!({ verb: {"table": {"family": family, "name": TABLE}}})
}

fn base_chain(name: &str, kind: &str, hook: &str, prio: i32) -> Value {
    base_chain_in("ip", name, kind, hook, prio)
}

/// A base chain (attached to `hook`) whose policy is accept.
fn base_chain_in(family: &str, name: &str, kind: &str, hook: &str, prio: i32) -> Value {
    json!({"add": {"chain": {"family": family, "table": TABLE, "name": name, "type": kind,
        "hook": hook, "prio": prio, "policy": "accept"}}})
}

/// A JSON object built by moving `pairs` in (`json!` would clone interpolated values).
fn obj<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

fn rule(chain: &str, expr: Vec<Value>) -> Value {
    rule_in("ip", chain, expr)
}

fn rule_in(family: &str, chain: &str, expr: Vec<Value>) -> Value {
    let rule = obj([
        ("family", family.into()),
        ("table", TABLE.into()),
        ("chain", chain.into()),
        ("expr", Value::Array(expr)),
    ]);
    obj([("add", obj([("rule", rule)]))])
}

fn payload(protocol: &str, field: &str) -> Value {
    json!({"payload": {"protocol": protocol, "field": field}})
}

fn meta(key: &str) -> Value {
    json!({"meta": {"key": key}})
}

fn matches(op: &str, left: Value, right: Value) -> Value {
    obj([("match", obj([("op", op.into()), ("left", left), ("right", right)]))])
}

fn range(cidr: Ipv4Cidr) -> Value {
    json!({"range": [cidr.network().to_string(), cidr.last().to_string()]})
}

fn ct_original_daddr() -> Value {
    json!({"ct": {"key": "ip daddr", "dir": "original"}})
}

fn mark(carrier: Carrier) -> Value {
    match carrier {
        Carrier::Packet => meta("mark"),
        Carrier::Conntrack => json!({"ct": {"key": "mark"}}),
    }
}

/// Which mark carries a target id from the route map to the target verdict map.
#[derive(Debug, Clone, Copy)]
enum Carrier {
    Packet,
    Conntrack,
}

/// If `carrier` is 0 and the packet's key (tap, source, masked address and port) is a route:
/// carrier = target id, then jump to the target's chain (which resets the carrier to 0 and DNATs).
/// A lookup miss ends the rule before anything is written, so the next rule (or the forward
/// filter) decides.
fn dispatch_via(masked: Ipv4Cidr, carrier: Carrier) -> Value {
    let key = obj([(
        "concat",
        Value::Array(vec![
            meta("iifname"),
            payload("ip", "saddr"),
            payload("ip", "daddr"),
            payload("tcp", "dport"),
        ]),
    )]);
    let lookup = obj([("map", obj([("key", key), ("data", format!("@{MAP_ROUTES}").into())]))]);
    let set_carrier = obj([("mangle", obj([("key", mark(carrier)), ("value", lookup)]))]);
    let targets = match carrier {
        Carrier::Packet => MAP_TARGETS,
        Carrier::Conntrack => MAP_TARGETS_CT,
    };
    let vmap =
        obj([("vmap", obj([("key", mark(carrier)), ("data", format!("@{targets}").into())]))]);
    rule(
        "prerouting",
        vec![
            matches("==", payload("ip", "daddr"), range(masked)),
            matches("==", mark(carrier), 0.into()),
            set_carrier,
            vmap,
        ],
    )
}

/// A regular chain holding the one DNAT rule to `target`, which first puts `carrier` back to 0.
fn target_chain_commands(target: SocketAddrV4, carrier: Carrier) -> [Value; 2] {
    let name = match carrier {
        Carrier::Packet => target_chain(target),
        Carrier::Conntrack => target_chain_ct(target),
    };
    let chain = json!({"add": {"chain": {"family": "ip", "table": TABLE, "name": name}}});
    let reset = obj([("mangle", obj([("key", mark(carrier)), ("value", 0.into())]))]);
    let dnat = obj([(
        "dnat",
        obj([
            ("family", "ip".into()),
            ("addr", target.ip().to_string().into()),
            ("port", target.port().into()),
        ]),
    )]);
    let rule = rule(&name, vec![reset, matches("==", meta("l4proto"), "tcp".into()), dnat]);
    [chain, rule]
}

/// Chains, target verdict-map elements and live-target elements for `targets` (appended with a
/// trailing comma each).
fn write_target_commands(out: &mut String, targets: &[Target], push: impl Fn(&mut String, Value)) {
    for target in targets {
        for carrier in [Carrier::Packet, Carrier::Conntrack] {
            for cmd in target_chain_commands(target.addr, carrier) {
                push(out, cmd);
            }
        }
    }
    for (map, chain) in [
        (MAP_TARGETS, target_chain as fn(SocketAddrV4) -> String),
        (MAP_TARGETS_CT, target_chain_ct),
    ] {
        write_element_command(out, "add", map, targets, |o, t| {
            write!(o, r#"[{},{{"goto":{{"target":"{}"}}}}]"#, t.id, chain(t.addr))
                .expect("writing to a String cannot fail");
        });
    }
    write_element_command(out, "add", SET_LIVE_TARGETS, targets, |o, t| {
        write!(o, r#"{{"concat":[{},"{}",{}]}}"#, t.id, t.addr.ip(), t.addr.port())
            .expect("writing to a String cannot fail");
    });
}

/// Conntrack keeps a DNATed connection going after its route is removed or re-targeted; these
/// rules hold the VM-to-GPU direction of each masked connection to its route as it is now. Its
/// original tuple is looked up in the route map: no route, and the packet is dropped; a route
/// whose target id is not the one the connection was sent to (its reply source, checked against
/// [`SET_LIVE_TARGETS`]), and the connection is reset. So removing or re-targeting a route ends
/// the connections already open at their next packet, with no conntrack dump (see the agent's
/// connection cuts, which only tidy up after). The looked-up id is carried in the packet mark
/// when it is 0, else the conntrack mark when it is 0, each put back to 0 (as the DNAT's carrier);
/// where another ruleset marked both, only the route's presence is checked here and the cut
/// that follows the table ends a re-targeted connection.
fn still_routed_rules(chain: &str, masked: Ipv4Cidr) -> Vec<Value> {
    let ct = |key: &str| json!({"ct": {"key": key, "dir": "original"}});
    let masked_tcp = vec![
        matches("==", json!({"ct": {"key": "direction"}}), "original".into()),
        matches("==", ct_original_daddr(), range(masked)),
        // Gives `ct original proto-dst` its type (inet_service) for the lookups below.
        matches("==", meta("l4proto"), "tcp".into()),
    ];
    let key = json!({"concat": [meta("iifname"), ct("ip saddr"), ct("ip daddr"), ct("proto-dst")]});
    let lookup =
        obj([("map", obj([("key", key.clone()), ("data", format!("@{MAP_ROUTES}").into())]))]);
    let mut rules: Vec<Value> = [Carrier::Packet, Carrier::Conntrack]
        .into_iter()
        .map(|carrier| {
            let mut expr = masked_tcp.clone();
            if let Carrier::Conntrack = carrier {
                expr.push(matches("!=", meta("mark"), 0.into()));
            }
            expr.push(matches("==", mark(carrier), 0.into()));
            expr.push(obj([("mangle", obj([("key", mark(carrier)), ("value", lookup.clone())]))]));
            expr.push(json!({"jump": {"target": current_target_chain(carrier)}}));
            rule(chain, expr)
        })
        .collect();
    let mut routed = masked_tcp.clone();
    routed.push(matches("==", key, format!("@{MAP_ROUTES}").into()));
    routed.push(json!({"accept": null}));
    let mut gone = masked_tcp;
    gone.push(json!({"drop": null}));
    rules.extend([rule(chain, routed), rule(chain, gone)]);
    rules
}

/// The chain that checks a masked connection's target against its route's, the route's id in
/// `carrier` (see [`still_routed_rules`]).
fn current_target_chain(carrier: Carrier) -> &'static str {
    match carrier {
        Carrier::Packet => "current_target",
        Carrier::Conntrack => "current_target_ct",
    }
}

/// [`current_target_chain`] and its two rules: the carrier back to 0 either way; accepted where
/// (id, reply source) is a live target, else reset.
fn current_target_commands(carrier: Carrier) -> [Value; 3] {
    let name = current_target_chain(carrier);
    let chain = json!({"add": {"chain": {"family": "ip", "table": TABLE, "name": name}}});
    let reply = |key: &str| json!({"ct": {"key": key, "dir": "reply"}});
    let sent_to = json!({"concat": [mark(carrier), reply("ip saddr"), reply("proto-src")]});
    let reset = obj([("mangle", obj([("key", mark(carrier)), ("value", 0.into())]))]);
    let tcp = matches("==", meta("l4proto"), "tcp".into());
    let current = rule(
        name,
        vec![
            tcp.clone(),
            matches("==", sent_to, format!("@{SET_LIVE_TARGETS}").into()),
            reset.clone(),
            json!({"accept": null}),
        ],
    );
    let stale = rule(name, vec![tcp, reset, json!({"reject": {"type": "tcp reset"}})]);
    [chain, current, stale]
}

fn skeleton_commands(params: &TableParams) -> Vec<Value> {
    let masked = params.masked_range;
    let gpu_if = params.gpu_interface.as_str();
    let map = |name: &str, key: Value, data: &str| json!({"add": {"map": {"family": "ip", "table": TABLE, "name": name, "type": key, "map": data}}});
    let mut cmds = vec![
        table_command("add", "ip"),
        table_command("delete", "ip"),
        table_command("add", "ip"),
        map(MAP_ROUTES, json!(["ifname", "ipv4_addr", "ipv4_addr", "inet_service"]), "mark"),
        map(MAP_TARGETS, json!("mark"), "verdict"),
        map(MAP_TARGETS_CT, json!("mark"), "verdict"),
        json!({"add": {"set": {"family": "ip", "table": TABLE, "name": SET_LOCAL_RCUDA,
            "type": ["ipv4_addr", "inet_service"]}}}),
        json!({"add": {"set": {"family": "ip", "table": TABLE, "name": SET_LIVE_TARGETS,
            "type": ["mark", "ipv4_addr", "inet_service"]}}}),
        base_chain("prerouting", "nat", "prerouting", -100),
        // A VM's packet to a masked endpoint jumps to its route's target chain, which rewrites it
        // to the real rCUDA endpoint.
        dispatch_via(masked, Carrier::Packet),
        dispatch_via(masked, Carrier::Conntrack),
        base_chain("postrouting", "nat", "postrouting", 100),
        // The GPU server sees the compute host, never the VM.
        rule(
            "postrouting",
            vec![
                matches("==", meta("oifname"), json!(gpu_if)),
                matches("==", ct_original_daddr(), range(masked)),
                json!({"masquerade": null}),
            ],
        ),
    ];
    for carrier in [Carrier::Packet, Carrier::Conntrack] {
        cmds.extend(current_target_commands(carrier));
    }
    cmds.extend([
        base_chain("forward", "filter", "forward", 0),
        // A masked address that was not rewritten has no route for this VM.
        rule(
            "forward",
            vec![matches("==", payload("ip", "daddr"), range(masked)), json!({"drop": null})],
        ),
    ]);
    cmds.extend(still_routed_rules("forward", masked));
    cmds.extend([
        // Nothing is forwarded into the GPU network unless it is a masked route.
        rule(
            "forward",
            vec![
                matches("!=", meta("iifname"), json!(gpu_if)),
                matches("==", meta("oifname"), json!(gpu_if)),
                matches("!=", ct_original_daddr(), range(masked)),
                json!({"drop": null}),
            ],
        ),
        base_chain("input", "filter", "input", 0),
    ]);
    cmds.extend(still_routed_rules("input", masked));
    cmds.extend([
        // On a compute-GPU host, local VMs reach the local rCUDA servers only through a route.
        rule(
            "input",
            vec![
                matches("!=", meta("iifname"), json!({"set": ["lo", gpu_if]})),
                matches(
                    "==",
                    json!({"concat": [payload("ip", "daddr"), payload("tcp", "dport")]}),
                    json!(format!("@{SET_LOCAL_RCUDA}")),
                ),
                matches("!=", ct_original_daddr(), range(masked)),
                json!({"drop": null}),
            ],
        ),
    ]);
    if let Some(servers) = params.local_servers {
        // The same for the cGPU servers the agent runs: one per cGPU, each on a port of the range.
        cmds.push(rule(
            "input",
            vec![
                matches("!=", meta("iifname"), json!({"set": ["lo", gpu_if]})),
                matches("==", payload("ip", "daddr"), json!(servers.address.to_string())),
                matches("==", payload("tcp", "dport"), servers.ports()),
                matches("!=", ct_original_daddr(), range(masked)),
                json!({"drop": null}),
            ],
        ));
    }
    if let Some(api) = params.agent_api.filter(SocketAddr::is_ipv4) {
        cmds.push(agent_api_guard(api));
    }
    let local: Vec<SocketAddrV4> = params.local_endpoints().collect();
    if !local.is_empty() {
        let elems: Vec<Value> =
            local.iter().map(|e| json!({"concat": [e.ip().to_string(), e.port()]})).collect();
        cmds.push(json!({"add": {"element": {"family": "ip", "table": TABLE,
            "name": SET_LOCAL_RCUDA, "elem": elems}}}));
    }
    cmds.extend(ipv6_commands(params));
    cmds
}

/// `table ip6 rodvr`: VMs get no masked routes over IPv6, so nothing of theirs over IPv6 may reach
/// the GPU network, nor (on a compute-GPU host) the local rCUDA servers' ports, whatever addresses
/// those servers also listen on.
fn ipv6_commands(params: &TableParams) -> Vec<Value> {
    let gpu_if = params.gpu_interface.as_str();
    let mut cmds = vec![
        table_command("add", "ip6"),
        table_command("delete", "ip6"),
        table_command("add", "ip6"),
        base_chain_in("ip6", "forward", "filter", "forward", 0),
        rule_in(
            "ip6",
            "forward",
            vec![
                matches("!=", meta("iifname"), json!(gpu_if)),
                matches("==", meta("oifname"), json!(gpu_if)),
                json!({"drop": null}),
            ],
        ),
        base_chain_in("ip6", "input", "filter", "input", 0),
    ];
    if let Some(api) = params.agent_api.filter(SocketAddr::is_ipv6) {
        cmds.push(agent_api_guard(api));
    }
    if let Some(servers) = params.local_servers {
        cmds.push(rule_in(
            "ip6",
            "input",
            vec![
                matches("!=", meta("iifname"), json!({"set": ["lo", gpu_if]})),
                matches("==", payload("tcp", "dport"), servers.ports()),
                json!({"drop": null}),
            ],
        ));
    }
    let mut ports: Vec<u16> = params.local_endpoints().map(|e| e.port()).collect();
    ports.sort_unstable();
    ports.dedup();
    if !ports.is_empty() {
        cmds.push(rule_in(
            "ip6",
            "input",
            vec![
                matches("!=", meta("iifname"), json!({"set": ["lo", gpu_if]})),
                matches("==", payload("tcp", "dport"), json!({"set": ports})),
                json!({"drop": null}),
            ],
        ));
    }
    cmds
}

/// The agent's API answers only on the interface that holds its address: a packet to it from
/// elsewhere but the host itself (a VM's tap: the VM sends it to its gateway, which routes it up
/// to the host) is dropped (`fib daddr . iif type != local`).
fn agent_api_guard(api: SocketAddr) -> Value {
    let family = if api.is_ipv6() { "ip6" } else { "ip" };
    rule_in(
        family,
        "input",
        vec![
            matches("!=", meta("iifname"), json!("lo")),
            matches("==", payload(family, "daddr"), json!(api.ip().to_string())),
            matches("==", payload("tcp", "dport"), json!(api.port())),
            matches(
                "!=",
                json!({"fib": {"result": "type", "flags": ["daddr", "iif"]}}),
                json!("local"),
            ),
            json!({"drop": null}),
        ],
    )
}

/// Writes `{"concat":["tap","vm ip","masked ip",port]}`.
fn write_key(out: &mut String, key: &RouteKey) {
    write!(
        out,
        r#"{{"concat":[{},"{}","{}",{}]}}"#,
        Value::String(key.tap.clone()),
        key.ip,
        key.masked.ip(),
        key.masked.port()
    )
    .expect("writing to a String cannot fail");
}

/// Writes one `{verb: {element: ...}}` command (and a comma) when `items` is not empty.
fn write_element_command<T>(
    out: &mut String,
    verb: &str,
    map: &str,
    items: &[T],
    write_elem: impl Fn(&mut String, &T),
) {
    if items.is_empty() {
        return;
    }
    write!(
        out,
        r#"{{"{verb}":{{"element":{{"family":"ip","table":"{TABLE}","name":"{map}","elem":["#
    )
    .expect("writing to a String cannot fail");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_elem(out, item);
    }
    out.push_str("]}}},");
}

/// Deletes first, then adds, so a changed target is a delete plus an add in one transaction.
/// `add` gives each route's target id.
fn write_element_commands<'a>(
    out: &mut String,
    delete: impl Iterator<Item = &'a RouteKey>,
    add: impl Iterator<Item = (&'a RouteKey, u32)>,
) {
    let delete: Vec<&RouteKey> = delete.collect();
    let add: Vec<(&RouteKey, u32)> = add.collect();
    write_element_command(out, "delete", MAP_ROUTES, &delete, |o, k| write_key(o, k));
    write_element_command(out, "add", MAP_ROUTES, &add, |o, (k, id)| {
        o.push('[');
        write_key(o, k);
        write!(o, ",{id}]").expect("writing to a String cannot fail");
    });
}

/// Where a VM's connection to `masked` goes under `routes`, as the DNAT rules decide it: the
/// route of the tap it arrived on and the source address it came from; `None` means the forward
/// filter drops it.
pub fn resolve(
    routes: &RouteMap,
    src: Ipv4Addr,
    iif: &str,
    masked: SocketAddrV4,
) -> Option<SocketAddrV4> {
    routes.get(&RouteKey { tap: iif.to_owned(), ip: src, masked }).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a local rCUDA server.
    fn params() -> TableParams {
        TableParams {
            local_rcuda: vec!["10.78.0.1:8308".parse().unwrap()],
            local_servers: None,
            ..crate::fixtures::params()
        }
    }

    /// The route key of the VM at `ip` on tap `tap<last byte of ip>`.
    fn key(ip: &str, masked: &str) -> RouteKey {
        let ip: Ipv4Addr = ip.parse().unwrap();
        RouteKey { tap: format!("tap{}", ip.octets()[3]), ip, masked: masked.parse().unwrap() }
    }

    fn target(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    #[test]
    fn target_ids_run_out_only_into_a_replace() {
        let old = RouteMap::new();
        let mut new = RouteMap::new();
        new.insert(key("10.77.0.2", "100.127.0.1:9000"), target("10.78.0.2:8308"));
        let full: TargetIds = [(target("10.78.0.9:1"), u32::MAX)].into();
        assert_eq!(Transaction::diff(&old, &full, &new), None);
        // A route to a known target needs no new id.
        let known: TargetIds = [(target("10.78.0.2:8308"), u32::MAX)].into();
        assert!(Transaction::diff(&old, &known, &new).is_some());
    }

    #[test]
    fn replace_rebuilds_only_our_table() {
        let mut routes = RouteMap::new();
        routes.insert(key("10.77.0.2", "100.127.0.1:9000"), target("10.78.0.2:8308"));
        routes.insert(key("10.77.0.3", "100.127.0.1:9000"), target("10.78.0.2:8308"));
        let doc = Transaction::Replace { params: params(), routes }.to_nft_json();
        let cmds = doc["nftables"].as_array().unwrap();
        assert_eq!(cmds[0], json!({"add": {"table": {"family": "ip", "name": "rodvr"}}}));
        assert_eq!(cmds[1], json!({"delete": {"table": {"family": "ip", "name": "rodvr"}}}));
        let mut families = BTreeSet::new();
        for cmd in &cmds[2..] {
            let obj = cmd.as_object().unwrap().values().next().unwrap();
            let obj = obj.as_object().unwrap().values().next().unwrap();
            let table = obj.get("table").or_else(|| obj.get("name"));
            assert_eq!(table.unwrap(), "rodvr", "{cmd}");
            families.insert(obj["family"].as_str().unwrap().to_owned());
        }
        assert_eq!(families, ["ip", "ip6"].map(String::from).into(), "our two tables only");
        // IPv6: nothing into the GPU network, and not the local rCUDA ports.
        let rules6: Vec<&Value> =
            cmds.iter().filter(|c| c["add"]["rule"]["family"] == "ip6").collect();
        assert_eq!(rules6.len(), 2, "{rules6:?}");
        assert!(rules6[1].to_string().contains(r#"{"set":[8308]}"#), "{}", rules6[1]);
        for name in ["to_10.78.0.2_8308", "to_10.78.0.2_8308_ct"] {
            let chains = cmds.iter().filter(|c| c["add"]["chain"]["name"] == name);
            assert_eq!(chains.count(), 1, "one chain per target and carrier, not per route");
        }
        let elems = |map: &str| {
            let found = cmds.iter().filter(|c| c["add"]["element"]["name"] == map);
            found.flat_map(|c| c["add"]["element"]["elem"].as_array().unwrap().clone()).collect()
        };
        // One element per route, carrying its target's id.
        let routes: Vec<Value> = elems(MAP_ROUTES);
        assert_eq!(routes.len(), 2);
        let element = |tap: &str, ip: &str| json!([{"concat": [tap, ip, "100.127.0.1", 9000]}, 1]);
        assert_eq!(routes[0], element("tap2", "10.77.0.2"));
        assert_eq!(routes[1], element("tap3", "10.77.0.3"));
        let targets: Vec<Value> = elems(MAP_TARGETS);
        assert_eq!(targets, [json!([1, {"goto": {"target": "to_10.78.0.2_8308"}}])]);
        let targets_ct: Vec<Value> = elems(MAP_TARGETS_CT);
        assert_eq!(targets_ct, [json!([1, {"goto": {"target": "to_10.78.0.2_8308_ct"}}])]);
        // Target chains put their carrier back to 0 before the DNAT.
        let dnat = |chain: &str| {
            cmds.iter().find(|c| c["add"]["rule"]["chain"] == chain).unwrap()["add"]["rule"]["expr"]
                .clone()
        };
        let expr = dnat("to_10.78.0.2_8308");
        assert_eq!(expr[0], json!({"mangle": {"key": {"meta": {"key": "mark"}}, "value": 0}}));
        assert_eq!(expr[2], json!({"dnat": {"family": "ip", "addr": "10.78.0.2", "port": 8308}}));
        let expr = dnat("to_10.78.0.2_8308_ct");
        assert_eq!(expr[0], json!({"mangle": {"key": {"ct": {"key": "mark"}}, "value": 0}}));
        let text = doc.to_string();
        assert!(text.contains(r#"{"concat":["10.78.0.1",8308]}"#), "{text}");
        assert!(text.contains(r#""range":["100.127.0.0","100.127.255.255"]"#), "{text}");
    }

    #[test]
    fn diff_touches_only_changed_elements() {
        let mut old = RouteMap::new();
        old.insert(key("10.77.0.2", "100.127.0.1:9000"), target("10.78.0.2:8308"));
        old.insert(key("10.77.0.3", "100.127.0.1:9000"), target("10.78.0.2:8309"));
        let ids = target_ids(&old);
        let mut new = old.clone();
        new.insert(key("10.77.0.3", "100.127.0.1:9000"), target("10.78.0.2:8310"));
        new.insert(key("10.77.0.4", "100.127.0.1:9000"), target("10.78.0.2:8308"));
        let Some(Transaction::Update { new_targets, delete, add }) =
            Transaction::diff(&old, &ids, &new)
        else {
            panic!()
        };
        // The new target gets the next id; known targets keep theirs.
        assert_eq!(new_targets, vec![Target { addr: target("10.78.0.2:8310"), id: 3 }]);
        assert_eq!(delete, vec![key("10.77.0.3", "100.127.0.1:9000")]);
        assert_eq!(
            add,
            vec![
                (
                    key("10.77.0.3", "100.127.0.1:9000"),
                    Target { addr: target("10.78.0.2:8310"), id: 3 }
                ),
                (
                    key("10.77.0.4", "100.127.0.1:9000"),
                    Target { addr: target("10.78.0.2:8308"), id: 1 }
                ),
            ]
        );
        assert!(Transaction::diff(&new, &ids, &new).unwrap().is_noop());

        let doc = Transaction::diff(&old, &ids, &new).unwrap().to_nft_string();
        let del = doc.find(r#"{"delete":"#).unwrap();
        let add = doc.find(r#"{"add":{"element":{"family":"ip","table":"rodvr","name":"routes""#);
        assert!(del < add.unwrap(), "deletes must come first: {doc}");
        assert!(!doc.contains(r#""table":{"#), "an update never recreates the table: {doc}");
        assert!(doc.find("to_10.78.0.2_8310").unwrap() < del, "chain before its use: {doc}");
        assert!(doc.contains(r#"[3,{"goto":{"target":"to_10.78.0.2_8310"}}]"#), "{doc}");
        assert!(doc.contains(r#"[3,{"goto":{"target":"to_10.78.0.2_8310_ct"}}]"#), "{doc}");
        assert!(!doc.contains("to_10.78.0.2_8308"), "known targets are not re-added: {doc}");
    }

    #[test]
    fn a_route_matches_its_vms_tap_and_address_together() {
        let mut routes = RouteMap::new();
        let k = key("10.77.0.9", "100.127.0.1:9000");
        routes.insert(k.clone(), target("10.78.0.2:8308"));
        let doc = Transaction::diff(&RouteMap::new(), &TargetIds::new(), &routes);
        let doc = doc.unwrap().to_nft_string();
        assert!(doc.contains(r#"{"concat":["tap9","10.77.0.9","100.127.0.1",9000]}"#), "{doc}");
        let ip = "10.77.0.9".parse().unwrap();
        assert_eq!(resolve(&routes, ip, "tap9", k.masked), Some(target("10.78.0.2:8308")));
        // Its address on another tap (another VM that took it), or another address on its tap.
        assert_eq!(resolve(&routes, ip, "tap2", k.masked), None);
        assert_eq!(resolve(&routes, "10.77.0.2".parse().unwrap(), "tap9", k.masked), None);
    }
}
