//! Conformance suite (in progress).
