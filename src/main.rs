//! The `waitroom` binary: reads the settings, sets up logging, binds the listener and hands
//! over to [`waitroom::server::run`] until SIGTERM or Ctrl-C. Everything else lives in the
//! library, so tests start the same server in-process.
//!
//! Exit codes: 0 after a clean shutdown, 2 for a malformed command line or invalid
//! settings, 1 when the server cannot start or fails.

use std::process::ExitCode;

use waitroom::config::{Cli, Settings};
use waitroom::{server, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    use clap::Parser as _;
    // clap prints usage and exits with status 2 on a malformed command line.
    let cli = Cli::parse();
    let settings = match Settings::load(cli.serve_args()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("waitroom: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init_logging(settings.log_format.as_str());

    // Installed before anything slow, so an early SIGTERM already shuts down cleanly.
    let shutdown = server::shutdown_signal();
    let listener = match tokio::net::TcpListener::bind(&settings.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("waitroom: cannot listen on {}: {e}", settings.listen);
            return ExitCode::FAILURE;
        }
    };
    match server::run(settings, listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("waitroom: {e:#}");
            ExitCode::FAILURE
        }
    }
}
