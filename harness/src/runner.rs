//! `wringer run`: every scenario in turn, skip or run (with repeats), judge, report.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use hdrhistogram::Histogram;

use crate::coordinator::{self, Plan};
use crate::hosts::HostProfile;
use crate::launcher::Placement;
use crate::probe::HostFacts;
use crate::report::{
    Evidence, Latency, MetricSummary, Reporter, RunMeta, ScenarioResult, Stacks, Verdict,
};
use crate::scenario::Loaded;

pub struct RunOptions {
    pub report_dir: Option<PathBuf>,
    pub filter: Option<String>,
    pub repeat: Option<u32>,
    pub seed: Option<u64>,
    pub strict: bool,
}

/// Run the scenarios; returns the process exit code (0 pass/skip, 1 any failure).
pub fn run(scenarios: Vec<Loaded>, profile: &HostProfile, opts: &RunOptions) -> Result<i32> {
    let started = Instant::now();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let run_id = format!("{}-{}", now.as_secs(), &coordinator::random_token()?[..6]);
    let seed = opts.seed.unwrap_or(now.as_nanos() as u64);
    let dir = opts
        .report_dir
        .clone()
        .unwrap_or_else(|| Path::new("reports").join(&run_id));
    let interrupted = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&interrupted))?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&interrupted))?;
    let selected: Vec<&Loaded> = scenarios
        .iter()
        .filter(|s| {
            opts.filter
                .as_deref()
                .is_none_or(|f| s.scenario.name.contains(f))
        })
        .collect();
    // Hosts come up once per run (containers started, the binary deployed over SSH), and are
    // probed where they are.
    let placement = if selected.is_empty() {
        Placement::Local
    } else {
        crate::placement::prepare(profile, &run_id)?
    };
    let facts = crate::placement::facts(&placement)?;
    let meta = RunMeta {
        run_id: run_id.clone(),
        wringer_version: env!("CARGO_PKG_VERSION"),
        host_profile: profile.name.clone(),
        seed,
        hosts: facts.clone(),
        started_unix: now.as_secs(),
    };
    let mut reporter = Reporter::create(&dir, meta)?;
    let progress = Progress::new(selected.len());
    crate::say!(
        "wringer run {run_id}: {} scenarios on `{}`, report in {}",
        selected.len(),
        profile.name,
        dir.display()
    );
    let in_vm = matches!(
        profile.kind,
        crate::hosts::ProfileKind::RxeVm | crate::hosts::ProfileKind::RxeVmPair
    );
    if in_vm {
        // The whole run happens inside the VM; its results are recorded here as they are.
        let files: Vec<PathBuf> = selected.iter().map(|l| l.path.clone()).collect();
        for (i, result) in crate::vm::run(profile, &files, opts, seed, &dir, &interrupted)
            .into_iter()
            .enumerate()
        {
            progress.finish(i, &result);
            reporter.record(result, started.elapsed())?;
        }
    }
    for (i, loaded) in selected.iter().enumerate() {
        if interrupted.load(Ordering::Relaxed) || in_vm {
            break;
        }
        progress.start(i, &loaded.scenario.name);
        let cx = RunContext {
            placement: &placement,
            profile,
            facts: &facts,
            opts,
            seed,
            dir: &dir,
            interrupted: &interrupted,
        };
        let result = run_scenario(loaded, &cx);
        progress.finish(i, &result);
        reporter.record(result, started.elapsed())?;
    }
    let was_interrupted = interrupted.load(Ordering::Relaxed);
    reporter.finish(was_interrupted, started.elapsed())?;
    progress.clear();
    let failed = reporter
        .results()
        .iter()
        .filter(|r| r.verdict == Verdict::Fail)
        .count();
    let passed = reporter
        .results()
        .iter()
        .filter(|r| r.verdict == Verdict::Pass)
        .count();
    let skipped = reporter
        .results()
        .iter()
        .filter(|r| r.verdict == Verdict::Skip)
        .count();
    crate::say!(
        "{passed} passed, {failed} failed, {skipped} skipped in {:.1} s{}; report: {}",
        started.elapsed().as_secs_f64(),
        if was_interrupted {
            " (interrupted)"
        } else {
            ""
        },
        reporter.dir().display()
    );
    Ok(if failed > 0 || was_interrupted { 1 } else { 0 })
}

/// What every scenario of one run shares.
struct RunContext<'a> {
    placement: &'a Placement,
    profile: &'a HostProfile,
    facts: &'a [HostFacts],
    opts: &'a RunOptions,
    seed: u64,
    dir: &'a Path,
    interrupted: &'a AtomicBool,
}

fn run_scenario(loaded: &Loaded, cx: &RunContext) -> ScenarioResult {
    let RunContext {
        placement,
        profile,
        facts,
        opts,
        seed,
        dir,
        interrupted,
    } = *cx;
    let s = &loaded.scenario;
    let started = Instant::now();
    let mut result = ScenarioResult {
        name: s.name.clone(),
        file: loaded.path.clone(),
        verdict: Verdict::Pass,
        reason: None,
        duration_s: 0.0,
        repeats: 0,
        repeats_failed: 0,
        metrics: BTreeMap::new(),
        latency: BTreeMap::new(),
        evidence: Evidence::default(),
    };
    for req in &s.requires {
        // Every host must meet a requirement; the first that does not gives the reason.
        let unmet = facts
            .iter()
            .find_map(|f| f.check(*req, profile).err().map(|r| (f.host.clone(), r)));
        if let Some((host, mut reason)) = unmet {
            if facts.len() > 1 {
                reason.detail = format!("on {host}: {}", reason.detail);
            }
            let required = opts.strict || profile.must_have.contains(req);
            result.verdict = if required {
                Verdict::Fail
            } else {
                Verdict::Skip
            };
            result.reason = Some(if required {
                let why = if opts.strict {
                    "--strict"
                } else {
                    "the host profile's must_have"
                };
                format!("{reason} (a skip turned into a failure by {why})")
            } else {
                reason.to_string()
            });
            return result;
        }
    }
    if placement.containers().is_none() {
        if let Some(f) = s.faults.iter().find(|f| f.value.action.is_host_level()) {
            result.verdict = Verdict::Skip;
            result.reason = Some(format!(
                "no-host-control: the {:?} fault acts on a whole host, which only the containers profile can do (`{}` is {:?})",
                f.value.action, profile.name, profile.kind
            ));
            return result;
        }
    }
    let steps = loaded.steps();
    let faults = loaded.faults();
    let repeats = opts.repeat.unwrap_or(s.repeat);
    let mut observations: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for repeat in 0..repeats {
        if interrupted.load(Ordering::Relaxed) {
            result
                .evidence
                .failures
                .push("interrupted before every repeat ran".into());
            result.repeats_failed += 1;
            break;
        }
        let log_dir = dir
            .join("logs")
            .join(&s.name)
            .join(format!("repeat-{repeat}"));
        let plan = Plan {
            ranks: loaded.ranks(),
            steps: &steps,
            faults: &faults,
            deadline: s.deadline.0,
            seed: seed.wrapping_add(repeat as u64),
            log_dir: &log_dir,
            interrupted,
            placement,
        };
        let attempt = coordinator::run(&plan);
        let failures = crate::verdict::judge(&attempt, &s.expect);
        result.repeats += 1;
        for (_, r) in &attempt.reports {
            for (k, v) in &r.metrics {
                observations.entry(k.clone()).or_default().push(*v);
            }
            if repeat == 0 || !failures.is_empty() {
                result
                    .evidence
                    .notes
                    .extend(r.notes.iter().map(|n| format!("repeat {repeat}: {n}")));
            }
        }
        for (k, v) in coordinator::merged_samples(&attempt) {
            samples.entry(k).or_default().extend(v);
        }
        result.evidence.faults.extend(
            attempt
                .faults_struck
                .iter()
                .map(|f| format!("repeat {repeat}: {f}")),
        );
        result.evidence.rejected_rendezvous_connections += attempt.rejected_connections;
        if !failures.is_empty() {
            result.repeats_failed += 1;
            result
                .evidence
                .failures
                .extend(failures.iter().map(|f| format!("repeat {repeat}: {f}")));
            result
                .evidence
                .rank_logs
                .extend(attempt.logs.iter().cloned());
            if let Some(h) = attempt.hang {
                result
                    .evidence
                    .stacks
                    .extend(h.stacks.into_iter().map(|(rank, pid, text)| Stacks {
                        repeat,
                        rank,
                        pid,
                        text,
                    }));
            }
        } else if repeat == 0 {
            result
                .evidence
                .rank_logs
                .extend(attempt.logs.iter().cloned());
        }
        // A hang or interruption ends the scenario: further repeats would only repeat it.
        if !result.evidence.stacks.is_empty() || attempt.interrupted {
            break;
        }
    }
    for (k, v) in observations {
        let count = v.len();
        let (min, max) = v
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(*x), b.max(*x))
            });
        result.metrics.insert(
            k,
            MetricSummary {
                min,
                max,
                mean: v.iter().sum::<f64>() / count as f64,
                count,
            },
        );
    }
    for (k, v) in samples {
        let size = k.trim_start_matches("latency_us/").to_string();
        let mut h = Histogram::<u64>::new(3).expect("3 significant digits is valid");
        for x in v {
            let _ = h.record((x * 1000.0).max(1.0) as u64);
        }
        result.latency.insert(
            size,
            Latency {
                p50_us: h.value_at_quantile(0.5) as f64 / 1e3,
                p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
                count: h.len(),
                histogram: h
                    .iter_log(1000, 2.0)
                    .map(|b| {
                        (
                            b.value_iterated_to() as f64 / 1e3,
                            b.count_since_last_iteration(),
                        )
                    })
                    .collect(),
            },
        );
    }
    if result.repeats_failed > 0 {
        result.verdict = Verdict::Fail;
        let first = result
            .evidence
            .failures
            .first()
            .cloned()
            .unwrap_or_default();
        result.reason = Some(if result.repeats > 1 {
            format!(
                "{} of {} repeats failed; first: {first}",
                result.repeats_failed, result.repeats
            )
        } else {
            first
        });
    }
    result.duration_s = started.elapsed().as_secs_f64();
    result
}

/// A progress bar on a terminal; plain lines when not a TTY or when CI is set.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: usize,
}

impl Progress {
    fn new(total: usize) -> Progress {
        let tty = std::io::stdout().is_terminal() && std::env::var_os("CI").is_none();
        let bar = tty.then(|| {
            let b = indicatif::ProgressBar::new(total as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
                    .expect("static template"),
            );
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        Progress { bar, total }
    }

    fn start(&self, i: usize, name: &str) {
        match &self.bar {
            Some(b) => b.set_message(name.to_string()),
            None => crate::say!("[{}/{}] {name} ...", i + 1, self.total),
        }
    }

    fn finish(&self, i: usize, r: &ScenarioResult) {
        let verdict = match r.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        };
        let line = format!(
            "[{}/{}] {verdict} {} ({:.1} s){}",
            i + 1,
            self.total,
            r.name,
            r.duration_s,
            r.reason
                .as_deref()
                .map(|x| format!(": {x}"))
                .unwrap_or_default()
        );
        match &self.bar {
            Some(b) => {
                b.println(line);
                b.inc(1);
            }
            None => crate::say!("{line}"),
        }
    }

    fn clear(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
