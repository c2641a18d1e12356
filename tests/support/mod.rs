//! Test support shared by the backend test binaries.

pub mod binary;
pub mod conformance;
pub mod model;
