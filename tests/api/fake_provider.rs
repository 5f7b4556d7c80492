//! Placeholder: written by a helper.
