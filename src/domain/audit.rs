//! What the audit log records that staff did: the action, one of a closed
//! set, stored as its text in `audit_log.action`.

use super::ids::text_enum;

text_enum! {
    /// An action written to the audit log.
    stored pub enum AuditAction {
        /// Support started an attempt on someone's job.
        StartAttempt = "start_attempt",
        /// Support finalized a job as failed.
        FailJob = "fail_job",
        /// Support abandoned an unknown attempt.
        AbandonAttempt = "abandon_attempt",
        /// Staff ran a provider's qualification.
        Qualify = "qualify",
        AddUser = "add_user",
        ResetPassword = "reset_password",
        RevokeTokens = "revoke_tokens",
        DisableUser = "disable_user",
        EnableUser = "enable_user",
        SetRole = "set_role",
        /// An admin set an owner's monthly budget.
        SetBudget = "set_budget",
        /// An admin removed an owner's budget.
        RemoveBudget = "remove_budget",
    }
}

impl AuditAction {
    /// How the console and the job page name it to people.
    pub fn label(self) -> &'static str {
        match self {
            Self::StartAttempt => "start attempt",
            Self::FailJob => "fail job",
            Self::AbandonAttempt => "abandon attempt",
            Self::Qualify => "qualify",
            Self::AddUser => "add user",
            Self::ResetPassword => "reset password",
            Self::RevokeTokens => "revoke tokens",
            Self::DisableUser => "disable user",
            Self::EnableUser => "enable user",
            Self::SetRole => "set role",
            Self::SetBudget => "set budget",
            Self::RemoveBudget => "remove budget",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_actions_round_trip_and_read_as_words() {
        for action in AuditAction::ALL {
            assert_eq!(AuditAction::parse(action.as_str()), Some(action));
            assert!(!action.label().contains('_'), "{action}");
        }
        assert_eq!(AuditAction::AbandonAttempt.label(), "abandon attempt");
        assert_eq!(AuditAction::parse("drop_table"), None);
    }
}
