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
