//! The remote-GPU environment of one VM: the variables its layer's client reads, and GSaaS's
//! own that say which cGPU each device is.
//!
//! gsaasd writes it into the VM's cloud-init and shows it in the VM's view; the host's agent
//! answers it live at the masked metadata endpoint. Both render it here, so they agree.
//!
//! Device numbers are positions in the layer's list, so a cGPU that is gone (lost, or detached)
//! moves every later one down. rCUDA says how many devices there are; LUPINE's client goes
//! further and skips a listed server that does not answer without telling the application
//! (`docs/lupine.md`). So the list holds live cGPUs only, and two variables say which cGPU each
//! device is and which are missing: `GSAAS_CGPUS` (the cGPU index of device 0, 1, ...) and
//! `GSAAS_CGPUS_MISSING` (booked cGPUs that have no route now). Both are always set, empty when
//! there is nothing to say, so that a shell that evaluates the environment again forgets a
//! cGPU that came back.

use gpgpums::Remoting;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

/// One device as the VM's client sees it: the masked endpoint, the GPU's number at its server,
/// and the cGPU it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    pub address: Ipv4Addr,
    pub port: u16,
    pub gpu_number: u32,
    /// The cGPU's index in its VM (its number for life; `GSAAS_CGPUS`).
    #[serde(default)]
    pub cgpu: u32,
}

/// The environment of one VM: its live devices in order, numbered from 0, in its layer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuEnv {
    #[serde(default)]
    pub remoting: Remoting,
    pub devices: Vec<GpuDevice>,
    /// cGPUs the VM holds that have no route now (their GPU failed and nothing could take
    /// them), by index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<u32>,
}

/// The variable that lists the cGPU index of each device.
pub const CGPUS_VAR: &str = "GSAAS_CGPUS";
/// The variable that lists the cGPUs with no route now.
pub const MISSING_VAR: &str = "GSAAS_CGPUS_MISSING";

impl GpuEnv {
    /// The layer's own variables: rCUDA's `RCUDA_DEVICE_COUNT` and `RCUDA_DEVICE_<j>`
    /// (`address@port:gpu`), or LUPINE's `LUPINE_SERVER` (`address:port,...`) and
    /// `LUPINE_DISABLE_LOCAL` (a VM has no GPU of its own, and one would be numbered first).
    pub fn layer_variables(&self) -> Vec<(String, String)> {
        match self.remoting {
            Remoting::Rcuda => {
                let count = ("RCUDA_DEVICE_COUNT".to_owned(), self.devices.len().to_string());
                let devices = self.devices.iter().enumerate().map(|(j, d)| {
                    (
                        format!("RCUDA_DEVICE_{j}"),
                        format!("{}@{}:{}", d.address, d.port, d.gpu_number),
                    )
                });
                std::iter::once(count).chain(devices).collect()
            }
            Remoting::Lupine => {
                let servers: Vec<String> =
                    self.devices.iter().map(|d| format!("{}:{}", d.address, d.port)).collect();
                vec![
                    ("LUPINE_SERVER".to_owned(), servers.join(",")),
                    ("LUPINE_DISABLE_LOCAL".to_owned(), "1".to_owned()),
                ]
            }
        }
    }

    /// The layer's variables, then [`CGPUS_VAR`] and [`MISSING_VAR`]. The values are
    /// addresses, numbers and commas: they never need quoting.
    pub fn variables(&self) -> Vec<(String, String)> {
        let list = |indexes: &mut dyn Iterator<Item = u32>| {
            indexes.map(|i| i.to_string()).collect::<Vec<_>>().join(",")
        };
        let mut variables = self.layer_variables();
        variables.push((CGPUS_VAR.to_owned(), list(&mut self.devices.iter().map(|d| d.cgpu))));
        variables.push((MISSING_VAR.to_owned(), list(&mut self.missing.iter().copied())));
        variables
    }

    /// [`Self::variables`] as shell `export` lines.
    pub fn export_lines(&self) -> String {
        export_lines(self.variables())
    }
}

/// `variables` as shell `export` lines.
pub fn export_lines(variables: Vec<(String, String)>) -> String {
    variables.into_iter().map(|(name, value)| format!("export {name}={value}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(port: u16, cgpu: u32) -> GpuDevice {
        GpuDevice { address: Ipv4Addr::new(100, 127, 0, 1), port, gpu_number: 0, cgpu }
    }

    #[test]
    fn each_layer_names_its_devices_and_gsaas_says_which_cgpu_each_is() {
        let rcuda = GpuEnv {
            remoting: Remoting::Rcuda,
            devices: vec![device(8308, 0), device(8310, 2)],
            missing: vec![1],
        };
        assert_eq!(
            rcuda.export_lines(),
            "export RCUDA_DEVICE_COUNT=2\n\
             export RCUDA_DEVICE_0=100.127.0.1@8308:0\n\
             export RCUDA_DEVICE_1=100.127.0.1@8310:0\n\
             export GSAAS_CGPUS=0,2\n\
             export GSAAS_CGPUS_MISSING=1\n"
        );
        let lupine = GpuEnv { remoting: Remoting::Lupine, missing: vec![], ..rcuda };
        assert_eq!(
            lupine.export_lines(),
            "export LUPINE_SERVER=100.127.0.1:8308,100.127.0.1:8310\n\
             export LUPINE_DISABLE_LOCAL=1\n\
             export GSAAS_CGPUS=0,2\n\
             export GSAAS_CGPUS_MISSING=\n"
        );
        // Read by an agent or gsaasd that predates layers: rCUDA, as every VM was then.
        let old: GpuEnv = serde_json::from_str(
            r#"{"devices":[{"address":"100.127.0.1","port":8308,"gpu_number":0}]}"#,
        )
        .unwrap();
        assert_eq!((old.remoting, old.devices[0].cgpu), (Remoting::Rcuda, 0));
    }
}
