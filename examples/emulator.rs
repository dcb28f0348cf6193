//! Runs the ARM emulator standalone, with the same flags as
//! `vmss-capacity-controller emulator --listen ADDR [--tls --cert-out FILE]`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use vmss_capacity_controller::emulator::{serve_until, EmulatorBuilder, ThrottleLimits};

/// The ARM emulator, standalone.
#[derive(Parser, Debug)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Serve HTTPS with a generated certificate.
    #[arg(long)]
    tls: bool,
    /// Where to write the CA certificate (PEM); needs --tls.
    #[arg(long)]
    cert_out: Option<PathBuf>,
    /// How long long-running operations stay in progress, e.g. "2s".
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    lro_delay: Duration,
    /// Turn on Azure Compute's throttling limits.
    #[arg(long)]
    throttle: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut builder = EmulatorBuilder::new()
        .listen(args.listen)
        .tls(args.tls)
        .lro_delay(args.lro_delay);
    if args.throttle {
        builder = builder.throttling(ThrottleLimits::azure_compute());
    }
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve_until(builder, args.cert_out, shutdown).await?;
    Ok(())
}
