//! How many Keystone requests (validations of unknown tokens, sign-ins) each client may cause:
//! a token bucket per client, a minute's worth deep.
//!
//! A client is an IPv4 address, or an IPv6 /64: one host is routinely given a whole /64, so
//! keying IPv6 by full address would give it 2^64 budgets. The table is bounded; when it is full,
//! a new client takes the place of idle ones (full buckets first, then the longest unused), so a
//! flood of addresses can neither grow it nor lock newcomers out.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::time::Instant;

/// The most clients with a bucket.
pub const MAX_CLIENTS: usize = 10_000;

/// The client `address` is counted as: itself (IPv4, or IPv4 mapped into IPv6), or its /64.
pub fn client_key(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
    }
}

/// A bucket: tokens left, as of when.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Per-client token buckets (see the module docs).
#[derive(Debug)]
pub struct ClientBudget {
    buckets: HashMap<IpAddr, Bucket>,
    capacity: usize,
}

impl Default for ClientBudget {
    fn default() -> Self {
        ClientBudget::with_capacity(MAX_CLIENTS)
    }
}

impl ClientBudget {
    /// A table of at most `capacity` clients (at least one).
    pub fn with_capacity(capacity: usize) -> ClientBudget {
        ClientBudget { buckets: HashMap::new(), capacity: capacity.max(1) }
    }

    /// How many clients hold a bucket.
    pub fn clients(&self) -> usize {
        self.buckets.len()
    }

    /// Takes one request from `client`'s bucket (of `per_minute` a minute), if one is left.
    pub fn take(&mut self, client: IpAddr, per_minute: u32) -> bool {
        self.take_at(client, per_minute, Instant::now())
    }

    fn take_at(&mut self, client: IpAddr, per_minute: u32, now: Instant) -> bool {
        let key = client_key(client);
        let depth = f64::from(per_minute);
        if !self.buckets.contains_key(&key) && self.buckets.len() >= self.capacity {
            self.make_room(depth, now);
        }
        let bucket = self.buckets.entry(key).or_insert(Bucket { tokens: depth, at: now });
        let tokens = refilled(*bucket, depth, now);
        if tokens < 1.0 {
            return false;
        }
        *bucket = Bucket { tokens: tokens - 1.0, at: now };
        true
    }

    /// Frees at least one place: the clients whose buckets are full again (quiet for a minute)
    /// go; if none is, the eighth of the table unused longest, so that a flood of new clients
    /// pays for this pass once per many of them.
    fn make_room(&mut self, depth: f64, now: Instant) {
        self.buckets.retain(|_, bucket| refilled(*bucket, depth, now) < depth);
        if self.buckets.len() < self.capacity {
            return;
        }
        let mut last_used: Vec<Instant> = self.buckets.values().map(|bucket| bucket.at).collect();
        let evict = (self.capacity / 8).max(1);
        let (_, cutoff, _) = last_used.select_nth_unstable(evict - 1);
        let cutoff = *cutoff;
        let mut evicted = 0;
        self.buckets.retain(|_, bucket| {
            let keep = bucket.at > cutoff || evicted >= evict;
            if !keep {
                evicted += 1;
            }
            keep
        });
    }
}

fn refilled(bucket: Bucket, depth: f64, now: Instant) -> f64 {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    (bucket.tokens + elapsed * depth / 60.0).min(depth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn each_client_gets_a_minutes_worth() {
        let mut budget = ClientBudget::default();
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        assert_eq!((0..25).filter(|_| budget.take(a, 20)).count(), 20);
        assert!(budget.take(b, 20), "other clients keep theirs");
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(client_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(client_key(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")), ip("2001:db8:1:2::"));
        assert_ne!(client_key(ip("2001:db8:1:3::1")), ip("2001:db8:1:2::"));
        assert_eq!(client_key(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(client_key(ip("192.0.2.7")), ip("192.0.2.7"));

        let mut budget = ClientBudget::default();
        let taken = (0u32..100)
            .filter(|i| budget.take(ip(&format!("2001:db8:1:2:{i:x}::{i:x}")), 10))
            .count();
        assert_eq!(taken, 10, "a /64 shares one budget however many addresses it uses");
        assert!(budget.take(ip("2001:db8:1:3::1"), 10), "the next /64 has its own");
        assert!(!budget.take(ip("::ffff:10.0.0.1"), 0));
    }

    #[test]
    fn a_full_table_makes_room_for_new_clients_and_never_refuses_them() {
        let mut budget = ClientBudget::with_capacity(100);
        let start = Instant::now();
        // 100 busy clients, each with a request spent, fill the table.
        for i in 0..100u32 {
            let at = start + Duration::from_millis(u64::from(i));
            assert!(budget.take_at(ip(&format!("10.0.{}.{}", i / 256, i % 256)), 60, at));
        }
        assert_eq!(budget.clients(), 100);
        // A flood of new addresses: each is served its first request, and the table stays bounded.
        for i in 0..1_000u32 {
            let at = start + Duration::from_millis(200 + u64::from(i));
            let address = ip(&format!("10.1.{}.{}", i / 256, i % 256));
            assert!(budget.take_at(address, 60, at), "new client {i} refused");
            assert!(budget.clients() <= 100);
        }
        // The longest unused went first: the latest newcomers still hold their spent buckets.
        let latest = ip("10.1.3.231");
        let at = start + Duration::from_millis(1_200);
        let depth_left = (0..100).filter(|_| budget.take_at(latest, 60, at)).count();
        assert_eq!(depth_left, 59, "its first request is still counted");
    }

    #[test]
    fn quiet_clients_make_room_before_busy_ones() {
        let mut budget = ClientBudget::with_capacity(10);
        let start = Instant::now();
        let busy = ip("192.0.2.1");
        for _ in 0..30 {
            budget.take_at(busy, 30, start + Duration::from_secs(61));
        }
        for i in 0..9u32 {
            assert!(budget.take_at(ip(&format!("198.51.100.{i}")), 30, start));
        }
        // A minute later the nine are full again: they go, the spent one stays spent.
        let later = start + Duration::from_secs(62);
        assert!(budget.take_at(ip("203.0.113.1"), 30, later));
        assert_eq!(budget.clients(), 2);
        assert!(!budget.take_at(busy, 30, later), "a busy client's spent budget is kept");
    }
}
