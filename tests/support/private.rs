//! Checks that a directory tree is private to its owner (directories `0700`, files `0600`).
//! Included by path (`#[path = "support/private.rs"]`) so test binaries that need only this
//! do not compile the whole support module.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Asserts every directory under `root` (itself included) is `0700` and every file `0600`;
/// answers how many files it checked.
pub fn assert_private_tree(root: &Path) -> usize {
    let mut files = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{} is {mode:o}", d.display());
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let mode = e.metadata().unwrap().permissions().mode() & 0o777;
                assert_eq!(mode, 0o600, "{} is {mode:o}", e.path().display());
                files += 1;
            }
        }
    }
    files
}
