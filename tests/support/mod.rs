//! Test support shared by the backend test binaries.

pub mod binary;
pub mod conformance;
pub mod model;
#[allow(dead_code)]
pub mod redis;
