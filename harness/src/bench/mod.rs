//! `wringer bench`: our transport and coordinator against the reference tools, in the same run
//! on the same sizes, alternating in rounds (see [`method`]), reported as ours, theirs and the
//! median ratio with its spread (Markdown and JSON, every round kept raw). Benchmarks never fail
//! a build; a goal that is missed is reported as missed.

mod audit_cost;
mod launch;
mod method;
mod ours;
mod reference;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;

pub use crate::model::bench::{BenchReport, CpuPinning, Round, Row, Sample};
pub use method::{Method, UNSTABLE_SPREAD};

pub struct BenchOptions {
    /// Seconds each side runs per latency round (sockperf's smallest run is one second).
    pub seconds: u64,
    /// Fewer rounds and measures, for CI.
    pub quick: bool,
    pub out_dir: PathBuf,
    /// Rank counts for the coordinator start-up measurement.
    pub ranks: Vec<u32>,
    /// Only the RDMA rows (for a run inside the rxe VM, where TCP numbers mean little).
    pub rdma_only: bool,
    /// Only the TCP or RDMA rows whose measure contains this text; nothing else is measured.
    pub only: Option<String>,
    /// Round trips in each sample of the 64 KiB RDMA ping-pong rows, each side; smaller
    /// messages make proportionally more (see [`rdma_round_trips`]).
    pub rdma_round_trips: u32,
    /// Only the launcher rows: a Slurm profile against an SSH profile over the same number of
    /// hosts (`just bench-launch`).
    pub launch: Option<(PathBuf, PathBuf)>,
    /// Only the audit's cost: audited scenarios with each recorder against unaudited, on this
    /// host profile (`just bench-audit`).
    pub audit_cost: Option<PathBuf>,
}

#[derive(Clone, Copy)]
enum Goal {
    RatioAtMost(f64),
    RatioAtLeast(f64),
    ValueAtMost(f64),
}

impl Goal {
    fn text(self, unit: &str) -> String {
        match self {
            Goal::RatioAtMost(g) => format!("≤ {g:.2}×"),
            Goal::RatioAtLeast(g) => format!("≥ {g:.2}×"),
            Goal::ValueAtMost(g) => format!("≤ {g} {unit}"),
        }
    }

    fn met(self, ours: Option<f64>, ratio: Option<f64>) -> Option<bool> {
        match self {
            Goal::RatioAtMost(g) => ratio.map(|r| r <= g),
            Goal::RatioAtLeast(g) => ratio.map(|r| r >= g),
            Goal::ValueAtMost(g) => ours.map(|o| o <= g),
        }
    }
}

/// A row measured against a reference tool in alternating rounds.
fn compared(
    measure: String,
    unit: &str,
    tool: &str,
    goal: Option<Goal>,
    rounds: Result<Vec<Round>, method::Failed>,
) -> Row {
    let mut row = Row {
        measure,
        unit: unit.to_string(),
        ours: None,
        reference: None,
        tool: Some(tool.to_string()),
        ratio: None,
        spread: None,
        unstable: false,
        ours_p99: None,
        reference_p99: None,
        rounds: vec![],
        goal: goal.map(|g| g.text(unit)),
        met: None,
        skipped: None,
    };
    let rounds = match rounds {
        Ok(r) => r,
        Err(method::Failed::Ours(e)) => {
            row.skipped = Some(format!("ours failed: {e}"));
            return row;
        }
        Err(method::Failed::Reference(e)) => {
            row.skipped = Some(e);
            return row;
        }
    };
    let of = |f: &dyn Fn(&Round) -> Option<f64>| {
        method::median(&rounds.iter().filter_map(f).collect::<Vec<_>>())
    };
    row.ours = of(&|r| Some(r.ours.value));
    row.reference = of(&|r| Some(r.reference.value));
    row.ours_p99 = of(&|r| r.ours.p99);
    row.reference_p99 = of(&|r| r.reference.p99);
    let ratios: Vec<f64> = rounds.iter().map(|r| r.ratio).collect();
    row.ratio = method::median(&ratios);
    row.spread = method::spread(&ratios);
    row.unstable = row.spread.is_some_and(|s| s > UNSTABLE_SPREAD);
    row.met = goal.and_then(|g| g.met(row.ours, row.ratio));
    row.rounds = rounds;
    row
}

/// Measure ours against `tool` in alternating rounds: one compared row.
fn versus(
    method: Method,
    (measure, unit, tool, goal): (String, &str, &str, Option<Goal>),
    ours: impl FnMut() -> Result<Sample>,
    theirs: impl FnMut() -> Result<Sample>,
) -> Row {
    compared(
        measure,
        unit,
        tool,
        goal,
        method::alternate(method, ours, theirs),
    )
}

/// A row of ours alone (no reference tool measures it).
fn alone(measure: String, unit: &str, ours: Result<f64>, goal: Option<Goal>) -> Row {
    let (ours, skipped) = match ours {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(format!("ours failed: {e:#}"))),
    };
    Row {
        measure,
        unit: unit.to_string(),
        ours,
        reference: None,
        tool: None,
        ratio: None,
        spread: None,
        unstable: false,
        ours_p99: None,
        reference_p99: None,
        rounds: vec![],
        goal: goal.map(|g| g.text(unit)),
        met: goal.and_then(|g| g.met(ours, None)),
        skipped,
    }
}

fn skipped_row(measure: &str, why: &str) -> Row {
    let mut row = alone(measure.into(), "", Ok(0.0), None);
    row.ours = None;
    row.skipped = Some(why.into());
    row
}

/// A reference server that could not start fails every round of its measure alike.
fn serving<S>(server: &Result<S>) -> Result<&S> {
    server.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))
}

/// Whether `--only` (when given) picks the row measuring `measure`.
fn picked(only: Option<&str>, measure: &str) -> bool {
    only.is_none_or(|o| measure.contains(o))
}

/// Round trips in one sample of a ping-pong row of `size`-byte messages: `at_64k` for 64 KiB,
/// and for smaller messages as many more as fit the same bytes, at most 100 times as many
/// (64 B: 20,000; 4 KiB: 3,200 where 64 KiB has 200), so that each size's sample runs for about
/// as long. 200 round trips of 64 B are about 5 ms in the rxe VM: their median swung by ±10%
/// from round to round with the VM's timing, where 20,000 held within ±3%.
fn rdma_round_trips(size: usize, at_64k: u32) -> u32 {
    let scale = (65536 / size.max(1)).clamp(1, 100) as u32;
    at_64k.saturating_mul(scale)
}

/// RDMA against perftest, same host, same sizes, same iteration counts, in alternating rounds:
/// measured where this host has an active RoCE interface (inside the rxe VM: `just
/// bench-rdma`), otherwise skipped with the reason.
fn rdma_rows(method: Method, only: Option<&str>, round_trips: u32) -> Vec<Row> {
    let Some((dev, port, gid)) = crate::rank::steps::rdma_support::local_gid() else {
        let why = "no RDMA device here: run `just bench-rdma` (the bench inside the rxe VM)";
        return vec![
            skipped_row("RDMA SEND ping-pong", why),
            skipped_row("RDMA WRITE bandwidth", why),
        ];
    };
    let Some(ip) = crate::rank::steps::rdma_support::local_address() else {
        return vec![skipped_row(
            "RDMA",
            "the RDMA device has no IPv4 address to rendezvous on",
        )];
    };
    let ip_text = ip.to_string();
    let perftest = |size, iters| reference::Perftest {
        dev: &dev,
        port,
        gid,
        ip: &ip_text,
        size,
        iters,
    };
    let wanted = |measure: &str| picked(only, measure);
    let mut rows = vec![];
    for size in [64usize, 4096, 65536] {
        let iters = rdma_round_trips(size, round_trips);
        // The zero-copy path is the one held to perftest's latency (which copies nothing); the
        // copying send/recv is measured beside it, so the copies' cost shows as the difference.
        let measure = format!("RDMA SEND ping-pong in place {} p50", human(size));
        if wanted(&measure) {
            rows.push(versus(
                method,
                (
                    measure,
                    "µs",
                    "ib_send_lat (typical)",
                    Some(Goal::RatioAtMost(1.10)),
                ),
                || ours::rdma_pingpong_in_place(ip, size, iters),
                || reference::ib_send_lat(&perftest(size, iters)),
            ));
        }
        let measure = format!("RDMA SEND ping-pong copying {} p50", human(size));
        if wanted(&measure) {
            rows.push(versus(
                method,
                (measure, "µs", "ib_send_lat (typical)", None),
                || ours::rdma_pingpong(ip, size, iters),
                || reference::ib_send_lat(&perftest(size, iters)),
            ));
        }
    }
    let (size, iters) = (65536, 1000);
    let measure = format!("RDMA WRITE bandwidth, {} messages", human(size));
    if wanted(&measure) {
        rows.push(versus(
            method,
            (
                measure,
                "Gbit/s",
                "ib_write_bw",
                Some(Goal::RatioAtLeast(0.95)),
            ),
            || ours::rdma_write_bw(ip, size, iters),
            || reference::ib_write_bw(&perftest(size, iters)),
        ));
    }
    rows
}

/// The TCP rows: ping-pong latency against sockperf (blocking, then both sides busy-polling)
/// and one stream against iperf3. With `--only`, just the rows whose measure names it.
fn tcp_rows(opts: &BenchOptions, method: Method, cpus: Option<&CpuPinning>) -> Vec<Row> {
    let wanted = |measure: &str| picked(opts.only.as_deref(), measure);
    let run = Duration::from_secs(opts.seconds.max(1));
    let sizes: &[usize] = if opts.quick {
        &[64, 4096, 65536]
    } else {
        &[64, 4096, 65536, 1 << 20]
    };
    let mut rows = vec![];
    let named = |extra: &str| {
        sizes
            .iter()
            .map(move |&s| (s, format!("TCP ping-pong {} p50{extra}", human(s))))
            .filter(|(_, m)| wanted(m))
            .collect::<Vec<_>>()
    };
    let plain = named("");
    // Where the time goes: the same frames on the same placement, encoded and decoded by the
    // caller straight on the socket, with no connection around them. The floor for the rows
    // above: what they add to it is the connection's own cost.
    let floor: Vec<_> = named(", our frames alone, no connection (profile)")
        .into_iter()
        .filter(|(s, _)| *s <= 65536)
        .collect();
    if !plain.is_empty() || !floor.is_empty() {
        let server = reference::sockperf_server(false, cpus.cloned());
        for (size, measure) in plain {
            let tool = if size > reference::SOCKPERF_MAX {
                "sockperf (1 MiB − 1 B, its largest)"
            } else {
                "sockperf"
            };
            rows.push(versus(
                method,
                (measure, "µs", tool, Some(Goal::RatioAtMost(1.10))),
                || ours::pingpong(size, run, None, cpus),
                || reference::sockperf_round(serving(&server)?, size, opts.seconds),
            ));
        }
        for (size, measure) in floor {
            rows.push(versus(
                method,
                (measure, "µs", "sockperf", None),
                || ours::pingpong_inline(size, run, cpus),
                || reference::sockperf_round(serving(&server)?, size, opts.seconds),
            ));
        }
    }
    // Like for like: both sides spin on non-blocking receives instead of sleeping (ours for
    // up to 1 ms at a time, longer than any round trip here).
    let busy: Vec<_> = named(", busy-poll")
        .into_iter()
        .filter(|(s, _)| *s <= 65536)
        .collect();
    if !busy.is_empty() {
        let spin = Duration::from_millis(1);
        for (size, measure) in busy {
            rows.push(versus(
                method,
                (
                    measure,
                    "µs",
                    "sockperf --nonblocked",
                    Some(Goal::RatioAtMost(1.05)),
                ),
                || ours::pingpong(size, run, Some(spin), cpus),
                // A busy-polling server spins even while nobody talks to it: it lives only for
                // its own round, or it would take a CPU from ours.
                || {
                    let server = reference::sockperf_server(true, cpus.cloned())?;
                    reference::sockperf_round(&server, size, opts.seconds)
                },
            ));
        }
    }
    // About a second per side per round at loopback speeds: shorter rounds let the machine's
    // moment decide (1,024 messages, a third of a second, moved the ratio 16% between runs).
    let (size, messages) = (1 << 20, if opts.quick { 4096 } else { 8192 });
    let measure = format!("TCP stream, {} messages", human(size));
    if wanted(&measure) {
        let server = reference::iperf3_server(cpus.cloned());
        rows.push(versus(
            method,
            (measure, "Gbit/s", "iperf3", Some(Goal::RatioAtLeast(0.95))),
            || ours::bandwidth(size, messages, cpus),
            || reference::iperf3_round(serving(&server)?, size, messages),
        ));
    }
    rows
}

pub fn run(opts: &BenchOptions) -> Result<BenchReport> {
    let method = if opts.quick {
        Method::QUICK
    } else {
        Method::FULL
    };
    let placement = CpuPinning::detect();
    let report = |rows, placement| BenchReport {
        seconds_per_round: opts.seconds,
        rounds: method.rounds,
        warmup_rounds: method.warmup,
        placement,
        quick: opts.quick,
        rows,
    };
    if opts.rdma_only {
        return Ok(report(
            rdma_rows(method, opts.only.as_deref(), opts.rdma_round_trips),
            placement,
        ));
    }
    if let Some(hosts) = &opts.audit_cost {
        return Ok(report(
            audit_cost::rows(hosts, method, &opts.out_dir, opts.only.as_deref()),
            placement,
        ));
    }
    if let Some((slurm, ssh)) = &opts.launch {
        let logs = opts.out_dir.join("bench-logs");
        let rows = launch::rows(slurm, ssh, &opts.ranks, method, &logs)?;
        let _ = std::fs::remove_dir_all(&logs);
        return Ok(report(rows, placement));
    }
    let mut rows = tcp_rows(opts, method, placement.as_ref());
    if opts.only.is_some() {
        return Ok(report(rows, placement));
    }
    rows.extend(rdma_rows(method, None, opts.rdma_round_trips));
    rows.push(alone(
        "teardown cycles per second".into(),
        "cycles/s",
        ours::teardown_rate(if opts.quick { 500 } else { 2000 }),
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
        rows.push(alone(
            format!("coordinator: start {n} ranks + rendezvous"),
            "ms",
            t,
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
            let mut row = alone(
                format!("coordinator: per-rank cost at {n1} vs {n0} ranks"),
                "×",
                Ok(growth),
                None,
            );
            row.goal = Some("≤ 1.5× (linear)".into());
            row.met = Some(growth <= 1.5);
            rows.push(row);
        }
    }
    let _ = std::fs::remove_dir_all(&logs);
    Ok(report(rows, placement))
}

/// How far each compared row's median ratio moved from an earlier run's: (measure, earlier,
/// now, |now / earlier − 1|), for the rows both runs measured.
pub fn drift(earlier: &BenchReport, now: &BenchReport) -> Vec<(String, f64, f64, f64)> {
    now.rows
        .iter()
        .filter_map(|row| {
            let then = earlier.rows.iter().find(|r| r.measure == row.measure)?;
            let (a, b) = (then.ratio?, row.ratio?);
            Some((row.measure.clone(), a, b, (b / a - 1.0).abs()))
        })
        .collect()
}

/// The drift table in Markdown, and how many rows moved by more than `limit`.
pub fn drift_markdown(rows: &[(String, f64, f64, f64)], limit: f64) -> (String, usize) {
    let mut s =
        String::from("| measure | earlier ratio | this ratio | moved |\n|---|---|---|---|\n");
    let mut over = 0;
    for (m, a, b, d) in rows {
        let flag = if *d > limit {
            over += 1;
            " ❌"
        } else {
            ""
        };
        s.push_str(&format!(
            "| {m} | {a:.2} | {b:.2} | {:.0}%{flag} |\n",
            d * 100.0
        ));
    }
    (s, over)
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
        let with_p99 = |v: f64, p99: Option<f64>| match p99 {
            Some(p) => format!("{} {} (p99 {})", num(v), self.unit, num(p)),
            None => format!("{} {}", num(v), self.unit),
        };
        Cells {
            ours: self
                .ours
                .map(|v| with_p99(v, self.ours_p99))
                .unwrap_or_else(dash),
            reference: match (self.reference, &self.tool, &self.skipped) {
                (Some(v), Some(t), _) => format!("{} ({t})", with_p99(v, self.reference_p99)),
                (_, _, Some(why)) => format!("skipped: {why}"),
                _ => dash(),
            },
            ratio: match (self.ratio, self.spread) {
                (Some(r), Some(sp)) => format!(
                    "{r:.2} ± {:.0}% over {} rounds{}",
                    sp * 50.0,
                    self.rounds.len(),
                    if self.unstable { ", unstable" } else { "" }
                ),
                (Some(r), None) => format!("{r:.2}"),
                _ => dash(),
            },
            goal: self.goal.clone().map(|g| (g, self.met)),
        }
    }
}

pub fn markdown(r: &BenchReport) -> String {
    let placement = match &r.placement {
        Some(p) => format!(
            "server ends on CPUs {:?}, client ends on CPUs {:?}",
            p.server_cpus, p.client_cpus
        ),
        None => "not pinned (fewer than 4 CPUs, or no taskset)".into(),
    };
    let mut s = format!(
        "{} kept rounds per measure after {} discarded, {} s per side per latency round, \
         ours and the reference alternating; {placement}. Ratio: median of the per-round \
         ratios ± half their interquartile range.\n\n\
         | measure | wringer | reference | ratio | goal |\n|---|---|---|---|---|\n",
        r.rounds, r.warmup_rounds, r.seconds_per_round
    );
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

/// bench.json (every round raw) and bench.md (`text`, the table and anything after it).
pub fn write(r: &BenchReport, text: &str, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("bench.json"), serde_json::to_vec_pretty(r)?)?;
    std::fs::write(dir.join("bench.md"), text)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaller_rdma_messages_make_more_round_trips_up_to_a_hundred_times() {
        assert_eq!(rdma_round_trips(65536, 200), 200);
        assert_eq!(rdma_round_trips(4096, 200), 3200);
        assert_eq!(rdma_round_trips(64, 200), 20_000);
        assert_eq!(rdma_round_trips(1 << 20, 200), 200);
        assert_eq!(rdma_round_trips(0, 200), 20_000);
        assert_eq!(rdma_round_trips(64, u32::MAX), u32::MAX);
    }

    fn round(ours: f64, reference: f64) -> Round {
        let s = |v| Sample {
            value: v,
            p99: Some(v * 2.0),
            count: Some(1000),
        };
        Round {
            ours: s(ours),
            reference: s(reference),
            ratio: ours / reference,
        }
    }

    fn report(rows: Vec<Row>) -> BenchReport {
        BenchReport {
            seconds_per_round: 1,
            rounds: 7,
            warmup_rounds: 1,
            placement: None,
            quick: false,
            rows,
        }
    }

    #[test]
    fn a_compared_row_is_the_median_of_its_rounds_ratios_with_the_spread() {
        // The reference drifts from 10 to 16 across the rounds; ours follows at 1.1×, with one
        // round disturbed. The median ratio stays 1.1, which a ratio of medians would not give.
        let rounds: Vec<Round> = (0..7)
            .map(|i| {
                let theirs = 10.0 + i as f64;
                round(if i == 3 { theirs * 3.0 } else { theirs * 1.1 }, theirs)
            })
            .collect();
        let row = compared(
            "TCP ping-pong 64 B p50".into(),
            "µs",
            "sockperf",
            Some(Goal::RatioAtMost(1.10)),
            Ok(rounds),
        );
        assert!((row.ratio.unwrap() - 1.1).abs() < 1e-9);
        assert!(row.spread.unwrap() < 0.01, "{:?}", row.spread);
        assert!(!row.unstable);
        assert_eq!(row.met, Some(true));
        assert_eq!(row.rounds.len(), 7);
        assert_eq!(row.reference, Some(13.0));
        assert_eq!(row.reference_p99, Some(26.0));
        let md = markdown(&report(vec![row]));
        assert!(md.contains("1.10 ± 0% over 7 rounds"), "{md}");
        assert!(md.contains("13.00 µs (p99 26.00) (sockperf)"), "{md}");
    }

    #[test]
    fn a_row_whose_rounds_disagree_is_marked_unstable() {
        let rounds = [1.0, 1.5, 0.7, 1.3, 0.8, 1.2, 0.9]
            .iter()
            .map(|&r| round(r * 10.0, 10.0))
            .collect();
        let row = compared("x".into(), "µs", "t", None, Ok(rounds));
        assert!(row.unstable, "{:?}", row.spread);
        assert!(markdown(&report(vec![row])).contains(", unstable"));
    }

    #[test]
    fn a_failed_side_leaves_the_row_without_numbers_and_says_which() {
        let row = compared(
            "x".into(),
            "µs",
            "sockperf",
            None,
            Err(method::Failed::Reference(
                "sockperf is not installed".into(),
            )),
        );
        assert_eq!((row.ours, row.ratio), (None, None));
        assert_eq!(row.skipped.as_deref(), Some("sockperf is not installed"));
        let row = compared(
            "x".into(),
            "µs",
            "sockperf",
            None,
            Err(method::Failed::Ours("refused".into())),
        );
        assert_eq!(row.skipped.as_deref(), Some("ours failed: refused"));
    }

    #[test]
    fn drift_flags_rows_that_moved_more_than_the_limit() {
        let row = |m: &str, r: f64| compared(m.into(), "µs", "t", None, Ok(vec![round(r, 1.0)]));
        let a = report(vec![row("a", 1.0), row("b", 1.0), row("only-then", 1.0)]);
        let b = report(vec![row("a", 1.1), row("b", 1.3), row("only-now", 1.0)]);
        let d = drift(&a, &b);
        assert_eq!(d.len(), 2);
        let (table, over) = drift_markdown(&d, 0.15);
        assert_eq!(over, 1);
        assert!(table.contains("| b | 1.00 | 1.30 | 30% ❌ |"), "{table}");
    }

    #[test]
    fn an_earlier_bench_json_without_rounds_still_reads() {
        let old = r#"{"seconds_per_measure": 3, "rows": [{"measure": "m", "unit": "µs",
            "ours": 1.0, "reference": 2.0, "tool": "sockperf", "ratio": 0.5, "goal": null,
            "met": null, "skipped": null}]}"#;
        let r: BenchReport = serde_json::from_str(old).unwrap();
        assert_eq!(r.seconds_per_round, 3);
        assert!(r.rows[0].rounds.is_empty());
        assert_eq!(r.rows[0].cells().ratio, "0.50");
    }
}
