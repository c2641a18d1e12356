//! The `waitroom` binary: reads the settings, sets up logging, binds the listener and hands
//! over to [`waitroom::server::run`] until SIGTERM or Ctrl-C. Everything else lives in the
//! library, so tests start the same server in-process.
//!
//! Exit codes: 0 after a clean shutdown, 2 for a malformed command line or invalid
//! settings, 1 when the server cannot start or fails. `waitroom healthcheck` exits 0 when
//! the server with the same settings answers `/healthz`, 1 otherwise, even for a malformed
//! command line or invalid settings: a container runtime reserves 2 (Docker's
//! `HEALTHCHECK` documents it as "do not use").

use std::process::ExitCode;

use waitroom::config::{Cli, Command, Settings};
use waitroom::{server, telemetry};

/// mimalloc instead of glibc's malloc: under join load glibc's malloc and free were 17-19 %
/// of the server's CPU (docs/PERFORMANCE.md, "The allocator"). Set here and in the bench
/// binaries (whose reference server, the ceiling, must run on the same allocator), never
/// in the library: a test binary keeps the allocator it chooses (tests/allocations.rs).
/// `waitroom::alloc::MiMalloc` asks mimalloc through its plain calls where they align enough.
#[global_allocator]
static ALLOCATOR: waitroom::alloc::MiMalloc = waitroom::alloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    use clap::Parser as _;
    waitroom::alloc::small_pages_only();
    // clap prints usage and exits with status 2 on a malformed command line; 1 for a
    // health check's.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() && std::env::args().any(|a| a == "healthcheck") => {
            let _ = e.print();
            return ExitCode::FAILURE;
        }
        Err(e) => e.exit(),
    };
    let healthcheck = matches!(cli.command, Some(Command::Healthcheck(_)));
    if let Some(Command::Keygen { dir }) = &cli.command {
        return match waitroom::tokens::load_or_generate_key(None, dir) {
            Ok(_) => {
                telemetry::stdout_line(format_args!("{}", dir.join("signing-key.pem").display()));
                ExitCode::SUCCESS
            }
            Err(e) => {
                // The error alone ("File exists") does not say where.
                telemetry::stderr_line(format_args!(
                    "waitroom: cannot write a key into {}: {e:#}",
                    dir.display()
                ));
                ExitCode::FAILURE
            }
        };
    }
    let settings = match Settings::load(cli.serve_args()) {
        Ok(s) => s,
        Err(e) => {
            telemetry::stderr_line(format_args!("waitroom: {e}"));
            return if healthcheck {
                ExitCode::FAILURE
            } else {
                ExitCode::from(2)
            };
        }
    };
    if healthcheck {
        return match server::healthcheck(&settings.listen).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                telemetry::stderr_line(format_args!("waitroom: unhealthy: {e}"));
                ExitCode::FAILURE
            }
        };
    }
    // Before logging, which adds the layer that turns request spans into exported ones.
    let export = match settings
        .otlp_endpoint
        .as_deref()
        .map(telemetry::otel::install)
    {
        None => None,
        Some(Ok(export)) => Some(export),
        Some(Err(e)) => {
            telemetry::stderr_line(format_args!("waitroom: {e}"));
            return ExitCode::FAILURE;
        }
    };
    telemetry::init_logging(settings.log_format.as_str());
    for variable in waitroom::config::layers::unknown_env() {
        tracing::warn!(%variable, "not a setting of waitroom: ignored (misspelt?)");
    }
    if let Some(characters) = settings.short_admin_token() {
        tracing::warn!(
            characters,
            "the admin token is short: whoever guesses it runs the sale and proves joins; use \
             32 random characters or more (unset, one of 64 is generated)"
        );
    }
    // From here on, the error that stops the server is a log line in the chosen format: a
    // collector that reads JSON lines would otherwise lose the one that says why.
    let json = settings.log_format.as_str() == "json";
    let fatal = |message: String| {
        if json {
            tracing::error!("{message}");
        } else {
            telemetry::stderr_line(format_args!("waitroom: {message}"));
        }
        ExitCode::FAILURE
    };

    // Installed before anything slow, so an early SIGTERM already shuts down cleanly.
    let shutdown = server::shutdown_signal();
    let listener = match tokio::net::TcpListener::bind(&settings.listen).await {
        Ok(l) => l,
        Err(e) => return fatal(format!("cannot listen on {}: {e}", settings.listen)),
    };
    let result = server::run(settings, listener, shutdown).await;
    // The spans of the last requests are still batched: send them before exiting.
    if let Some(export) = export {
        export.shutdown().await;
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fatal(format!("{e:#}")),
    }
}
