//! What the lifecycle audit costs: whole audited scenarios (start-up included, as a user waits
//! for all of it) with each syscall recorder against the same scenario unaudited, alternating
//! in rounds like every other row. The recorder rows set perturbations aside on both sides, so
//! that what is measured is the recorder; one more row runs each scenario as it ships (its
//! perturbations delayed by the preloaded observer, its audit on) against the same scenario
//! with `--no-audit` (the same perturbations, no audit), as a user compares them.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::{versus, Goal, Method, Row, Sample};

/// The audited scenarios measured here, and the goal for eBPF on each.
pub const SCENARIOS: &[(&str, Option<f64>)] = &[
    ("scenarios/tcp-teardown-cycles.yaml", Some(1.5)),
    ("scenarios/tcp-close-during-recv.yaml", None),
];

/// One run of `scenario` on `hosts`, with `flags`: its wall time in seconds. It must pass.
fn once(hosts: &Path, scenario: &Path, flags: &[&str], logs: &Path) -> Result<Sample> {
    let exe = std::env::current_exe().context("locating the wringer binary")?;
    let dir = logs.join(format!("audit-cost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let started = Instant::now();
    let out = Command::new(exe)
        .args(["run", "--hosts"])
        .arg(hosts)
        .args(["--replays", "0", "--report-dir"])
        .arg(&dir)
        .args(flags)
        .arg(scenario)
        .stdin(Stdio::null())
        .output()?;
    let seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        bail!(
            "{} {} exited {}: {}",
            scenario.display(),
            flags.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(Sample {
        value: seconds,
        p99: None,
        count: None,
    })
}

/// The rows, or with `only` just those whose measure names it.
pub fn rows(hosts: &Path, method: Method, logs: &Path, only: Option<&str>) -> Vec<Row> {
    let mut rows = vec![];
    for &(file, goal) in SCENARIOS {
        let scenario = Path::new(file);
        let name = scenario.file_stem().unwrap_or_default().to_string_lossy();
        for (backend, goal) in [("ebpf", goal), ("strace", None)] {
            let measure = format!("audit cost: {name}, audited by {backend} vs unaudited");
            if !super::picked(only, &measure) {
                continue;
            }
            rows.push(versus(
                method,
                (
                    measure,
                    "s",
                    "the same scenario, unaudited",
                    goal.map(Goal::RatioAtMost),
                ),
                || {
                    once(
                        hosts,
                        scenario,
                        &["--audit-backend", backend, "--no-perturb"],
                        logs,
                    )
                },
                || once(hosts, scenario, &["--no-audit", "--no-perturb"], logs),
            ));
        }
        let measure = format!("audit cost: {name} as it ships (audited, perturbed) vs unaudited");
        if !super::picked(only, &measure) {
            continue;
        }
        rows.push(versus(
            method,
            (
                measure,
                "s",
                "the same scenario, --no-audit",
                goal.map(Goal::RatioAtMost),
            ),
            || once(hosts, scenario, &[], logs),
            || once(hosts, scenario, &["--no-audit"], logs),
        ));
    }
    rows
}
