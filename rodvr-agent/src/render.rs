//! Route table -> nftables transaction, as pure functions.
//!
//! Everything the agent does to the kernel is one `nft -j -f -` document, and one document is one
//! kernel transaction: it applies entirely or not at all. Two shapes exist:
//!
//! * [`Transaction::Replace`] rebuilds the agent's own table (`table ip rodvr`) from scratch with
//!   the add/delete/add idiom, so it works whether or not the table exists and never touches
//!   another table;
//! * [`Transaction::Update`] only deletes and adds map elements (and adds a target chain the first
//!   time a target appears), so a change of a few routes costs the same at 10 routes as at 10,000.
//!
//! DNAT goes through a verdict map keyed on (VM source, masked address, masked port): a hit jumps
//! to the chain of the route's real rCUDA endpoint, which holds one `dnat` rule. The per-packet
//! cost is one hash lookup however many routes there are. A map with a concatenated
//! `ipv4_addr . inet_service` value (the textbook form) is not possible: nft 1.0.6 (Debian 12)
//! cannot declare it in JSON (it silently creates a set, and a rule using it crashes nft).
//!
//! Conntrack keeps an open connection going after its route is removed, so the forward and input
//! filters also check, per packet, that a masked connection's original tuple is still a route.
//! That lookup goes to plain key sets (`live_by_*`): the kernel refuses a lookup from a filter
//! chain into a verdict map whose target chains DNAT. Each route is thus two elements (what nft
//! spends most of a 10,000-route transaction parsing).
//!
//! Target chains are never deleted by an update (deleting costs a kernel RCU grace period); an
//! unused one is unreachable and disappears with the next full replace. `ct original ip daddr`
//! matches use the `"ip daddr"` key form, which nft 1.0.6 byte-orders correctly. The nftables
//! crate's typed structures build table and chain objects; rules are raw JSON values, and map
//! elements are written straight into the document string (building a `serde_json::Value` per
//! element made rendering 10,000 routes cost as much as nft's own work).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4};

use nftables::schema::{Chain, NfCmd, NfListObject, Table};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use serde_json::{json, Value};

use crate::protocol::{Ipv4Cidr, Route, VmSource};

/// The one table the agent owns.
pub const TABLE: &str = "rodvr";
pub const MAP_BY_IP: &str = "routes_by_ip";
pub const MAP_BY_TAP: &str = "routes_by_tap";
/// The keys of the two maps again, for the per-packet "is this route still there" check: a
/// verdict map whose targets DNAT cannot be looked up from a filter chain (the kernel refuses).
pub const SET_LIVE_BY_IP: &str = "live_by_ip";
pub const SET_LIVE_BY_TAP: &str = "live_by_tap";
pub const SET_LOCAL_RCUDA: &str = "local_rcuda";

/// Host facts the table depends on besides the routes; fixed for the life of an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableParams {
    /// Addresses VMs use for their cGPUs; traffic to them never leaves unmasked.
    pub masked_range: Ipv4Cidr,
    /// Interface on the GPU network: masqueraded, and closed to VM traffic that is not a route.
    pub gpu_interface: String,
    /// This host's own rCUDA servers (compute-GPU hosts); VMs reach them only through a route.
    pub local_rcuda: Vec<SocketAddrV4>,
}

/// The key of one verdict-map element.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteKey {
    pub source: VmSource,
    pub masked: SocketAddrV4,
}

/// The data plane's view of a route table: key -> real rCUDA endpoint.
pub type RouteMap = BTreeMap<RouteKey, SocketAddrV4>;

/// Reduces validated routes to map elements.
pub fn route_map(routes: &[Route]) -> RouteMap {
    routes
        .iter()
        .filter_map(|r| Some((RouteKey { source: r.source()?, masked: r.masked }, r.target)))
        .collect()
}

/// The rCUDA endpoints of `routes`, each of which needs a target chain.
pub fn targets(routes: &RouteMap) -> BTreeSet<SocketAddrV4> {
    routes.values().copied().collect()
}

/// The chain that DNATs to `target`.
pub fn target_chain(target: SocketAddrV4) -> String {
    format!("to_{}_{}", target.ip(), target.port())
}

/// One kernel transaction on the agent's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transaction {
    /// Replace the whole table with these parameters and routes.
    Replace { params: TableParams, routes: RouteMap },
    /// Create chains for new targets, then delete and add map elements in the existing table.
    Update {
        new_targets: Vec<SocketAddrV4>,
        delete: Vec<RouteKey>,
        add: Vec<(RouteKey, SocketAddrV4)>,
    },
}

impl Transaction {
    /// The changes from `old` (with target chains `chains` in place) to `new`; a changed target
    /// is a delete plus an add.
    pub fn diff(old: &RouteMap, chains: &BTreeSet<SocketAddrV4>, new: &RouteMap) -> Self {
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
        let new_targets: BTreeSet<SocketAddrV4> =
            add.iter().map(|(_, t)| *t).filter(|t| !chains.contains(t)).collect();
        Self::Update { new_targets: new_targets.into_iter().collect(), delete, add }
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
                for target in targets(routes) {
                    for cmd in target_chain_commands(target) {
                        push(&mut out, cmd);
                    }
                }
                let adds = routes.iter().map(|(k, v)| (k, *v));
                write_element_commands(&mut out, std::iter::empty(), adds);
            }
            Self::Update { new_targets, delete, add } => {
                for target in new_targets {
                    for cmd in target_chain_commands(*target) {
                        push(&mut out, cmd);
                    }
                }
                write_element_commands(&mut out, delete.iter(), add.iter().map(|(k, v)| (k, *v)));
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

fn typed(cmd: &NfCmd<'_>) -> Value {
    serde_json::to_value(cmd).expect("nftables schema types always serialize")
}

fn table() -> Table<'static> {
    Table { family: NfFamily::IP, name: TABLE.into(), handle: None }
}

fn base_chain(name: &'static str, kind: NfChainType, hook: NfHook, prio: i32) -> Value {
    typed(&NfCmd::Add(NfListObject::Chain(Chain {
        family: NfFamily::IP,
        table: TABLE.into(),
        name: name.into(),
        _type: Some(kind),
        hook: Some(hook),
        prio: Some(prio),
        policy: Some(NfChainPolicy::Accept),
        ..Chain::default()
    })))
}

/// A JSON object built by moving `pairs` in (`json!` would clone interpolated values).
fn obj<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

fn rule(chain: &str, expr: Vec<Value>) -> Value {
    let rule = obj([
        ("family", "ip".into()),
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

fn dispatch_via(first: Value, map: &str, masked: Ipv4Cidr) -> Value {
    let key = obj([(
        "concat",
        Value::Array(vec![first, payload("ip", "daddr"), payload("tcp", "dport")]),
    )]);
    let vmap = obj([("vmap", obj([("key", key), ("data", format!("@{map}").into())]))]);
    rule("prerouting", vec![matches("==", payload("ip", "daddr"), range(masked)), vmap])
}

/// A regular chain holding the one DNAT rule to `target`.
fn target_chain_commands(target: SocketAddrV4) -> [Value; 2] {
    let name = target_chain(target);
    let chain = typed(&NfCmd::Add(NfListObject::Chain(Chain {
        family: NfFamily::IP,
        table: TABLE.into(),
        name: name.as_str().into(),
        ..Chain::default()
    })));
    let dnat = obj([(
        "dnat",
        obj([
            ("family", "ip".into()),
            ("addr", target.ip().to_string().into()),
            ("port", target.port().into()),
        ]),
    )]);
    let rule = rule(&name, vec![matches("==", meta("l4proto"), "tcp".into()), dnat]);
    [chain, rule]
}

/// Conntrack keeps a DNATed connection going after its route is removed; these rules drop the
/// VM-to-GPU direction of a masked connection whose route (looked up by its original tuple) is
/// gone, so removing a route also cuts connections that are already open.
fn still_routed_rules(chain: &str, masked: Ipv4Cidr) -> [Value; 3] {
    let ct = |key: &str| json!({"ct": {"key": key, "dir": "original"}});
    let masked_original = || {
        vec![
            matches("==", json!({"ct": {"key": "direction"}}), "original".into()),
            matches("==", ct_original_daddr(), range(masked)),
            // Gives `ct original proto-dst` its type (inet_service) for the lookup below.
            matches("==", meta("l4proto"), "tcp".into()),
        ]
    };
    let routed_by = |first: Value, set: &str| {
        let mut expr = masked_original();
        let key = json!({"concat": [first, ct("ip daddr"), ct("proto-dst")]});
        expr.push(matches("==", key, format!("@{set}").into()));
        expr.push(json!({"accept": null}));
        rule(chain, expr)
    };
    let mut gone = masked_original();
    gone.push(json!({"drop": null}));
    [
        routed_by(ct("ip saddr"), SET_LIVE_BY_IP),
        routed_by(meta("iifname"), SET_LIVE_BY_TAP),
        rule(chain, gone),
    ]
}

fn skeleton_commands(params: &TableParams) -> Vec<Value> {
    let masked = params.masked_range;
    let gpu_if = params.gpu_interface.as_str();
    let key_set = |name: &str, key: [&str; 3]| json!({"add": {"set": {"family": "ip", "table": TABLE, "name": name, "type": key}}});
    let verdict_map = |name: &str, key: [&str; 3]| json!({"add": {"map": {"family": "ip", "table": TABLE, "name": name, "type": key, "map": "verdict"}}});
    let mut cmds = vec![
        typed(&NfCmd::Add(NfListObject::Table(table()))),
        typed(&NfCmd::Delete(NfListObject::Table(table()))),
        typed(&NfCmd::Add(NfListObject::Table(table()))),
        verdict_map(MAP_BY_IP, ["ipv4_addr", "ipv4_addr", "inet_service"]),
        verdict_map(MAP_BY_TAP, ["ifname", "ipv4_addr", "inet_service"]),
        key_set(SET_LIVE_BY_IP, ["ipv4_addr", "ipv4_addr", "inet_service"]),
        key_set(SET_LIVE_BY_TAP, ["ifname", "ipv4_addr", "inet_service"]),
        json!({"add": {"set": {"family": "ip", "table": TABLE, "name": SET_LOCAL_RCUDA,
            "type": ["ipv4_addr", "inet_service"]}}}),
        base_chain("prerouting", NfChainType::NAT, NfHook::Prerouting, -100),
        // A VM's packet to a masked endpoint jumps to its route's target chain, which rewrites it
        // to the real rCUDA endpoint. A lookup miss ends the rule without a verdict, so the next
        // rule (or the forward filter) decides.
        dispatch_via(payload("ip", "saddr"), MAP_BY_IP, masked),
        dispatch_via(meta("iifname"), MAP_BY_TAP, masked),
        base_chain("postrouting", NfChainType::NAT, NfHook::Postrouting, 100),
        // The GPU server sees the compute host, never the VM.
        rule(
            "postrouting",
            vec![
                matches("==", meta("oifname"), json!(gpu_if)),
                matches("==", ct_original_daddr(), range(masked)),
                json!({"masquerade": null}),
            ],
        ),
        base_chain("forward", NfChainType::Filter, NfHook::Forward, 0),
        // A masked address that was not rewritten has no route for this VM.
        rule(
            "forward",
            vec![matches("==", payload("ip", "daddr"), range(masked)), json!({"drop": null})],
        ),
    ];
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
        base_chain("input", NfChainType::Filter, NfHook::Input, 0),
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
    if !params.local_rcuda.is_empty() {
        let elems: Vec<Value> = params
            .local_rcuda
            .iter()
            .map(|e| json!({"concat": [e.ip().to_string(), e.port()]}))
            .collect();
        cmds.push(json!({"add": {"element": {"family": "ip", "table": TABLE,
            "name": SET_LOCAL_RCUDA, "elem": elems}}}));
    }
    cmds
}

/// Writes `{"concat":[source,"masked ip",port]}`.
fn write_key(out: &mut String, key: &RouteKey) {
    out.push_str(r#"{"concat":["#);
    match &key.source {
        VmSource::Ip(ip) => write!(out, "\"{ip}\""),
        VmSource::Tap(tap) => write!(out, "{}", Value::String(tap.clone())),
    }
    .expect("writing to a String cannot fail");
    write!(out, r#","{}",{}]}}"#, key.masked.ip(), key.masked.port())
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
fn write_element_commands<'a>(
    out: &mut String,
    delete: impl Iterator<Item = &'a RouteKey>,
    add: impl Iterator<Item = (&'a RouteKey, SocketAddrV4)>,
) {
    let (mut del_ip, mut del_tap) = (Vec::new(), Vec::new());
    for key in delete {
        match key.source {
            VmSource::Ip(_) => del_ip.push(key),
            VmSource::Tap(_) => del_tap.push(key),
        }
    }
    let (mut add_ip, mut add_tap) = (Vec::new(), Vec::new());
    for (key, target) in add {
        match key.source {
            VmSource::Ip(_) => add_ip.push((key, target)),
            VmSource::Tap(_) => add_tap.push((key, target)),
        }
    }
    let ip = (MAP_BY_IP, SET_LIVE_BY_IP);
    let tap = (MAP_BY_TAP, SET_LIVE_BY_TAP);
    for (keys, (map, set)) in [(del_ip, ip), (del_tap, tap)] {
        write_element_command(out, "delete", map, &keys, |o, k| write_key(o, k));
        write_element_command(out, "delete", set, &keys, |o, k| write_key(o, k));
    }
    for (items, (map, set)) in [(add_ip, ip), (add_tap, tap)] {
        write_element_command(out, "add", set, &items, |o, (k, _)| write_key(o, k));
        write_element_command(out, "add", map, &items, |o, (k, t)| {
            o.push('[');
            write_key(o, k);
            write!(o, r#",{{"goto":{{"target":"{}"}}}}]"#, target_chain(*t))
                .expect("writing to a String cannot fail");
        });
    }
}

/// Where a VM's connection to `masked` goes under `routes`, as the DNAT rules decide it:
/// the IP-keyed map first, then the tap-keyed map; `None` means the forward filter drops it.
pub fn resolve(
    routes: &RouteMap,
    src: Ipv4Addr,
    iif: &str,
    masked: SocketAddrV4,
) -> Option<SocketAddrV4> {
    let by_ip = RouteKey { source: VmSource::Ip(src), masked };
    let by_tap = RouteKey { source: VmSource::Tap(iif.to_owned()), masked };
    routes.get(&by_ip).or_else(|| routes.get(&by_tap)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> TableParams {
        TableParams {
            masked_range: "100.127.0.0/16".parse().unwrap(),
            gpu_interface: "gpu0".into(),
            local_rcuda: vec!["10.78.0.1:8308".parse().unwrap()],
        }
    }

    fn key(ip: &str, masked: &str) -> RouteKey {
        RouteKey { source: VmSource::Ip(ip.parse().unwrap()), masked: masked.parse().unwrap() }
    }

    fn target(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
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
        for cmd in &cmds[2..] {
            let obj = cmd.as_object().unwrap().values().next().unwrap();
            let obj = obj.as_object().unwrap().values().next().unwrap();
            let table = obj.get("table").or_else(|| obj.get("name"));
            assert_eq!(table.unwrap(), "rodvr", "{cmd}");
            assert_eq!(obj["family"], "ip", "{cmd}");
        }
        let chains = cmds.iter().filter(|c| c["add"]["chain"]["name"] == "to_10.78.0.2_8308");
        assert_eq!(chains.count(), 1, "one chain per target, not per route");
        let elems = cmds
            .iter()
            .find(|c| c["add"]["element"]["name"] == MAP_BY_IP)
            .map(|c| c["add"]["element"]["elem"].clone())
            .unwrap();
        assert_eq!(
            elems[0],
            json!([{"concat": ["10.77.0.2", "100.127.0.1", 9000]}, {"goto": {"target": "to_10.78.0.2_8308"}}])
        );
        let text = doc.to_string();
        assert!(text.contains(r#"{"concat":["10.78.0.1",8308]}"#), "{text}");
        assert!(text.contains(r#""range":["100.127.0.0","100.127.255.255"]"#), "{text}");
    }

    #[test]
    fn diff_touches_only_changed_elements() {
        let mut old = RouteMap::new();
        old.insert(key("10.77.0.2", "100.127.0.1:9000"), target("10.78.0.2:8308"));
        old.insert(key("10.77.0.3", "100.127.0.1:9000"), target("10.78.0.2:8309"));
        let chains = targets(&old);
        let mut new = old.clone();
        new.insert(key("10.77.0.3", "100.127.0.1:9000"), target("10.78.0.2:8310"));
        new.insert(key("10.77.0.4", "100.127.0.1:9000"), target("10.78.0.2:8308"));
        let Transaction::Update { new_targets, delete, add } =
            Transaction::diff(&old, &chains, &new)
        else {
            panic!()
        };
        assert_eq!(new_targets, vec![target("10.78.0.2:8310")]);
        assert_eq!(delete, vec![key("10.77.0.3", "100.127.0.1:9000")]);
        assert_eq!(add.len(), 2);
        assert!(Transaction::diff(&new, &chains, &new).is_noop());

        let doc = Transaction::diff(&old, &chains, &new).to_nft_string();
        let del = doc.find(r#"{"delete":"#).unwrap();
        let add = doc.find(r#"{"add":{"element""#).unwrap();
        assert!(del < add, "deletes must come first: {doc}");
        assert!(!doc.contains(r#""table":{"#), "an update never recreates the table: {doc}");
        assert!(doc.find("to_10.78.0.2_8310").unwrap() < del, "chain before its use: {doc}");
    }

    #[test]
    fn tap_routes_use_the_tap_map() {
        let mut routes = RouteMap::new();
        let k = RouteKey {
            source: VmSource::Tap("tap1".into()),
            masked: "100.127.0.1:9000".parse().unwrap(),
        };
        routes.insert(k.clone(), target("10.78.0.2:8308"));
        let doc = Transaction::diff(&RouteMap::new(), &BTreeSet::new(), &routes).to_nft_string();
        assert!(doc.contains(MAP_BY_TAP) && !doc.contains(MAP_BY_IP), "{doc}");
        assert!(doc.contains(r#"{"concat":["tap1","100.127.0.1",9000]}"#), "{doc}");
        let ip = "10.77.0.9".parse().unwrap();
        assert_eq!(resolve(&routes, ip, "tap1", k.masked), Some(target("10.78.0.2:8308")));
        assert_eq!(resolve(&routes, ip, "tap2", k.masked), None);
    }
}
