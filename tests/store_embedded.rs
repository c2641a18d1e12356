//! The store conformance suite and the model-based property test, on the embedded store.

mod support;

use std::sync::Arc;

use waitroom::store::embedded::EmbeddedStore;
use waitroom::store::Store;

store_conformance!(async { Arc::new(EmbeddedStore::new()) as Arc<dyn Store> });

#[test]
fn queue_rules_match_the_reference_model() {
    support::model::check_backend(|| Arc::new(EmbeddedStore::new()), 400, 120);
}

/// `cargo test --release --test store_embedded prequeue_opening -- --ignored --nocapture`
/// (PREQUEUE_N places, default a million): docs/PERFORMANCE.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn prequeue_opening_embedded() {
    let n = std::env::var("PREQUEUE_N").map_or(1_000_000, |v| v.parse().unwrap());
    support::conformance::measure_opening(Arc::new(EmbeddedStore::new()), n).await;
}

/// `cargo test --release --test store_embedded sale_end -- --ignored --nocapture`
/// (END_N waiting places, default a million): docs/PERFORMANCE.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn sale_end_embedded() {
    let n = std::env::var("END_N").map_or(1_000_000, |v| v.parse().unwrap());
    support::conformance::measure_end(Arc::new(EmbeddedStore::new()), n).await;
}
