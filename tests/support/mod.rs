//! Test support shared by the backend test binaries.

pub mod binary;
pub mod conformance;
pub mod conformance_schedule;
pub mod model;
#[allow(dead_code)]
pub mod nodes_ws;
#[cfg(unix)]
#[allow(dead_code)]
pub mod private;
#[allow(dead_code)]
pub mod redis;
