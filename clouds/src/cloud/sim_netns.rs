//! [`SimNetns`]: a [`SimVmNetwork`] whose VMs are Linux network namespaces, so that the simulated
//! cloud's VMs send real packets through the real agents' nftables rules.
//!
//! The end-to-end test runs gsaasd, the agents and the rCUDA stand-ins in namespaces of their own;
//! a VM has to be something the kernel routes from, created when Nova would plug its port and gone
//! when Nova would unplug it. That is exactly the hook's contract, so the rest of the simulated
//! Nova (states, delays, faults, recorded user_data) is unchanged. The hosts' namespaces are not
//! ours: the configuration maps each host name to the namespace that plays it
//! (`[cloud.sim.vm_network] kind = "netns"`), and whoever built them (the test) owns their
//! addresses and forwarding.
//!
//! The wiring mimics a routed Neutron port rather than a bridge, because several VMs share one
//! subnet (`fixed_ip_range`) on several hosts and must not see each other's ARP:
//!
//! ```text
//!  VM namespace                         host namespace
//!  eth0  10.77.0.N/32  <--- veth --->   tapXXXXXXXX-XX  10.77.0.1/32 (the gateway)
//!  route 10.77.0.1 dev eth0             route 10.77.0.N/32 dev tapXXXXXXXX-XX
//!  default via 10.77.0.1
//! ```
//!
//! The host side is named as Neutron names a tap (`tap` + 11 characters of the port id), which is
//! what [`VmPort::tap`] reports and what agents may match on. Every host-side tap carries the same
//! gateway address, as a /32, so no host gets a connected route for the whole subnet and each VM is
//! reached through its own /32.
//!
//! Everything is done with `ip` (iproute2), one command at a time, so that an error names the exact
//! command and what it printed (`CloudError::Unavailable`, which puts the server in ERROR as a failed
//! port binding does). A half-built attach is rolled back. Detach deletes the tap first, which is
//! synchronous (the kernel destroys both veth ends at once), and only then the namespace, whose
//! teardown the kernel finishes asynchronously: a fixed IP handed out again at once must not meet
//! the previous owner's route. Removing what is already gone counts as done, so a retried delete
//! succeeds.
//!
//! Namespaces are created with `ip netns add`, which bind-mounts them under `/run/netns`. A gsaasd
//! started with `ip netns exec` runs in a private (slave) mount namespace, where such mounts stay
//! invisible to everyone else: run it with `nsenter --net=/run/netns/NAME` instead, which changes
//! the network namespace only.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use async_trait::async_trait;
use gpgpums::{HostId, VmId};
use serde::{Deserialize, Serialize};

use super::sim_network::{Ipv4Cidr, SimAddressPool, SimVmNetwork, VmPort};
use super::{CloudError, ServerId};

/// How long one `ip` command may take before the attach or detach fails.
const IP_TIMEOUT: Duration = Duration::from_secs(10);

/// The settings of [`SimNetns`] (`[cloud.sim.vm_network]` with `kind = "netns"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetnsConfig {
    /// Host name -> the network namespace (a name under `/run/netns`) that plays that host.
    pub namespaces: BTreeMap<HostId, String>,
    /// VM namespaces are named `<vm_namespace_prefix><server id>`; a run-specific prefix lets the
    /// owner of the hosts find and remove leftovers.
    #[serde(default = "default_vm_prefix")]
    pub vm_namespace_prefix: String,
}

fn default_vm_prefix() -> String {
    "gsaas-vm-".to_owned()
}

/// Why a namespace name is unusable, if it is.
fn bad_namespace_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name == "." || name == ".." || name.contains('/') {
        Some("is not a file name")
    } else if name.len() > 200 {
        Some("is longer than 200 bytes")
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        Some("has characters other than ASCII letters, digits, '-', '_' and '.'")
    } else {
        None
    }
}

impl NetnsConfig {
    /// Checks what serde cannot: at least one host, and names `ip netns` accepts.
    pub fn check(&self) -> Result<(), String> {
        if self.namespaces.is_empty() {
            return Err("namespaces: no host is mapped to a namespace".to_owned());
        }
        for (host, ns) in &self.namespaces {
            if let Some(why) = bad_namespace_name(ns) {
                return Err(format!("namespaces.{host}: namespace name {ns:?} {why}"));
            }
        }
        // A server id is a UUID: 36 characters of [0-9a-f-].
        let sample = format!("{}00000000-0000-0000-0000-000000000000", self.vm_namespace_prefix);
        if let Some(why) = bad_namespace_name(&sample) {
            return Err(format!(
                "vm_namespace_prefix: {:?} makes VM namespace names that {why}",
                self.vm_namespace_prefix
            ));
        }
        Ok(())
    }
}

/// VMs as network namespaces wired to their host's namespace. See the module docs.
#[derive(Debug)]
pub struct SimNetns {
    config: NetnsConfig,
    gateway: Ipv4Addr,
    addresses: SimAddressPool,
}

impl SimNetns {
    /// VMs get addresses from `range` (.2 upwards); .1 is the gateway on every tap.
    pub fn new(config: NetnsConfig, range: Ipv4Cidr) -> Self {
        let gateway = Ipv4Addr::from(u32::from(range.network()) + 1);
        Self { config, gateway, addresses: SimAddressPool::new(range) }
    }

    /// The namespace of the VM `server`.
    pub fn vm_namespace(&self, server: &ServerId) -> String {
        format!("{}{server}", self.config.vm_namespace_prefix)
    }

    fn host_namespace(&self, host: &HostId) -> Result<&str, CloudError> {
        self.config.namespaces.get(host).map(String::as_str).ok_or_else(|| {
            CloudError::unavailable(format!(
                "host {host} has no network namespace in cloud.sim.vm_network.namespaces"
            ))
        })
    }
}

/// Builds the VM's namespace `vm_ns` and wires it to `host_ns` through the port's tap, a routed
/// port with `gateway` on the host's side (see the module docs). On error the caller removes
/// what was built ([`unplug_vm`]). The end-to-end tests wire the VMs of a real Nova with it too.
pub async fn plug_vm(
    vm_ns: &str,
    host_ns: &str,
    gateway: Ipv4Addr,
    port: &VmPort,
) -> Result<(), CloudError> {
    let vm_cidr = format!("{}/32", port.fixed_ip);
    let gateway = gateway.to_string();
    let gateway_cidr = format!("{gateway}/32");
    let tap = port.tap.as_str();
    ip(&["netns", "add", vm_ns]).await?;
    ip(&["-n", vm_ns, "link", "set", "lo", "up"]).await?;
    ip(&[
        "-n", host_ns, "link", "add", tap, "type", "veth", "peer", "name", "eth0", "netns", vm_ns,
    ])
    .await?;
    ip(&["-n", host_ns, "addr", "add", &gateway_cidr, "dev", tap]).await?;
    ip(&["-n", host_ns, "link", "set", tap, "up"]).await?;
    ip(&["-n", host_ns, "route", "add", &vm_cidr, "dev", tap]).await?;
    ip(&["-n", vm_ns, "addr", "add", &vm_cidr, "dev", "eth0"]).await?;
    ip(&["-n", vm_ns, "link", "set", "eth0", "up"]).await?;
    ip(&["-n", vm_ns, "route", "add", &gateway, "dev", "eth0"]).await?;
    ip(&["-n", vm_ns, "route", "add", "default", "via", &gateway, "dev", "eth0"]).await?;
    Ok(())
}

/// Deletes the tap (both veth ends) and the VM's namespace; what is already gone is fine.
pub async fn unplug_vm(vm_ns: &str, host_ns: &str, tap: &str) -> Result<(), CloudError> {
    // The host's namespace gone means its interfaces are gone too.
    let gone = ["Cannot find device", "Cannot open network namespace"];
    ip_unless(&["-n", host_ns, "link", "del", tap], &gone).await?;
    ip_unless(&["netns", "del", vm_ns], &["No such file or directory"]).await
}

#[async_trait]
impl SimVmNetwork for SimNetns {
    async fn attach(
        &self,
        server: &ServerId,
        _vm: VmId,
        host: &HostId,
    ) -> Result<VmPort, CloudError> {
        let host_ns = self.host_namespace(host)?;
        let port = VmPort::new(self.addresses.allocate()?);
        let vm_ns = self.vm_namespace(server);
        if let Err(err) = plug_vm(&vm_ns, host_ns, self.gateway, &port).await {
            if let Err(cleanup) = unplug_vm(&vm_ns, host_ns, &port.tap).await {
                tracing::warn!(server = %server, error = %cleanup, "removing a half-built VM network failed");
            } else {
                self.addresses.release(port.fixed_ip);
            }
            return Err(err);
        }
        Ok(port)
    }

    async fn detach(
        &self,
        server: &ServerId,
        host: &HostId,
        port: &VmPort,
    ) -> Result<(), CloudError> {
        let host_ns = self.host_namespace(host)?;
        unplug_vm(&self.vm_namespace(server), host_ns, &port.tap).await?;
        self.addresses.release(port.fixed_ip);
        Ok(())
    }
}

/// Runs `ip ARGS`; an error names the command and carries what it printed.
async fn ip(args: &[&str]) -> Result<(), CloudError> {
    ip_unless(args, &[]).await
}

/// Runs `ip ARGS`; a failure whose message contains one of `done_if` counts as success.
async fn ip_unless(args: &[&str], done_if: &[&str]) -> Result<(), CloudError> {
    let command = format!("ip {}", args.join(" "));
    let run = tokio::process::Command::new("ip")
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(IP_TIMEOUT, run).await {
        Ok(Ok(output)) => output,
        Ok(Err(err)) => {
            return Err(CloudError::Unavailable {
                reason: format!("cannot run `{command}` (is iproute2 installed?)"),
                source: Some(Box::new(err)),
            })
        }
        Err(_) => {
            return Err(CloudError::unavailable(format!(
                "`{command}` did not finish within {IP_TIMEOUT:?}"
            )))
        }
    };
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    if done_if.iter().any(|message| stderr.contains(message)) {
        return Ok(());
    }
    Err(CloudError::unavailable(format!(
        "`{command}` failed ({}): {}",
        output.status,
        stderr.trim()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml_text: &str) -> Result<NetnsConfig, String> {
        let config: NetnsConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        config.check()?;
        Ok(config)
    }

    #[test]
    fn config_names_hosts_and_checks_namespace_names() {
        let ok = config("namespaces = { compute0-rgpu = \"ns-crg\" }").unwrap();
        assert_eq!(ok.vm_namespace_prefix, "gsaas-vm-");
        let netns = SimNetns::new(ok, "10.77.0.0/16".parse().unwrap());
        assert_eq!(netns.gateway, Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(netns.vm_namespace(&ServerId("abc".into())), "gsaas-vm-abc");

        let err = config("namespaces = {}").unwrap_err();
        assert!(err.contains("no host"), "{err}");
        let err = config("namespaces = { h = \"a/b\" }").unwrap_err();
        assert!(err.contains("namespaces.h") && err.contains("a/b"), "{err}");
        let err = config("namespaces = { h = \"n\" }\nvm_namespace_prefix = \"x y\"").unwrap_err();
        assert!(err.contains("vm_namespace_prefix"), "{err}");
        let err = config("namespaces = { h = \"n\" }\nsubnet = \"10.0.0.0/8\"").unwrap_err();
        assert!(err.contains("subnet"), "{err}");
        let err = config("namespaces = { \"bad host\" = \"n\" }").unwrap_err();
        assert!(err.contains("bad host") || err.contains("' '"), "{err}");
    }

    #[tokio::test]
    async fn an_unknown_host_fails_the_attach_naming_the_setting() {
        let config = NetnsConfig {
            namespaces: BTreeMap::from([(HostId::new("h1").unwrap(), "ns1".to_owned())]),
            vm_namespace_prefix: default_vm_prefix(),
        };
        let netns = SimNetns::new(config, "10.77.0.0/16".parse().unwrap());
        let host = HostId::new("h2").unwrap();
        let err = netns.attach(&ServerId("s".into()), VmId::new_random(), &host).await.unwrap_err();
        assert!(err.to_string().contains("cloud.sim.vm_network.namespaces"), "{err}");
    }

    #[tokio::test]
    async fn a_failing_command_is_named_in_the_error() {
        let err = ip(&["link", "show", "dev", "no-such-device-x"]).await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains("`ip link show dev no-such-device-x`"), "{text}");
        // What is already gone counts as done.
        ip_unless(&["link", "show", "dev", "no-such-device-x"], &["does not exist", "Cannot find"])
            .await
            .unwrap();
    }
}
