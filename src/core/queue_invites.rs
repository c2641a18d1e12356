//! Invite codes on [`EventQueue`]: the rule a join meets on an invite-only event, and the
//! codes an admin adds or a restart puts back. Which place a code seats is kept with the
//! code (`InviteHolder`), so a code seats one person only.

use super::*;

impl EventQueue {
    /// The invite rule: `Ok(Some(code))` for an unused code that a new place will bind,
    /// `Ok(None)` when no binding is due (a public event, or the code's own user again,
    /// proven: the id alone does not make a caller that user).
    pub(super) fn check_invite(
        &self,
        user_id: Option<&str>,
        proof: JoinProof<'_>,
    ) -> Result<Option<Box<str>>, QueueError> {
        if self.config.access != Access::Invite {
            return Ok(None);
        }
        let code = proof.invite.ok_or(QueueError::InviteRequired)?;
        match self.invites.get(code) {
            None => Err(QueueError::InviteInvalid),
            Some(None) => Ok(Some(code.into())),
            Some(Some(InviteHolder::User(u))) if proof.proven && Some(&**u) == user_id => Ok(None),
            Some(Some(_)) => Err(QueueError::InviteInvalid),
        }
    }

    /// Adds invite codes, unused; a code already known is left as it is. Answers how many
    /// were new.
    pub fn add_invites(&mut self, codes: &[String], fx: &mut Vec<Effect>) -> u64 {
        let mut added = Vec::new();
        for c in codes {
            if !self.invites.contains_key(c.as_str()) {
                let code: Box<str> = c.as_str().into();
                self.invites.insert(code.clone(), None);
                added.push(code);
            }
        }
        let n = added.len() as u64;
        if n > 0 {
            fx.push(Effect::Invited { codes: added });
        }
        n
    }

    /// The codes after `after` in byte order, at most `limit`, each with what it is bound
    /// to (`None`: unused). The codes are not kept in order (a lookup per join is what
    /// counts), so a page sorts those after `after`: an admin's read, not a join's.
    pub fn invite_page(&self, after: &str, limit: usize) -> Vec<(Box<str>, Option<InviteHolder>)> {
        let mut page: Vec<_> = self
            .invites
            .iter()
            .filter(|(c, _)| &***c > after)
            .map(|(c, h)| (c.clone(), h.clone()))
            .collect();
        page.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        page.truncate(limit);
        page
    }

    /// Puts back the invite codes read from disk (after [`Self::restore`]).
    pub fn restore_invites(
        &mut self,
        invites: impl IntoIterator<Item = (Box<str>, Option<InviteHolder>)>,
    ) {
        self.invites.extend(invites);
    }
}
