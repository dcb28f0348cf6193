//! Azure Resource Manager access.
pub mod credentials;
