//! Failover order and the gate on it: a job tries the provider its owner
//! named (if any), then the task's chain; automatic failover and new attempts
//! go only to the job's primary and to providers whose contract
//! qualification is current and passed.

use super::Timestamp;

/// The order in which a job tries providers: the provider the user named first
/// (if any), then the task's chain in its configured order.
pub fn failover_order<'a>(chain: &'a [String], requested: Option<&'a str>) -> Vec<&'a str> {
    let mut order: Vec<&str> = Vec::with_capacity(chain.len() + 1);
    if let Some(first) = requested {
        order.push(first);
    }
    for name in chain {
        if !order.contains(&name.as_str()) {
            order.push(name);
        }
    }
    order
}

/// The next provider to try: the first in the failover order that this job has
/// not tried yet, or `None` when the chain is exhausted.
pub fn next_provider<'a>(order: &[&'a str], tried: &[String]) -> Option<&'a str> {
    order
        .iter()
        .copied()
        .find(|name| !tried.iter().any(|t| t == name))
}

/// Where a (provider, task) pair stands with respect to the task's contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QualificationStatus {
    /// The latest run passed and still matches the provider's model and the
    /// task's template and output schema.
    Qualified {
        at: Timestamp,
    },
    /// The latest current run failed; the first failing check.
    Failed {
        at: Timestamp,
        check: String,
    },
    /// The latest run was for another model, template or output schema.
    Stale {
        at: Timestamp,
    },
    Never,
}

impl QualificationStatus {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Qualified { .. } => "qualified",
            Self::Failed { .. } => "failed",
            Self::Stale { .. } => "stale",
            Self::Never => "never",
        }
    }

    pub fn is_qualified(&self) -> bool {
        matches!(self, Self::Qualified { .. })
    }

    /// When the run this status comes from was made.
    pub fn at(&self) -> Option<Timestamp> {
        match self {
            Self::Qualified { at } | Self::Failed { at, .. } | Self::Stale { at } => Some(*at),
            Self::Never => None,
        }
    }
}

/// The providers a job may use, in order, and the ones the gate skipped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllowedProviders {
    /// The job's primary first, then qualified fallbacks.
    pub allowed: Vec<String>,
    /// Skipped providers with their status, e.g. `sim-b (stale)`.
    pub skipped: Vec<String>,
}

impl AllowedProviders {
    /// The gate: the job's primary (the first of `order`) always, then only
    /// providers whose status is qualified.
    pub fn gate(order: &[&str], status: impl Fn(&str) -> QualificationStatus) -> Self {
        let mut gated = Self::default();
        for (i, name) in order.iter().enumerate() {
            let status = status(name);
            if i == 0 || status.is_qualified() {
                gated.allowed.push((*name).to_owned());
            } else {
                gated.skipped.push(format!("{name} ({})", status.label()));
            }
        }
        gated
    }

    pub fn allows(&self, provider: &str) -> bool {
        self.allowed.iter().any(|a| a == provider)
    }

    /// The skipped entry for `provider`, e.g. `sim-b (stale)`.
    pub fn skipped_entry(&self, provider: &str) -> Option<&str> {
        let prefix = format!("{provider} (");
        self.skipped
            .iter()
            .find(|s| s.starts_with(&prefix))
            .map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_order_puts_the_requested_provider_first_without_repeats() {
        let chain = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        assert_eq!(failover_order(&chain, None), vec!["a", "b", "c"]);
        assert_eq!(failover_order(&chain, Some("b")), vec!["b", "a", "c"]);
    }

    #[test]
    fn next_provider_skips_tried_ones_and_ends_when_exhausted() {
        let order = ["a", "b"];
        assert_eq!(next_provider(&order, &[]), Some("a"));
        assert_eq!(next_provider(&order, &["a".to_owned()]), Some("b"));
        assert_eq!(
            next_provider(&order, &["a".to_owned(), "b".to_owned()]),
            None
        );
    }

    #[test]
    fn the_primary_is_always_allowed_and_fallbacks_need_a_current_pass() {
        let gated = AllowedProviders::gate(&["a", "b", "c", "d"], |name| match name {
            "a" => QualificationStatus::Never,
            "b" => QualificationStatus::Stale {
                at: Timestamp::from_millis(1),
            },
            "c" => QualificationStatus::Qualified {
                at: Timestamp::from_millis(1),
            },
            _ => QualificationStatus::Failed {
                at: Timestamp::from_millis(1),
                check: "x".into(),
            },
        });
        assert_eq!(gated.allowed, vec!["a", "c"]);
        assert_eq!(gated.skipped, vec!["b (stale)", "d (failed)"]);
        assert!(gated.allows("c") && !gated.allows("b"));
        assert_eq!(gated.skipped_entry("b"), Some("b (stale)"));
    }
}
