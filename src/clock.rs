//! The time source. Production reads the wall clock; tests hold a [`Clock::manual`] clock
//! and move it forward by hand, so expiry and pacing are tested without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::core::Millis;

/// Milliseconds since the Unix epoch from the system clock.
pub fn system_now() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

#[derive(Clone, Debug, Default)]
pub struct Clock {
    /// `None`: the system clock. `Some`: a manual clock shared by its clones.
    manual: Option<Arc<AtomicU64>>,
}

impl Clock {
    pub fn system() -> Self {
        Clock { manual: None }
    }

    pub fn manual(start: Millis) -> Self {
        Clock {
            manual: Some(Arc::new(AtomicU64::new(start))),
        }
    }

    pub fn now(&self) -> Millis {
        match &self.manual {
            Some(m) => m.load(Ordering::SeqCst),
            None => system_now(),
        }
    }

    /// Moves a manual clock forward; does nothing to the system clock.
    pub fn advance(&self, ms: Millis) {
        if let Some(m) = &self.manual {
            m.fetch_add(ms, Ordering::SeqCst);
        }
    }
}
