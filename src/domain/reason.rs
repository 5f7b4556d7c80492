//! Why support staff or an admin acted: required, trimmed, at most 2000
//! characters. Written to the audit log.

use std::fmt;

pub const MAX_REASON_CHARS: usize = 2000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditReason(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuditReasonError {
    #[error("a reason is required")]
    Missing,
    #[error("the reason is longer than {MAX_REASON_CHARS} characters")]
    TooLong,
}

impl AuditReason {
    pub fn parse(raw: &str) -> Result<Self, AuditReasonError> {
        let reason = raw.trim();
        if reason.is_empty() {
            return Err(AuditReasonError::Missing);
        }
        if reason.chars().count() > MAX_REASON_CHARS {
            return Err(AuditReasonError::TooLong);
        }
        Ok(Self(reason.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AuditReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_trimmed_required_and_bounded() {
        assert_eq!(AuditReason::parse("  outage ").unwrap().as_str(), "outage");
        assert_eq!(AuditReason::parse("   "), Err(AuditReasonError::Missing));
        assert_eq!(
            AuditReason::parse(&"x".repeat(MAX_REASON_CHARS + 1)),
            Err(AuditReasonError::TooLong)
        );
        assert!(AuditReason::parse(&"é".repeat(MAX_REASON_CHARS)).is_ok());
    }
}
