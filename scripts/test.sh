#!/usr/bin/env bash
# The project's one test command, for developers and CI alike:
#   1. installs what the checks need and is missing (guarded by `command -v`, so a machine
#      that has everything installs nothing);
#   2. checks formatting, lints, and runs every test target.
# Plain `cargo test` output is kept on purpose: CI and people read its `test result:` lines.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

have() { command -v "$1" >/dev/null 2>&1; }

# apt_install PKG...: installs Debian packages (as root, or through sudo when available).
# `apt-get update` runs once per script run, only when something is to be installed.
APT_UPDATED=""
apt_install() {
    if ! have apt-get; then
        echo "test.sh: cannot install $* (no apt-get); install it by hand" >&2
        return 1
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if have sudo; then sudo="sudo"; else
            echo "test.sh: cannot install $* (not root, no sudo)" >&2
            return 1
        fi
    fi
    if [ -z "$APT_UPDATED" ]; then
        $sudo apt-get update -qq
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@"
}

ensure_tools() {
    if ! have cargo; then
        echo "test.sh: cargo not found; install a Rust toolchain (rustup) first" >&2
        exit 1
    fi
    if ! cargo fmt --version >/dev/null 2>&1; then rustup component add rustfmt; fi
    if ! cargo clippy --version >/dev/null 2>&1; then rustup component add clippy; fi

    # The Redis backend's tests start their own redis-server processes (standalone and a
    # three-master Cluster made with redis-cli); Debian's redis-server brings redis-cli.
    { have redis-server && have redis-cli; } || apt_install redis-server
    # The browser tests (tests/browser.rs) drive Debian's chromium through chromedriver;
    # a Korean font lets the Korean page render (and its screenshot show) real glyphs.
    { have chromium && have chromedriver; } || apt_install chromium chromium-driver
    # The auth_request test (tests/gateway.rs) runs Debian's nginx in front of a small origin
    # (started by the test on a free port with its own temp dir; the system nginx is never
    # touched). nginx installs in /usr/sbin, outside a non-root PATH.
    { have nginx || [ -x /usr/sbin/nginx ]; } || apt_install nginx
    if have fc-list && ! fc-list :lang=ko | grep -q .; then apt_install fonts-nanum; fi
}

# A whole-suite run gains nothing from incremental caches, which roughly double what our own
# crate writes to target/ (set CARGO_INCREMENTAL=1 to keep them while iterating).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step() { printf '\n==> %s\n' "$*"; }

ensure_tools

# A cold run writes about 3.5 GB into target/ (debug builds of ~30 test binaries). A disk that
# fills mid-link shows up as an odd linker crash ("ld terminated with signal 7 [Bus error]"),
# so say up front how much room there is.
mkdir -p target
avail_kb=$(df -Pk target | awk 'NR==2 {print $4}')
step "free space for target/: $((avail_kb / 1024)) MiB"
if [ "${avail_kb:-0}" -lt 5242880 ]; then
    echo "test.sh: warning: less than 5 GiB free where target/ lives; the build may fail to link" >&2
fi

step "cargo fmt --check"
cargo fmt --all -- --check

# `--workspace`: the server and the origin library (crates/waitroom-guard). A bare
# `cargo test` at the root still runs the server's targets alone.
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test --workspace --all-targets"
cargo test --workspace --all-targets
