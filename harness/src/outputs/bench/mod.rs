//! `wringer bench`: our transport and coordinator against the reference tools, in the same run
//! on the same sizes, reported as ours, theirs and the ratio (Markdown and JSON). Benchmarks
//! never fail a build; a goal that is missed is reported as missed.

mod ours;
mod reference;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

pub struct BenchOptions {
    /// Seconds per latency or bandwidth measurement (each tool gets the same).
    pub seconds: u64,
    pub out_dir: PathBuf,
    /// Rank counts for the coordinator start-up measurement.
    pub ranks: Vec<u32>,
    /// Only the RDMA rows (for a run inside the rxe VM, where TCP numbers mean little).
    pub rdma_only: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Row {
    pub measure: String,
    pub unit: String,
    pub ours: Option<f64>,
    pub reference: Option<f64>,
    pub tool: Option<String>,
    /// ours / reference.
    pub ratio: Option<f64>,
    pub goal: Option<String>,
    pub met: Option<bool>,
    /// Why this row has no numbers.
    pub skipped: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct BenchReport {
    pub seconds_per_measure: u64,
    pub rows: Vec<Row>,
}

#[derive(Clone, Copy)]
enum Goal {
    RatioAtMost(f64),
    RatioAtLeast(f64),
    ValueAtMost(f64),
}

/// The p50 and p99 rows (µs) of one latency measurement against its reference tool, whose
/// goal is a ratio of at most `goal`; an error on either side lands in both rows.
fn latency_rows(
    rows: &mut Vec<Row>,
    [p50, p99]: [String; 2],
    ours: Result<(f64, f64)>,
    (theirs, tool): (Result<(f64, f64), String>, &str),
    goal: f64,
) {
    let (o50, o99) = match &ours {
        Ok((a, b)) => (Ok(*a), Ok(*b)),
        Err(e) => (Err(anyhow::anyhow!("{e:#}")), Err(anyhow::anyhow!("{e:#}"))),
    };
    let (t50, t99) = match theirs {
        Ok((a, b)) => (Ok(a), Ok(b)),
        Err(e) => (Err(e.clone()), Err(e)),
    };
    let goal = Some(Goal::RatioAtMost(goal));
    rows.push(row(p50, "µs", o50, Some((t50, tool)), goal));
    rows.push(row(p99, "µs", o99, Some((t99, tool)), goal));
}

fn row(
    measure: String,
    unit: &'static str,
    ours: Result<f64>,
    theirs: Option<(Result<f64, String>, &str)>,
    goal: Option<Goal>,
) -> Row {
    let (ours, mut skipped) = match ours {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(format!("ours failed: {e:#}"))),
    };
    let (reference, tool) = match theirs {
        Some((Ok(v), tool)) => (Some(v), Some(tool.to_string())),
        Some((Err(why), tool)) => {
            skipped.get_or_insert(why);
            (None, Some(tool.to_string()))
        }
        None => (None, None),
    };
    let ratio = ours.zip(reference).map(|(o, r)| o / r);
    let (goal_text, met) = match goal {
        Some(Goal::RatioAtMost(g)) => (Some(format!("≤ {g:.2}×")), ratio.map(|r| r <= g)),
        Some(Goal::RatioAtLeast(g)) => (Some(format!("≥ {g:.2}×")), ratio.map(|r| r >= g)),
        Some(Goal::ValueAtMost(g)) => (Some(format!("≤ {g} {unit}")), ours.map(|o| o <= g)),
        None => (None, None),
    };
    Row {
        measure,
        unit: unit.to_string(),
        ours,
        reference,
        tool,
        ratio,
        goal: goal_text,
        met,
        skipped,
    }
}

/// RDMA against perftest, same host, same sizes: measured where this host has an active RoCE
/// interface (inside the rxe VM: `just bench-rdma`), otherwise skipped with the reason.
fn rdma_rows() -> Vec<Row> {
    let Some((dev, port, gid)) = crate::rank::steps::rdma_support::local_gid() else {
        return ["RDMA SEND ping-pong", "RDMA WRITE bandwidth"]
            .into_iter()
            .map(|m| Row {
                measure: m.into(),
                unit: String::new(),
                ours: None,
                reference: None,
                tool: None,
                ratio: None,
                goal: None,
                met: None,
                skipped: Some(
                    "no RDMA device here: run `just bench-rdma` (the bench inside the rxe VM)"
                        .into(),
                ),
            })
            .collect();
    };
    let ip = crate::rank::steps::rdma_support::local_address().expect("a GID implies an address");
    let mut rows = vec![];
    let iters = 200;
    for size in [64usize, 4096, 65536] {
        let perftest = reference::Perftest {
            dev: &dev,
            port,
            gid,
            ip: &ip.to_string(),
            size,
            iters,
        };
        latency_rows(
            &mut rows,
            [
                format!(
                    "RDMA SEND ping-pong {} p50 (ib_send_lat: typical)",
                    human(size)
                ),
                format!("RDMA SEND ping-pong {} p99", human(size)),
            ],
            ours::rdma_pingpong(ip, size, iters),
            (reference::ib_send_lat(&perftest), "ib_send_lat"),
            1.10,
        );
    }
    let size = 65536;
    let ours = ours::rdma_write_bw(ip, size, 1000);
    let theirs = reference::ib_write_bw(&reference::Perftest {
        dev: &dev,
        port,
        gid,
        ip: &ip.to_string(),
        size,
        iters: 1000,
    });
    rows.push(row(
        format!("RDMA WRITE bandwidth, {} messages", human(size)),
        "Gbit/s",
        ours,
        Some((theirs, "ib_write_bw")),
        Some(Goal::RatioAtLeast(0.90)),
    ));
    rows
}

pub fn run(opts: &BenchOptions) -> Result<BenchReport> {
    if opts.rdma_only {
        return Ok(BenchReport {
            seconds_per_measure: opts.seconds,
            rows: rdma_rows(),
        });
    }
    let run = Duration::from_secs(opts.seconds.max(1));
    let mut rows = vec![];
    for size in [64usize, 4096, 65536, 1 << 20] {
        let tool = if size > reference::SOCKPERF_MAX {
            "sockperf (1 MiB − 1 B, its largest)"
        } else {
            "sockperf"
        };
        latency_rows(
            &mut rows,
            [
                format!("TCP ping-pong {} p50", human(size)),
                format!("TCP ping-pong {} p99", human(size)),
            ],
            ours::pingpong(size, run, None),
            (reference::sockperf_pingpong(size, run), tool),
            1.05,
        );
    }
    // The receiver thread hands frames over; a sleeping caller pays a wake-up per message.
    // Spinning briefly removes it, at the price of a busy core: shown separately, never mixed.
    let spin = Duration::from_micros(50);
    for size in [64usize, 4096] {
        let ours = ours::pingpong(size, run, Some(spin)).map(|(p50, _)| p50);
        let theirs = reference::sockperf_pingpong(size, run).map(|(p50, _)| p50);
        rows.push(row(
            format!(
                "TCP ping-pong {} p50, busy-poll 50 µs (sockperf blocking)",
                human(size)
            ),
            "µs",
            ours,
            Some((theirs, "sockperf")),
            None,
        ));
    }
    let ours_bw = ours::bandwidth(run);
    let iperf = reference::iperf3_bandwidth(run);
    rows.push(row(
        "TCP stream, 1 MiB messages".into(),
        "Gbit/s",
        ours_bw,
        Some((iperf, "iperf3")),
        Some(Goal::RatioAtLeast(0.95)),
    ));
    rows.extend(rdma_rows());
    rows.push(row(
        "teardown cycles per second".into(),
        "cycles/s",
        ours::teardown_rate(2000),
        None,
        None,
    ));
    let logs = opts.out_dir.join("bench-logs");
    let mut startup = vec![];
    for &n in &opts.ranks {
        let t = ours::coordinator_startup(n, if n > 16 { 3 } else { 5 }, &logs);
        if let Ok(v) = &t {
            startup.push((n, *v));
        }
        let goal = (n == 8).then_some(Goal::ValueAtMost(50.0));
        rows.push(row(
            format!("coordinator: start {n} ranks + rendezvous"),
            "ms",
            t,
            None,
            goal,
        ));
    }
    if let (Some(&(n0, t0)), Some(&(n1, t1))) = (
        startup.iter().find(|(n, _)| *n == 8).or(startup.first()),
        startup.last(),
    ) {
        if n1 > n0 {
            // Linear growth: time per rank stays flat. Report the per-rank cost at both ends.
            let per_rank = |t: f64, n: u32| t / n as f64;
            let growth = per_rank(t1, n1) / per_rank(t0, n0);
            rows.push(Row {
                measure: format!("coordinator: per-rank cost at {n1} vs {n0} ranks"),
                unit: "×".into(),
                ours: Some(growth),
                reference: None,
                tool: None,
                ratio: None,
                goal: Some("≤ 1.5× (linear)".into()),
                met: Some(growth <= 1.5),
                skipped: None,
            });
        }
    }
    let _ = std::fs::remove_dir_all(&logs);
    Ok(BenchReport {
        seconds_per_measure: opts.seconds,
        rows,
    })
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s if s >= 1024 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

fn num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A row as text cells, shared by the Markdown table and the HTML report.
pub struct Cells {
    pub ours: String,
    pub reference: String,
    pub ratio: String,
    /// The goal and whether it was met (`None`: not measurable in this run).
    pub goal: Option<(String, Option<bool>)>,
}

impl Row {
    pub fn cells(&self) -> Cells {
        let dash = || "–".to_string();
        Cells {
            ours: self
                .ours
                .map(|v| format!("{} {}", num(v), self.unit))
                .unwrap_or_else(dash),
            reference: match (self.reference, &self.tool, &self.skipped) {
                (Some(v), Some(t), _) => format!("{} {} ({t})", num(v), self.unit),
                (_, _, Some(why)) => format!("skipped: {why}"),
                _ => dash(),
            },
            ratio: self.ratio.map(|v| format!("{v:.2}")).unwrap_or_else(dash),
            goal: self.goal.clone().map(|g| (g, self.met)),
        }
    }
}

pub fn markdown(r: &BenchReport) -> String {
    let mut s =
        String::from("| measure | wringer | reference | ratio | goal |\n|---|---|---|---|---|\n");
    for row in &r.rows {
        let c = row.cells();
        let goal = match c.goal {
            Some((g, Some(true))) => format!("{g} ✅"),
            Some((g, Some(false))) => format!("{g} ❌ missed"),
            Some((g, None)) => g,
            None => String::new(),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {goal} |\n",
            row.measure, c.ours, c.reference, c.ratio
        ));
    }
    s
}

pub fn write(r: &BenchReport, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("bench.json"), serde_json::to_vec_pretty(r)?)?;
    std::fs::write(dir.join("bench.md"), markdown(r))?;
    Ok(())
}
