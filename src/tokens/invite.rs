//! Invite codes (`POST /admin/events/{id}/invites`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;

/// A fresh invite code: 96 bits from the CSPRNG as 16 URL-safe characters, never starting
/// with `-`: a spreadsheet opening the CSV of codes reads such a cell as a formula and
/// shows an error in its place (1 code in 64). Drawn again then, which leaves ~95.98 bits.
pub fn invite_code() -> String {
    loop {
        let mut b = [0u8; 12];
        getrandom::fill(&mut b).expect("the OS random source is available");
        let code = B64.encode(b);
        if !code.starts_with('-') {
            return code;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No code a spreadsheet would read as a formula (1 in 64 drawn would start with `-`:
    /// 20,000 codes without one would happen by chance with odds of about e^-312).
    #[test]
    fn invite_codes_never_start_like_a_formula() {
        for _ in 0..20_000 {
            let c = invite_code();
            assert_eq!(c.len(), 16);
            assert!(!c.starts_with(['-', '=', '+', '@']), "{c}");
            assert!(c
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        }
    }
}
