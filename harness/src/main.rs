//! `wringer`: the coordinator (`run`, `list`, `probe`, `validate`, `bench`, `report`) and the
//! rank worker (`rank`), one module each under `cli/`.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use wringer::model::input::InputError;
use wringer::outputs::progress::printable;

/// Puts collective-communication transports through the wringer.
#[derive(Parser)]
#[command(name = "wringer", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenarios and write a report (exit 0: all passed or skipped, 1: a failure, 2: bad input).
    Run(cli::run::Args),
    /// The lifecycle audit (and perturbations) on any command, no scenario file: `wringer
    /// audit -- ./my_test` (exit 1: a violation, with its evidence and a replay line).
    Audit(cli::audit::Args),
    /// Shrink a failed attempt (`wringer run --shrink`): the same arguments as `run`, with the
    /// failed attempt's --seed and --attempt from its replay line.
    Shrink(cli::run::Args),
    /// List scenarios with their requirements and whether this host profile can run them.
    List(cli::list::Args),
    /// Show what each host of the profile has (probed on the host itself, over SSH for remote
    /// profiles). Without --hosts: this machine.
    Probe(cli::probe::Args),
    /// Parse and check scenario and host files only.
    Validate(cli::validate::Args),
    /// Measure the transport and the coordinator against the reference tools (sockperf,
    /// iperf3) in one run; prints a ratio table and writes bench.json and bench.md.
    Bench(cli::bench::Args),
    /// Write one self-contained HTML page from run folders and the history of earlier runs.
    Report(cli::report::Args),
    /// The rank worker (started by `wringer run`, not by hand).
    Rank(cli::rank::Args),
    /// Run a program under the audit's eBPF syscall recorder (started by `wringer run`, not by
    /// hand).
    TraceSyscalls(cli::trace::Args),
}

fn main() -> ExitCode {
    let outcome = match Cli::parse().command {
        Command::Run(a) => cli::run::run(a),
        Command::Audit(a) => cli::audit::run(a),
        Command::Shrink(mut a) => {
            a.replay.shrink = true;
            cli::run::run(a)
        }
        Command::List(a) => cli::list::run(a),
        Command::Probe(a) => cli::probe::run(a),
        Command::Validate(a) => cli::validate::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Report(a) => cli::report::run(a),
        Command::Rank(a) => cli::rank::run(a),
        Command::TraceSyscalls(a) => cli::trace::run(a),
    };
    match outcome {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            // A message may quote the input (a field name, a path): never raw to the terminal.
            eprintln!("error: {}", printable(&format!("{e:#}")));
            // Bad input (files, YAML, schema) is exit 2; anything else is a failure.
            let bad_input = e.downcast_ref::<InputError>().is_some()
                || e.downcast_ref::<clap::Error>().is_some();
            ExitCode::from(if bad_input { 2 } else { 1 })
        }
    }
}
