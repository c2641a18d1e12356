//! The layering of `src/` as docs/ARCHITECTURE.md draws it: every top-level module imports
//! only from modules below it, so there is no import circle and no upward import. This test
//! reads the sources (code only: comments and test modules are skipped) and fails on an
//! arrow that points the wrong way, naming the file. It also keeps every file under 1,000
//! lines.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules from the bottom up. A module may import from those before it only.
const LAYERS: &[&str] = &[
    "alloc",
    "core",
    "clock",
    "tokens",
    "pow",
    "telemetry",
    "store",
    "tasks",
    "audit",
    "history",
    "catalog",
    "gates",
    "config",
    "scheduler",
    "live",
    "demo",
    "background",
    "app",
    "http",
    "gateway",
    "server",
];

/// Files (under `src/`) that are not modules of the library: they may use anything.
const ROOTS: &[&str] = &["lib.rs", "main.rs"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    files_ending(dir, "rs", out);
}

fn files_ending(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_ending(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`src/store/redis/mod.rs` → `store`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The crate modules a file's code names as `crate::x`, skipping comments and everything
/// from the first `#[cfg(test)]` on (unit tests may reach anywhere).
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("#[cfg(test)]") {
            break;
        }
        let code = match code.find("//") {
            Some(i) => &code[..i],
            None => code,
        };
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn every_import_points_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for file in &files {
        let module = module_of(&src, file);
        if ROOTS.contains(&format!("{module}.rs").as_str()) {
            continue;
        }
        let Some(level) = LAYERS.iter().position(|m| *m == module) else {
            wrong.push(format!(
                "{}: module `{module}` is not in LAYERS (place it in the layering)",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for used in imports(&text) {
            seen += 1;
            if used == module {
                continue;
            }
            match LAYERS.iter().position(|m| *m == used) {
                Some(l) if l < level => {}
                Some(_) => wrong.push(format!(
                    "{}: `{module}` imports `crate::{used}`, which is above it",
                    file.display()
                )),
                None => wrong.push(format!(
                    "{}: `{module}` imports `crate::{used}`, an unknown module",
                    file.display()
                )),
            }
        }
    }
    assert!(seen > 50, "found only {seen} imports: is the scan broken?");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_scan_sees_an_upward_import() {
    let text = "use crate::core::X;\n// use crate::server;\nfn f() { crate::http::router(); }\n\
                #[cfg(test)]\nmod tests { use crate::server; }";
    let found: Vec<String> = imports(text).into_iter().collect();
    assert_eq!(found, vec!["core".to_string(), "http".to_string()]);
}

/// Files stay small enough to read whole: a file past this is a sign that helper types or
/// a second concern want a module of their own.
#[test]
fn no_source_file_is_over_1000_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // The Redis store's Lua is source too (its rules run there).
    files_ending(&src, "lua", &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 1000).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}
