//! Azure Resource Manager access.
