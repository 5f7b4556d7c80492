//! How failed sign-ins slow an attacker down without locking anyone out:
//! counted per (name, address) and per address, each failure past a free
//! allowance doubles the wait (capped), and the count starts again after a
//! quiet window. Nobody at another address is ever made to wait for a name.
//!
//! - An "address" is an IPv4 address, or an IPv6 /64 (one subscriber's
//!   network: rotating through it is free for an attacker).
//! - The per-name count only grows for names that belong to an account: a
//!   flood of made-up names costs nobody's account anything.
//! - A good password clears its own (name, address) count and takes back
//!   only its own tentative failure from the address's count, so a sprayer
//!   cannot wipe the address's record by signing in to their own account.

use std::net::IpAddr;

/// Failures counted for one scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Failures allowed before any wait.
    pub free: i64,
    /// The longest wait, in ms.
    pub cap_ms: i64,
}

/// A name at one address: three tries, then 1 s, 2 s, 4 s … up to 15 min.
pub const NAME_AT_ADDRESS: Policy = Policy {
    free: 3,
    cap_ms: 15 * 60 * 1000,
};

/// One address, whatever the names: thirty tries, then the same doubling.
pub const ADDRESS: Policy = Policy {
    free: 30,
    cap_ms: 15 * 60 * 1000,
};

/// Failures older than this no longer count.
pub const QUIET_WINDOW_MS: i64 = 15 * 60 * 1000;

impl Policy {
    /// How long to wait after the `failures`-th failure in a row, in ms.
    pub fn wait_after(self, failures: i64) -> i64 {
        if failures <= self.free {
            return 0;
        }
        let doublings = (failures - self.free - 1).min(30) as u32;
        (1000i64 << doublings).min(self.cap_ms)
    }
}

/// The address a sign-in is counted under: an IPv4 address as it is, an
/// IPv6 address by its /64 (an IPv4-mapped one as the IPv4 address).
pub fn address_group(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                let network = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{network}/64")
            }
        },
    }
}

/// The scope of one account's name (as uniqueness folds it) at one address.
pub fn name_scope(folded_name: &str, group: &str) -> (String, Policy) {
    (format!("name:{folded_name}@{group}"), NAME_AT_ADDRESS)
}

/// The scope of one address, whatever the names.
pub fn address_scope(group: &str) -> (String, Policy) {
    (format!("addr:{group}"), ADDRESS)
}

/// The prefix of every scope of one name (for clearing them all).
pub fn name_prefix(folded_name: &str) -> String {
    format!("name:{folded_name}@")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_after_the_free_tries_and_are_capped() {
        let waits: Vec<i64> = (1..=8).map(|n| NAME_AT_ADDRESS.wait_after(n)).collect();
        assert_eq!(waits, vec![0, 0, 0, 1000, 2000, 4000, 8000, 16000]);
        assert_eq!(NAME_AT_ADDRESS.wait_after(1_000), 15 * 60 * 1000);
    }

    #[test]
    fn scopes_keep_names_and_addresses_apart() {
        let group = address_group("192.0.2.7".parse().unwrap());
        let (a, _) = name_scope("admin", &group);
        let (b, _) = address_scope(&group);
        assert_eq!(a, "name:admin@192.0.2.7");
        assert_eq!(b, "addr:192.0.2.7");
        assert!(a.starts_with(&name_prefix("admin")));
    }

    #[test]
    fn ipv6_addresses_of_one_64_are_one_address() {
        let group = |ip: &str| address_group(ip.parse().unwrap());
        assert_eq!(group("2001:db8:1:2::1"), "2001:db8:1:2::/64");
        assert_eq!(group("2001:db8:1:2:ffff:1:2:3"), group("2001:db8:1:2::9"));
        assert_ne!(group("2001:db8:1:2::1"), group("2001:db8:1:3::1"));
        assert_eq!(group("::ffff:192.0.2.7"), "192.0.2.7");
    }
}
