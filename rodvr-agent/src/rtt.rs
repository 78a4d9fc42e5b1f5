//! Round trips from this host to GPU hosts, which placement reads to keep a VM near its GPUs.
//!
//! gsaasd names the GPU hosts to measure (the nearest by topology, at most
//! [`MAX_RTT_TARGETS`]); the agent connects to each one's rCUDA endpoint once per round (a
//! few times a minute) and reports, per host, the median of its last [`SAMPLES`] connects.
//! The cost is bounded: one connect per target per round, all given up after the timeout. A
//! refused or timed-out connect is a round without a sample; a host none of the last
//! [`SAMPLES`] rounds reached is left out of the report (placement then treats it as far).

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gpgpums::HostId;
use rodvr_contract::protocol::{RttTarget, MAX_RTT_TARGETS};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// The rounds whose connects make a host's median.
pub const SAMPLES: usize = 5;

/// The last rounds' connects to each GPU host (microseconds; `None`: no answer).
#[derive(Debug, Default)]
pub struct RttSamples {
    by_host: BTreeMap<HostId, VecDeque<Option<u32>>>,
}

impl RttSamples {
    /// Records one round. Hosts the round did not measure (no longer named) are forgotten.
    pub fn record(&mut self, round: &[(HostId, Option<u32>)]) {
        let measured: BTreeMap<&HostId, Option<u32>> =
            round.iter().map(|(host, us)| (host, *us)).collect();
        self.by_host.retain(|host, _| measured.contains_key(host));
        for (host, us) in measured {
            let samples = self.by_host.entry(host.clone()).or_default();
            samples.push_back(us);
            while samples.len() > SAMPLES {
                samples.pop_front();
            }
        }
    }

    /// Each host's median over its answered connects (the upper one of an even count);
    /// hosts none answered are left out.
    pub fn medians(&self) -> BTreeMap<HostId, u32> {
        self.by_host
            .iter()
            .filter_map(|(host, samples)| {
                let mut answered: Vec<u32> = samples.iter().flatten().copied().collect();
                answered.sort_unstable();
                let median = *answered.get(answered.len() / 2)?;
                Some((host.clone(), median))
            })
            .collect()
    }
}

/// One round: a TCP connect to each target (at most [`MAX_RTT_TARGETS`], all at once), each
/// given up after `timeout`. In the targets' order.
pub async fn probe(targets: &[RttTarget], timeout: Duration) -> Vec<(HostId, Option<u32>)> {
    let targets = &targets[..targets.len().min(MAX_RTT_TARGETS)];
    let mut connects = JoinSet::new();
    for (i, target) in targets.iter().enumerate() {
        let addr = SocketAddr::new(target.address, target.port);
        connects.spawn(async move {
            let started = Instant::now();
            let connected = tokio::time::timeout(timeout, TcpStream::connect(addr)).await;
            let us = started.elapsed().as_micros().clamp(1, u128::from(gpgpums::MAX_RTT_US));
            (i, matches!(connected, Ok(Ok(_))).then_some(us as u32))
        });
    }
    let mut answers = vec![None; targets.len()];
    while let Some(joined) = connects.join_next().await {
        if let Ok((i, us)) = joined {
            answers[i] = us;
        }
    }
    targets.iter().map(|t| t.host.clone()).zip(answers).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str) -> HostId {
        HostId::new(name).unwrap()
    }

    #[test]
    fn medians_skip_silent_rounds_and_forget_hosts_no_longer_named() {
        let mut samples = RttSamples::default();
        for us in [Some(300), None, Some(100), Some(200), Some(5000)] {
            samples.record(&[(host("g1"), us), (host("g2"), None)]);
        }
        // g1: 100, 200, 300, 5000 answered -> the upper median; g2 never answered.
        assert_eq!(samples.medians(), BTreeMap::from([(host("g1"), 300)]));
        // Five more rounds: only the last five count.
        for _ in 0..SAMPLES {
            samples.record(&[(host("g1"), Some(80)), (host("g2"), Some(90))]);
        }
        assert_eq!(samples.medians(), BTreeMap::from([(host("g1"), 80), (host("g2"), 90)]));
        // g2 no longer named, g1 silent five rounds: nothing to report.
        for _ in 0..SAMPLES {
            samples.record(&[(host("g1"), None)]);
        }
        assert!(samples.medians().is_empty());
    }

    #[tokio::test]
    async fn a_round_connects_to_listeners_and_gives_up_on_the_rest_in_bounded_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap();
        // A port nothing listens on: refused at once.
        let closed = {
            let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            gone.local_addr().unwrap()
        };
        let target = |name: &str, addr: SocketAddr| RttTarget {
            host: host(name),
            address: addr.ip(),
            port: addr.port(),
        };
        // More targets than an agent measures: the rest are not tried.
        let mut targets = vec![target("up", open), target("down", closed)];
        targets.extend((0..MAX_RTT_TARGETS).map(|i| target(&format!("extra{i}"), open)));
        let started = Instant::now();
        let round = probe(&targets, Duration::from_millis(500)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(round.len(), MAX_RTT_TARGETS);
        assert_eq!(round[0].0.as_str(), "up");
        assert!(round[0].1.is_some_and(|us| us >= 1), "{:?}", round[0]);
        assert_eq!(round[1], (host("down"), None));
    }
}
