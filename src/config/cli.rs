//! The command line: `waitroom [serve|healthcheck|keygen] [FLAGS]`. The settings' flags are the fields of
//! [`Layered`] (the same struct every layer fills); this module adds what only the command
//! line has: the subcommand, `--config`, and the `--demo` / `--no-demo` pair.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::layers::Layered;

/// The variable that names the TOML file when `--config` is not given.
pub const CONFIG_ENV: &str = "WAITROOM_CONFIG";

/// The command line: `waitroom [serve] [FLAGS]`. With no subcommand the flags of `serve`
/// apply directly, so a bare `waitroom` serves.
#[derive(Debug, Parser)]
#[command(
    name = "waitroom",
    version,
    about = "A virtual waiting room: fair queues, exact positions, paced admission, signed access tokens.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Flags of `serve`, accepted without the subcommand too.
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the server (the default when no subcommand is given).
    Serve(ServeArgs),
    /// Ask the server that `serve` with the same settings runs whether it is up (GET
    /// /healthz on its listening address); exit 0 when it answers 200, 1 otherwise. For
    /// container health checks: the image needs no curl.
    Healthcheck(ServeArgs),
    /// Write a new Ed25519 signing key to DIR/signing-key.pem (mode 0600) and print its
    /// path; an existing key there is kept. For nodes that must share one key (Redis).
    Keygen {
        /// Directory of the key file (created when missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

impl Cli {
    /// The flags of the `serve` command, however it was spelled.
    pub fn serve_args(&self) -> &ServeArgs {
        match &self.command {
            Some(Command::Serve(a)) | Some(Command::Healthcheck(a)) => a,
            Some(Command::Keygen { .. }) | None => &self.serve,
        }
    }
}

/// Flags of `waitroom serve`. Each overrides the same setting from every other layer, and
/// only when it is given: an absent flag leaves the lower layers' value alone.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with settings; environment variables and flags override it. [env: WAITROOM_CONFIG]
    // Not clap's `env`: it takes `WAITROOM_CONFIG=` (how env files and compose write an
    // unset value) as an empty `--config` and refuses it naming the flag, where every
    // other `WAITROOM_*` set empty counts as unset. See [`ServeArgs::config_file`].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The settings given as flags.
    #[command(flatten)]
    pub settings: Layered,
    /// Create a small `demo` event with a simulated crowd (default: on for the embedded store). [env: WAITROOM_DEMO]
    #[arg(long, overrides_with = "no_demo")]
    pub demo: bool,
    /// Do not create the demo event.
    #[arg(long, overrides_with = "demo")]
    pub no_demo: bool,
}

impl ServeArgs {
    /// The TOML file to read: `--config`, or else `WAITROOM_CONFIG` unless it is empty.
    pub fn config_file(&self) -> Option<PathBuf> {
        self.config.clone().or_else(|| {
            std::env::var_os(CONFIG_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
    }

    /// The flag layer: the settings given as flags, `demo` included.
    pub fn layer(&self) -> Layered {
        Layered {
            demo: match (self.demo, self.no_demo) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            ..self.settings.clone()
        }
    }
}
