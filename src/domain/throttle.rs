//! How failed sign-ins slow an attacker down without locking anyone out:
//! counted per (name, address) and per address, each failure past a free
//! allowance doubles the wait (capped), and the count starts again after a
//! quiet window. Nobody at another address is ever made to wait for a name.

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

/// The throttle scopes of a sign-in: the name at this address, and the
/// address alone.
pub fn scopes(name: &str, address: &str) -> [(String, Policy); 2] {
    [
        (format!("name:{name}@{address}"), NAME_AT_ADDRESS),
        (format!("addr:{address}"), ADDRESS),
    ]
}

/// The prefix of every scope of one name (for clearing them all).
pub fn name_prefix(name: &str) -> String {
    format!("name:{name}@")
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
        let [(a, _), (b, _)] = scopes("admin", "192.0.2.7");
        assert_eq!(a, "name:admin@192.0.2.7");
        assert_eq!(b, "addr:192.0.2.7");
        assert!(a.starts_with(&name_prefix("admin")));
    }
}
