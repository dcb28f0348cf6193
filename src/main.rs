//! Entry point: parse flags, start telemetry, dispatch to [`vmss_capacity_controller::cli`].

use clap::Parser;
use std::io::IsTerminal;
use vmss_capacity_controller::cli::{self, Cli, Command, ExitCode, LogFormat};

fn init_tracing(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("invalid log filter {filter:?} ({e}); using \"info\"");
        tracing_subscriber::EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        LogFormat::Text => builder
            .with_target(false)
            .with_ansi(cli::log_colour(
                std::io::stderr().is_terminal(),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
            .init(),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Cli::parse();
    // The demo draws its own screen; its controller logs only warnings unless asked.
    let filter = match (&args.command, std::env::var_os("RUST_LOG")) {
        #[cfg(feature = "emulator")]
        (Command::Demo(_), None) if args.log_level == "info" => "warn",
        _ => args.log_level.as_str(),
    };
    init_tracing(args.log_format, filter);
    let result = match args.command {
        Command::Run(a) => cli::run(a).await,
        #[cfg(feature = "emulator")]
        Command::Demo(a) => vmss_capacity_controller::demo::run(a).await,
        #[cfg(feature = "emulator")]
        Command::Emulator(a) => cli::emulator(a).await,
        Command::Get(a) => cli::get(a).await,
        Command::Scale(a) => cli::scale(a).await,
        Command::CheckConfig(a) => Ok(cli::check_config(&a)),
        Command::Explain(a) => cli::explain(a).await,
    };
    match result {
        Ok(ExitCode(code)) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
