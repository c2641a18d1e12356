//! The structural invariants of an [`EventQueue`], checked by tests after every step (a
//! child module of `queue.rs`, for its private fields).

use super::super::schedule::in_prequeue;
use super::EventQueue;
use crate::core::{Millis, PlaceState};

impl EventQueue {
    /// Checks the structural invariants; used by tests after every step.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let waiting = self
            .places
            .values()
            .filter(|p| p.state == PlaceState::Waiting)
            .count() as u64;
        let admitted = self
            .places
            .values()
            .filter(|p| p.state == PlaceState::Admitted)
            .count() as u64;
        let active = self
            .places
            .values()
            .filter(|p| p.state == PlaceState::Active)
            .count() as u64;
        if waiting != self.waiting_len() || admitted != self.admitted || active != self.active {
            return Err(format!(
                "counts drifted: waiting {waiting}/{} admitted {admitted}/{} active {active}/{}",
                self.waiting_len(),
                self.admitted,
                self.active
            ));
        }
        for (seq, p) in self.places.iter() {
            if let Some(u) = &p.user_id {
                if self.users.get(u, &self.places) != Some(seq) {
                    return Err(format!("the user index does not lead {u} to place {seq}"));
                }
            }
        }
        let with_user = self.places.values().filter(|p| p.user_id.is_some()).count();
        if with_user != self.users.len() {
            return Err("a user holds two places".into());
        }
        // Which line a waiting place is in is derived from the settings: it must be the
        // line that holds it.
        let pre: Vec<Millis> = self
            .places
            .values()
            .filter(|p| {
                p.state == PlaceState::Waiting && in_prequeue(self.config.opens_at, p.joined_at)
            })
            .map(|p| p.joined_at)
            .collect();
        if pre.len() as u64 != self.pre.len() {
            return Err(format!(
                "the pre-queue holds {} places, {} waiting places joined before the opening",
                self.pre.len(),
                pre.len()
            ));
        }
        if pre.iter().any(|&t| t > self.pre_last_join) {
            return Err("a pre-queue place joined after the pre-queue's latest join".into());
        }
        self.inventory.check()?;
        for seq in self.inventory.holders() {
            if self.places.get(&seq).map(|p| p.state) != Some(PlaceState::Active) {
                return Err(format!("place {seq} holds items without a session"));
            }
        }
        Ok(())
    }
}
