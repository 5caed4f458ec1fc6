//! `wringer`: the coordinator and rank worker.

use clap::Parser;

/// Puts collective-communication transports through the wringer.
#[derive(Parser)]
#[command(name = "wringer", version, about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
}
