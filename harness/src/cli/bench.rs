//! `wringer bench`: ours against the reference tools, in alternating rounds.

use std::path::PathBuf;

use wringer::bench;

#[derive(clap::Args)]
pub struct Args {
    /// Seconds each side runs per latency round (ours and the reference alternate).
    #[arg(long, default_value_t = 1)]
    pub seconds: u64,
    /// Fewer rounds (7 kept) and measures, for CI.
    #[arg(long)]
    pub quick: bool,
    /// An earlier bench.json: show how far each ratio moved since (more than 15% is marked).
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// Where bench.json and bench.md go.
    #[arg(long, default_value = "reports/bench")]
    pub out: PathBuf,
    /// Rank counts for the coordinator start-up measurement.
    #[arg(long, value_delimiter = ',', default_value = "2,8,32,64")]
    pub ranks: Vec<u32>,
    /// Only the RDMA rows (used inside the rxe VM by `just bench-rdma`).
    #[arg(long)]
    pub rdma_only: bool,
    /// Only the rows whose measure contains this text (for example `busy-poll`, `64 B`, with
    /// --rdma-only `in place 64 B`, with --audit-cost `teardown-cycles, audited by ebpf`); the
    /// other measures are not run.
    #[arg(long)]
    pub only: Option<String>,
    /// Round trips in each sample of the 64 KiB RDMA ping-pong rows, each side, ours and
    /// perftest's alike; smaller messages make proportionally more (at most 100 times: 64 B
    /// 20,000 by default), so that every sample runs for about as long.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub rdma_round_trips: u32,
    /// Only the launcher rows: start --ranks ranks through this Slurm profile against
    /// --launch-ssh (`just bench-launch`).
    #[arg(long, requires = "launch_ssh")]
    pub launch_slurm: Option<PathBuf>,
    /// The SSH profile the Slurm launcher is measured against.
    #[arg(long, requires = "launch_slurm")]
    pub launch_ssh: Option<PathBuf>,
    /// Only the audit's cost: whole audited scenarios on this host profile with the eBPF and
    /// the strace recorder, each against the same scenario unaudited (`just bench-audit`).
    #[arg(long)]
    pub audit_cost: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let Args {
        seconds,
        quick,
        against,
        out,
        ranks,
        rdma_only,
        only,
        rdma_round_trips,
        launch_slurm,
        launch_ssh,
        audit_cost,
    } = a;
    // Read first: a missing or broken earlier report is an input error before any work.
    let earlier: Option<bench::BenchReport> = match &against {
        // The bounded, regular-file-only reader; a file that is not a bench report is bad
        // input (exit 2), with where it went wrong.
        Some(p) => {
            let bytes =
                wringer::model::input::read_bytes(p, wringer::model::input::FileKind::Results)?;
            Some(serde_json::from_slice(&bytes).map_err(|e| {
                wringer::model::input::InputError::Located {
                    file: p.clone(),
                    line: e.line() as u64,
                    column: e.column() as u64,
                    message: format!("not a bench.json: {e}"),
                }
            })?)
        }
        None => None,
    };
    let opts = bench::BenchOptions {
        seconds,
        quick,
        out_dir: out.clone(),
        ranks,
        rdma_only,
        only,
        rdma_round_trips,
        launch: launch_slurm.zip(launch_ssh),
        audit_cost,
    };
    let report = bench::run(&opts)?;
    let mut text = bench::markdown(&report);
    if let (Some(earlier), Some(p)) = (&earlier, &against) {
        let (table, over) = bench::drift_markdown(&bench::drift(earlier, &report), 0.15);
        text.push_str(&format!(
            "\n## Against {}\n\n{table}\n{over} row(s) moved by more than 15%.\n",
            p.display()
        ));
    }
    wringer::say!("{}", text.trim_end());
    bench::write(&report, &text, &out)?;
    wringer::say!("written: {}/bench.json, bench.md", out.display());
    Ok(0)
}
