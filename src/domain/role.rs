//! User roles, enforced on the server.

use super::ids::text_enum;

text_enum! {
    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    stored pub enum Role {
        User = "user",
        Support = "support",
        Admin = "admin",
    }
}

impl Role {
    /// Support staff and admins resolve unknown attempts and act on others' jobs.
    pub fn is_staff(self) -> bool {
        matches!(self, Self::Support | Self::Admin)
    }

    pub fn is_admin(self) -> bool {
        self == Self::Admin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_and_unknown_roles_are_refused() {
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("root"), None);
    }

    #[test]
    fn only_support_and_admin_are_staff() {
        assert!(!Role::User.is_staff());
        assert!(Role::Support.is_staff());
        assert!(Role::Admin.is_staff());
        assert!(!Role::Support.is_admin());
    }
}
