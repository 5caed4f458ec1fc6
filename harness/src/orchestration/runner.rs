//! `wringer run`: every scenario in turn, decided by the policy (run, skip or fail), run with
//! its repeats, judged, and announced to the reporters as events.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use hdrhistogram::Histogram;

use super::coordinator::{self, Plan};
use super::events::{Counts, Reporter, RunEvent, RunMeta};
use super::policy::{Decision, Policy};
use super::preflight;
use crate::hosts::placement::Placement;
use crate::hosts::probe::HostFacts;
use crate::hosts::profile::HostProfile;
use crate::hosts::vm;
use crate::model::failure::{Failed, Failure};
use crate::model::known;
use crate::model::metric::{Metric, SampleKey};
use crate::model::requirement::{Requirement, SkipCode, SkipReason};
use crate::model::result::{AuditRecorder, Reach, Replay};
use crate::model::result::{Latency, MetricSummary, ScenarioResult, Stacks, Verdict};
use crate::model::scenario::{AuditBackend, AuditCheck, Fault, Perturb};
use crate::rank::steps::Loaded;

#[derive(Default)]
pub struct RunOptions {
    pub report_dir: Option<PathBuf>,
    pub filter: Option<String>,
    pub repeat: Option<u32>,
    pub seed: Option<u64>,
    pub strict: bool,
    /// Ignore the audit and perturbations scenarios and the profile ask for.
    pub no_audit: bool,
    /// Run attempt A of the seed alone (its seed is the run's + A); with `repeat` N, N times.
    pub attempt: Option<u32>,
    /// In place of the scenarios' own perturbations and scenario-level faults (what a replay
    /// line or a shrink gives).
    pub perturb: Option<Vec<Perturb>>,
    pub faults: Option<Vec<Fault>>,
    /// Repeat until the first failure, at most this many attempts (in place of `repeat`).
    pub until_fail: Option<u32>,
    /// Replay a scenario's first failed attempt this many times after it, to tell a
    /// deterministic failure from a flaky one.
    pub replays: u32,
    /// How a printed replay line reruns this run.
    pub rerun: Rerun,
    /// The audit's syscall recorder; `None` picks eBPF where every host can use it.
    pub audit_backend: Option<AuditBackend>,
    /// Audit findings silenced by the user's suppression files (counted in the notes).
    pub suppressions: Vec<crate::model::suppression::Suppression>,
}

/// The command a replay line starts with (`wringer run --hosts P`), and what ends it: the
/// scenario file (None) or, for `wringer audit`, `-- PROGRAM ARGS`.
#[derive(Clone, Debug, Default)]
pub struct Rerun {
    pub head: Vec<String>,
    pub tail: Option<Vec<String>>,
}

impl Rerun {
    /// The line that reruns attempt `attempt` of `seed` alone, with `perturb` and `faults`
    /// spelled out (`--shrink` makes it the shrink command).
    /// `release`: the variable and folder that pin the release the scenario ran against (a
    /// torch scenario runs once per installed release), put before the command.
    #[allow(clippy::too_many_arguments)]
    pub fn line(
        &self,
        file: &Path,
        release: Option<(&str, &Path)>,
        seed: u64,
        attempt: u32,
        perturb: &[Perturb],
        faults: &[Fault],
        shrink: bool,
    ) -> String {
        let mut w: Vec<String> = self.head.clone();
        if let Some(i) = w.iter().position(|x| x == "--hosts") {
            if let Some(h) = w.get_mut(i + 1) {
                *h = path_arg(Path::new(h.as_str()));
            }
        }
        w.extend(["--seed".into(), seed.to_string()]);
        w.extend(["--attempt".into(), attempt.to_string()]);
        for p in perturb {
            w.push("--perturb".into());
            w.push(flow_yaml(p));
        }
        for f in faults {
            w.push("--fault".into());
            w.push(flow_yaml(f));
        }
        if shrink {
            w.push("--shrink".into());
        }
        match &self.tail {
            Some(t) => w.extend(t.iter().cloned()),
            None => w.push(path_arg(file)),
        }
        let words = w.iter().map(|x| shell_word(x));
        // An assignment before the command: the variable's name bare, its value quoted.
        let env =
            release.map(|(var, root)| format!("{var}={}", shell_word(&root.display().to_string())));
        env.into_iter().chain(words).collect::<Vec<_>>().join(" ")
    }
}

/// The variable and folder that pin the release a scenario copy runs against, if any.
pub fn release_env<S>(l: &crate::model::scenario::Loaded<S>) -> Option<(&'static str, &Path)> {
    let family = l.scenario.releases?;
    let r = l.scenario.release.as_ref()?;
    Some((crate::hosts::releases::variable(family), r.root.as_path()))
}

/// A path as a command-line word that no parser reads as an option: `-x.yaml` is `./-x.yaml`.
pub fn path_arg(p: &Path) -> String {
    let s = p.display().to_string();
    if s.starts_with('-') {
        format!("./{s}")
    } else {
        s
    }
}

/// `x` as one line of YAML flow style: `{syscall: poll, delay_exit: 100us, when: 3+2}`.
pub fn flow_yaml<T: serde::Serialize>(x: &T) -> String {
    fn value(v: &serde_json::Value) -> String {
        use serde_json::Value as V;
        match v {
            V::Object(m) => {
                let items: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", value(v)))
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
            V::Array(a) => format!("[{}]", a.iter().map(value).collect::<Vec<_>>().join(", ")),
            // Plain unless YAML would read it as a number (or it holds other characters).
            V::String(s)
                if s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c))
                    && s.chars().any(|c| c.is_ascii_alphabetic() || c == '+') =>
            {
                s.clone()
            }
            other => other.to_string(),
        }
    }
    serde_json::to_value(x)
        .map(|v| value(&v))
        .unwrap_or_default()
}

/// `x` as one shell word: quoted when it holds anything but plain characters. A word with a
/// control or a bidirectional-text character is written `$'…'` with those escaped, so the
/// line shows what it runs (an override cannot reorder it on the screen) and pastes back the
/// same bytes.
pub fn shell_word(x: &str) -> String {
    let plain = !x.is_empty()
        && x.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c));
    if plain {
        x.to_string()
    } else if x.chars().any(hidden) {
        let mut out = String::from("$'");
        for c in x.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\'' => out.push_str("\\'"),
                // Byte by byte (`\xHH`): the same bytes whatever the shell's locale.
                c if hidden(c) => {
                    for b in c.to_string().bytes() {
                        out.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('\'');
        out
    } else {
        format!("'{}'", x.replace('\'', "'\\''"))
    }
}

use crate::model::name::hidden;

/// Run the scenarios; returns the process exit code (0 pass/skip, 1 any failure).
pub fn run(
    scenarios: Vec<Loaded>,
    profile: &HostProfile,
    opts: &RunOptions,
    reporters: &mut [&mut dyn Reporter],
) -> Result<i32> {
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
        .filter(|l| selects(opts.filter.as_deref(), l))
        .collect();
    // Hosts come up once per run (containers started, the binary deployed over SSH, VMs
    // booted), and are probed where they are.
    let here = if selected.is_empty() {
        Ok((
            crate::hosts::placement::local(),
            vec![crate::hosts::probe::local()],
        ))
    } else {
        let mut shares: Vec<PathBuf> = selected
            .iter()
            .filter_map(|l| l.scenario.release.as_ref().map(|r| r.root.clone()))
            .collect();
        shares.sort();
        shares.dedup();
        bring_up(profile, &run_id, &shares, &dir)?
    };
    let facts = here.as_ref().map(|(_, f)| f.clone()).unwrap_or_default();
    let meta = RunMeta::new(
        run_id.clone(),
        profile.name.clone(),
        seed,
        facts.clone(),
        now.as_secs(),
    );
    let mut out = Stream {
        reporters,
        counts: Counts::default(),
        started,
    };
    out.emit(RunEvent::Started {
        meta: &meta,
        dir: &dir,
        scenarios: selected.len(),
    })?;
    // Where the kernel has no RDMA device, a profile's `rdma_vm` runs the scenarios that need
    // RDMA, in its VMs; the rest run here.
    let rdma_vm = rdma_vm_here(profile, &facts);
    let (for_vm, on_here): (Vec<&Loaded>, Vec<&Loaded>) = match rdma_vm {
        Some(_) => selected
            .into_iter()
            .partition(|l| l.scenario.requires.contains(&Requirement::Rdma)),
        None => (vec![], selected),
    };
    if let Some(vm) = rdma_vm.filter(|_| !for_vm.is_empty()) {
        eprintln!(
            "no RDMA device in this kernel: the scenarios that need RDMA run in the soft-RoCE VMs of {} (WRINGER_NO_VM=1 skips them instead)",
            vm.file.display()
        );
    }
    let cx = RunContext {
        opts,
        seed,
        dir: &dir,
        interrupted: &interrupted,
        known: profile.known.clone(),
    };
    let mut position = 0;
    run_group(&on_here, profile, here, &cx, &mut out, &mut position)?;
    // An interrupted run boots no VM (a boot under TCG takes a minute).
    if let Some(vm) = rdma_vm.filter(|_| !for_vm.is_empty() && !interrupted.load(Ordering::Relaxed))
    {
        let up = bring_up(vm, &run_id, &[], &dir)?;
        let cx = RunContext {
            known: profile.known.iter().chain(&vm.known).cloned().collect(),
            ..cx
        };
        run_group(&for_vm, vm, up, &cx, &mut out, &mut position)?;
    }
    let was_interrupted = interrupted.load(Ordering::Relaxed);
    let counts = out.counts;
    out.emit(RunEvent::Finished {
        counts,
        interrupted: was_interrupted,
        elapsed: started.elapsed(),
    })?;
    Ok(if counts.fail > 0 || was_interrupted {
        1
    } else {
        0
    })
}

/// Whether `--filter` picks the scenario: by its name, its file's name, or a requirement
/// (`xhost`, `rdma`).
pub fn selects(filter: Option<&str>, l: &Loaded) -> bool {
    filter.is_none_or(|f| {
        l.scenario.name.contains(f)
            || l.scenario.file_name().contains(f)
            || l.scenario
                .requires
                .iter()
                .any(|r| format!("{r:?}").eq_ignore_ascii_case(f))
    })
}

/// The profile that runs this run's RDMA scenarios instead of `profile`: its `rdma_vm`, when
/// no host's kernel has an RDMA device and WRINGER_NO_VM is not 1.
fn rdma_vm_here<'p>(profile: &'p HostProfile, facts: &[HostFacts]) -> Option<&'p HostProfile> {
    let vm = profile.rdma_fallback.as_deref()?;
    let no_device = !facts.is_empty() && facts.iter().all(|f| f.rdma_absent.is_some());
    let opted_out = std::env::var("WRINGER_NO_VM").is_ok_and(|v| v == "1");
    (no_device && !opted_out).then_some(vm)
}

/// The reporters and the running counts.
struct Stream<'r, 'a> {
    reporters: &'r mut [&'a mut dyn Reporter],
    counts: Counts,
    started: Instant,
}

impl Stream<'_, '_> {
    fn emit(&mut self, e: RunEvent) -> Result<()> {
        for r in self.reporters.iter_mut() {
            r.on_event(&e)?;
        }
        Ok(())
    }

    fn finished(&mut self, index: usize, result: ScenarioResult) -> Result<()> {
        self.counts.add(result.verdict);
        let elapsed = self.started.elapsed();
        self.emit(RunEvent::ScenarioFinished {
            index,
            result: &result,
            elapsed,
        })
    }
}

/// A profile's hosts, up and probed; or why its scenarios cannot run at all: a VM that cannot
/// run on this machine (nothing installed) is a typed skip under the policy, and hosts that
/// should have come up and did not are a harness error for each scenario. Other profiles'
/// failures to come up end the run.
type HostsUp = std::result::Result<(Placement, Vec<HostFacts>), NotUp>;

enum NotUp {
    Unavailable(SkipReason),
    Failed(String),
}

fn bring_up(
    profile: &HostProfile,
    run_id: &str,
    shares: &[PathBuf],
    dir: &Path,
) -> Result<HostsUp> {
    let is_vm = profile.vm().is_some();
    if let Some(detail) = vm::unavailable(profile).filter(|_| is_vm) {
        return Ok(Err(NotUp::Unavailable(SkipReason {
            code: SkipCode::NoVm,
            detail,
        })));
    }
    let cx = crate::hosts::placement::Prepare {
        run_id,
        shares,
        dir: Some(dir),
    };
    let up = crate::hosts::placement::prepare_with(profile, &cx).and_then(|p| {
        let facts = crate::hosts::placement::facts(&p)?;
        Ok((p, facts))
    });
    match up {
        Ok(up) => Ok(Ok(up)),
        Err(e) if is_vm => Ok(Err(NotUp::Failed(format!(
            "the soft-RoCE VMs could not be brought up: {e:#}"
        )))),
        Err(e) => Err(e),
    }
}

/// Run `loaded` on one profile's hosts, in turn, each decided by the policy.
fn run_group(
    loaded: &[&Loaded],
    profile: &HostProfile,
    up: HostsUp,
    cx: &RunContext,
    out: &mut Stream,
    position: &mut usize,
) -> Result<()> {
    let (placement, facts) = match up {
        Ok(up) => up,
        Err(not_up) => {
            let policy = Policy {
                profile,
                facts: &[],
                strict: cx.opts.strict,
                strikes: Default::default(),
                no_audit: cx.opts.no_audit,
            };
            for l in loaded {
                let s = &l.scenario;
                let mut result = match &not_up {
                    NotUp::Unavailable(reason) => policy
                        .unmet(reason.clone(), &s.requires)
                        .result(&s.name, &l.path)
                        .unwrap_or_else(|| unreachable_run(&s.name, &l.path)),
                    NotUp::Failed(detail) => ScenarioResult::failed_before_running(
                        &s.name,
                        &l.path,
                        Failure::HarnessError {
                            detail: detail.clone(),
                        },
                    ),
                };
                known::apply(&mut result, &cx.known, cx.opts.strict);
                out.finished(*position, result)?;
                *position += 1;
            }
            return Ok(());
        }
    };
    let policy = Policy {
        profile,
        facts: &facts,
        strict: cx.opts.strict,
        strikes: placement.strikes(),
        no_audit: cx.opts.no_audit,
    };
    // Why the hosts cannot all record syscalls with eBPF, if they cannot.
    let ebpf_absent: Option<String> = facts.iter().find_map(|f| {
        f.ebpf_absent
            .as_ref()
            .map(|why| format!("eBPF unusable on {}: {why}", f.host))
    });
    for loaded in loaded {
        let i = *position;
        *position += 1;
        if cx.interrupted.load(Ordering::Relaxed) {
            break;
        }
        let s = &loaded.scenario;
        let mut decision = policy.decide(s);
        if decision == Decision::Run {
            let needs = crate::rank::steps::preflight(&loaded.steps());
            if let Some(reason) = preflight::unmet(&needs, &placement) {
                decision = policy.unmet(reason, &[]);
            }
        }
        let mut result = match decision.result(&s.name, &loaded.path) {
            Some(not_run) => not_run,
            None => {
                out.emit(RunEvent::ScenarioStarted {
                    index: i,
                    name: &s.name,
                })?;
                run_scenario(
                    loaded,
                    &profile.audit,
                    &placement,
                    ebpf_absent.as_deref(),
                    cx,
                )
            }
        };
        known::apply(&mut result, &cx.known, cx.opts.strict);
        out.finished(i, result)?;
    }
    Ok(())
}

/// `unmet` never decides to run; should it ever, the scenario fails rather than vanish.
fn unreachable_run(name: &str, file: &Path) -> ScenarioResult {
    ScenarioResult::failed_before_running(
        name,
        file,
        Failure::HarnessError {
            detail: "the policy ran a scenario it could not run".into(),
        },
    )
}

/// What every scenario of one run shares.
struct RunContext<'a> {
    opts: &'a RunOptions,
    seed: u64,
    dir: &'a Path,
    interrupted: &'a AtomicBool,
    /// The known failures that apply: the profile's, and its VM profile's for the scenarios
    /// run there.
    known: Vec<known::KnownFailure>,
}

/// Everything the repeats of one scenario observed, before it is summarised.
#[derive(Default)]
pub(crate) struct Observed {
    pub(crate) metrics: BTreeMap<Metric, Vec<f64>>,
    pub(crate) samples: BTreeMap<SampleKey, Vec<f64>>,
}

/// `WRINGER_AUDIT_BACKEND` (`ebpf` or `strace`), when set to one of them.
pub fn audit_backend_from_env() -> Option<AuditBackend> {
    let v = std::env::var("WRINGER_AUDIT_BACKEND").ok()?;
    <AuditBackend as clap::ValueEnum>::from_str(&v, true).ok()
}

/// The syscall recorder for a scenario: strace for perturbations (it injects them) or when
/// asked for, else eBPF where every host can use it. Err: eBPF was asked for and cannot be.
fn choose_recorder(
    asked: Option<AuditBackend>,
    perturb: &[Perturb],
    ebpf_absent: Option<&str>,
) -> Result<AuditRecorder, String> {
    let strace = |why: &str| AuditRecorder {
        backend: AuditBackend::Strace,
        fallback: Some(why.to_string()),
    };
    Ok(match (asked, ebpf_absent) {
        _ if !perturb.is_empty() => strace("perturbations are injected by strace"),
        (Some(AuditBackend::Strace), _) => strace("asked for"),
        (_, None) => AuditRecorder {
            backend: AuditBackend::Ebpf,
            fallback: None,
        },
        (Some(AuditBackend::Ebpf), Some(why)) => {
            return Err(format!("the eBPF audit backend was asked for, but {why}"))
        }
        (None, Some(why)) => strace(why),
    })
}

fn run_scenario(
    loaded: &Loaded,
    profile_audit: &[AuditCheck],
    placement: &Placement,
    ebpf_absent: Option<&str>,
    cx: &RunContext,
) -> ScenarioResult {
    let s = &loaded.scenario;
    let started = Instant::now();
    let mut result = ScenarioResult::not_run(&s.name, &loaded.path, Verdict::Pass, String::new());
    result.reason = None;
    let steps = loaded.steps();
    let own_faults: Vec<Fault> = match &cx.opts.faults {
        Some(f) => f.clone(),
        None => s.faults.iter().map(|f| f.value.clone()).collect(),
    };
    let faults: Vec<Fault> = own_faults.iter().cloned().chain(s.step_faults()).collect();
    let mut audit: Vec<AuditCheck> = s.audit.iter().chain(profile_audit).copied().collect();
    audit.sort();
    audit.dedup();
    let mut perturb: Vec<Perturb> = match &cx.opts.perturb {
        Some(p) => p.clone(),
        None => s.perturb.iter().map(|p| p.value.clone()).collect(),
    };
    if cx.opts.no_audit {
        audit.clear();
        perturb.clear();
    }
    let recorded = !perturb.is_empty() || audit.iter().any(|c| c.reads_syscalls());
    let recorder = match choose_recorder(cx.opts.audit_backend, &perturb, ebpf_absent) {
        Ok(r) => r,
        Err(detail) if recorded => {
            return ScenarioResult::failed_before_running(
                &s.name,
                &loaded.path,
                Failure::HarnessError { detail },
            )
        }
        Err(_) => AuditRecorder {
            backend: AuditBackend::Strace,
            fallback: None,
        },
    };
    result.evidence.audit_recorder = recorded.then(|| recorder.clone());
    let repeats = cx
        .opts
        .until_fail
        .unwrap_or_else(|| cx.opts.repeat.unwrap_or(s.repeat));
    // Attempt `repeat` runs with the run's seed + its index; `--attempt A` runs A each time.
    let seed_of = |repeat: u32| {
        cx.seed
            .wrapping_add(cx.opts.attempt.unwrap_or(repeat) as u64)
    };
    // Attempt `repeat` (a repeat, or a replay of one), its logs in `folder`.
    let run_attempt = |repeat: u32, folder: String| {
        let log_dir = cx.dir.join("logs").join(&s.name).join(folder);
        let plan = Plan {
            audit: &audit,
            perturb: &perturb,
            backend: recorder.backend,
            ranks: loaded.ranks(),
            steps: &steps,
            faults: &faults,
            deadline: s.deadline.0,
            seed: seed_of(repeat),
            log_dir: &log_dir,
            interrupted: cx.interrupted,
            placement,
            suppressions: &cx.opts.suppressions,
        };
        (coordinator::run(&plan), log_dir)
    };
    let mut seen = Observed::default();
    let mut first_failed_took: Option<Duration> = None;
    let mut reach = declared_points(&steps, s);
    for repeat in 0..repeats {
        if cx.interrupted.load(Ordering::Relaxed) {
            result.evidence.failures.push(Failed {
                repeat: Some(repeat),
                failure: Failure::Interrupted {
                    detail: "interrupted before every repeat ran".into(),
                },
            });
            result.repeats_failed += 1;
            break;
        }
        let attempt_started = Instant::now();
        let (attempt, log_dir) = run_attempt(repeat, format!("repeat-{repeat}"));
        let took = attempt_started.elapsed();
        let mut failures = super::verdict::judge(&attempt, &s.expect);
        if !failures.is_empty() && first_failed_took.is_none() {
            first_failed_took = Some(took);
        }
        result.repeats += 1;
        failures.extend(count_reached(&mut reach, &attempt.reports));
        for (_, r) in &attempt.reports {
            for (k, v) in &r.metrics {
                seen.metrics.entry(*k).or_default().push(*v);
            }
            for (k, v) in &r.samples {
                seen.samples.entry(*k).or_default().extend(v);
            }
            if repeat == 0 || !failures.is_empty() {
                result
                    .evidence
                    .notes
                    .extend(r.notes.iter().map(|n| format!("repeat {repeat}: {n}")));
            }
        }
        result.evidence.notes.extend(
            attempt
                .audit_suppressed
                .iter()
                .map(|(by, n)| format!("repeat {repeat}: audit: {n} finding(s) suppressed: {by}")),
        );
        result.evidence.faults.extend(
            attempt
                .faults_struck
                .iter()
                .map(|f| format!("repeat {repeat}: {f}")),
        );
        result.evidence.rejected_rendezvous_connections += attempt.rejected_connections;
        if !failures.is_empty() {
            result.repeats_failed += 1;
            let index = cx.opts.attempt.unwrap_or(repeat);
            let exact = super::audit::exact_perturbations(&perturb, seed_of(repeat));
            let line = |shrink| {
                cx.opts.rerun.line(
                    &loaded.path,
                    release_env(loaded),
                    cx.seed,
                    index,
                    &exact,
                    &own_faults,
                    shrink,
                )
            };
            result.evidence.replays.push(Replay {
                repeat,
                command: line(false),
                shrink: line(true),
                replayed: None,
            });
            result
                .evidence
                .failures
                .extend(failures.into_iter().map(|failure| Failed {
                    repeat: Some(repeat),
                    failure,
                }));
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
        } else {
            // A passing repeat's syscall traces are large and prove nothing new; the first
            // repeat's and every failing one's stay.
            drop_traces(&log_dir);
        }
        // A hang or interruption ends the scenario: further repeats would only repeat it.
        if !result.evidence.stacks.is_empty() || attempt.interrupted {
            break;
        }
        if cx.opts.until_fail.is_some() && result.repeats_failed > 0 {
            break;
        }
    }
    // Replay the first failed attempt: deterministic or flaky is part of the evidence.
    // Not a hang (each replay would wait out its deadline again), nor a known failure.
    let first_failed = result.evidence.replays.first().map(|r| r.repeat);
    let worth_it = cx.opts.replays > 0
        && result.evidence.stacks.is_empty()
        && !cx.known.iter().any(|k| k.matches(&s.name));
    if let Some(repeat) = first_failed.filter(|_| worth_it) {
        let mut failed = 0;
        let mut of = 0;
        // The failed attempt and its replays together stay within the scenario's deadline: a
        // failure that took most of it (a program that ran to its step's deadline) is not run
        // again, so a run never spends several deadlines on one scenario.
        let took = first_failed_took.unwrap_or_default();
        for n in 0..cx.opts.replays {
            if cx.interrupted.load(Ordering::Relaxed) {
                break;
            }
            if took * (n + 2) > s.deadline.0 {
                result.evidence.notes.push(format!(
                    "replayed {n} of {} times: another replay ({:.1} s) would run past the scenario's deadline ({:?})",
                    cx.opts.replays,
                    took.as_secs_f64(),
                    s.deadline.0
                ));
                break;
            }
            let (attempt, log_dir) = run_attempt(repeat, format!("replay-{repeat}-{n}"));
            of += 1;
            if !super::verdict::judge(&attempt, &s.expect).is_empty() {
                failed += 1;
            } else {
                drop_traces(&log_dir);
            }
            if attempt.hang.is_some() || attempt.interrupted {
                break;
            }
        }
        result.evidence.replays[0].replayed = Some((failed, of));
    }
    summarise(&mut result, seen);
    for r in &mut reach {
        r.repeats = result.repeats;
    }
    // A required point no repeat reached fails the scenario (not when it was cut short).
    let cut_short = result.evidence.failures.iter().any(|f| {
        matches!(
            f.failure,
            Failure::Interrupted { .. } | Failure::Watchdog { .. }
        )
    });
    let never: Vec<Failed> = reach
        .iter()
        .filter(|r| r.required && r.repeats_reached == 0 && r.repeats > 0 && !cut_short)
        .map(|r| Failed {
            repeat: None,
            failure: Failure::NeverReached {
                point: r.point.clone(),
                meaning: r.meaning.clone(),
                repeats: r.repeats,
            },
        })
        .collect();
    result.evidence.reach = reach;
    if !never.is_empty() && result.repeats_failed == 0 {
        result.verdict = Verdict::Fail;
        result.reason = Some(
            never
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    result.evidence.failures.extend(never);
    if result.repeats_failed > 0 {
        result.verdict = Verdict::Fail;
        let first = result
            .evidence
            .failures
            .first()
            .map(|f| f.to_string())
            .unwrap_or_default();
        let mut reason = if result.repeats > 1 {
            format!(
                "{} of {} repeats failed; first: {first}",
                result.repeats_failed, result.repeats
            )
        } else {
            first
        };
        if let Some(r) = result.evidence.replays.first() {
            if let Some(st) = r.stability() {
                reason.push_str(&format!(" ({st})"));
            }
        }
        result.reason = Some(reason);
    }
    result.duration_s = started.elapsed().as_secs_f64();
    result
}

/// Every point the scenario's steps declare, once, marked required when it must be reached.
fn declared_points(
    steps: &[crate::rank::steps::Step],
    s: &crate::model::scenario::Scenario<crate::rank::steps::Step>,
) -> Vec<Reach> {
    let mut out: Vec<Reach> = vec![];
    for p in steps
        .iter()
        .flat_map(|st| crate::model::scenario::StepSpec::reach_points(st))
    {
        if out.iter().all(|r| r.point != p.name) {
            out.push(Reach {
                point: p.name.into(),
                meaning: p.meaning.into(),
                required: s.must_reach.iter().any(|m| m.value == p.name),
                ..Reach::default()
            });
        }
    }
    out
}

/// One repeat's reports: which points it reached (any rank), and how often. A point no step
/// declares is a defect of the step kind that reported it.
fn count_reached(
    reach: &mut [Reach],
    reports: &[(u32, crate::rank::protocol::StepReport)],
) -> Vec<Failure> {
    let mut undeclared: Vec<Failure> = vec![];
    for (rank, rep) in reports {
        for name in rep.reached.keys() {
            if reach.iter().all(|r| &r.point != name) {
                undeclared.push(Failure::HarnessError {
                    detail: format!(
                        "rank {rank} step {} reported reaching `{name}`, a point its kind does not declare",
                        rep.step
                    ),
                });
            }
        }
    }
    for r in reach.iter_mut() {
        let times: u64 = reports
            .iter()
            .filter_map(|(_, rep)| rep.reached.get(&r.point))
            .sum();
        r.times += times;
        r.repeats_reached += u32::from(times > 0);
    }
    undeclared
}

fn drop_traces(log_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(log_dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.path().extension().is_some_and(|x| x == "strace") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Metric summaries and latency percentiles, per metric and per series and size.
pub(crate) fn summarise(result: &mut ScenarioResult, seen: Observed) {
    for (k, v) in seen.metrics {
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
    for (k, v) in seen.samples {
        result.latency.insert(k, latency(&v));
    }
}

/// Percentiles and a log-bucket histogram of latency samples (µs).
pub fn latency(samples: &[f64]) -> Latency {
    let mut h = Histogram::<u64>::new(3).expect("3 significant digits is valid");
    for x in samples {
        let _ = h.record((x * 1000.0).max(1.0) as u64);
    }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::protocol::StepReport;

    fn point(name: &str, required: bool) -> Reach {
        Reach {
            point: name.into(),
            required,
            ..Reach::default()
        }
    }

    #[test]
    fn a_point_counts_once_per_repeat_that_any_rank_reached_and_undeclared_ones_fail() {
        let mut reach = vec![point("a", true), point("b", false)];
        let mut r0 = StepReport::new(0);
        r0.reached.insert("a".into(), 3);
        let mut r1 = StepReport::new(0);
        r1.reached.insert("a".into(), 2);
        let reports = [(0, r0), (1, r1)];
        assert!(count_reached(&mut reach, &reports).is_empty());
        assert!(count_reached(&mut reach, &[]).is_empty());
        assert_eq!((reach[0].repeats_reached, reach[0].times), (1, 5));
        assert_eq!(reach[1].repeats_reached, 0);
        let mut stray = StepReport::new(0);
        stray.reached.insert("stray".into(), 1);
        let f = count_reached(&mut reach, &[(0, stray)]);
        assert_eq!(f.len(), 1);
        assert!(f[0].to_string().contains("`stray`"), "{}", f[0]);
    }

    #[test]
    fn a_replay_line_spells_out_seed_attempt_perturbations_and_faults_as_shell_words() {
        let rerun = Rerun {
            head: vec![
                "wringer".into(),
                "run".into(),
                "--hosts".into(),
                "hosts/local.yaml".into(),
            ],
            tail: None,
        };
        let p: Perturb =
            serde_saphyr::from_str("{ syscall: poll, delay_exit: 100us, when: \"3+2\" }").unwrap();
        let f: Fault =
            serde_saphyr::from_str("{ rank: 1, at: mid-stream, action: sigkill }").unwrap();
        let line = rerun.line(
            Path::new("scenarios/x.yaml"),
            None,
            42,
            3,
            &[p],
            &[f],
            false,
        );
        assert_eq!(
            line,
            "wringer run --hosts hosts/local.yaml --seed 42 --attempt 3 \
             --perturb '{delay_exit: 100us, syscall: poll, when: 3+2}' \
             --fault '{action: sigkill, at: mid-stream, rank: 1}' scenarios/x.yaml"
        );
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }

    #[test]
    fn a_torch_scenario_s_line_pins_its_release_and_pastes_back_to_the_same_words() {
        let rerun = Rerun {
            head: vec![
                "wringer".into(),
                "run".into(),
                "--hosts".into(),
                "-h.yaml".into(),
            ],
            tail: None,
        };
        let root = Path::new("/srv/torch venvs/2.8.0");
        let line = rerun.line(
            Path::new("-x\u{202e}.yaml"),
            Some(("WRINGER_TORCH", root)),
            7,
            0,
            &[],
            &[],
            true,
        );
        assert!(
            line.starts_with("WRINGER_TORCH='/srv/torch venvs/2.8.0' wringer run"),
            "{line}"
        );
        assert!(!line.contains('\u{202e}'), "{line}");
        // bash reads it back as the same assignment and words.
        let out = std::process::Command::new("bash")
            .args([
                "-c",
                &format!("wringer() {{ printf '%s|' \"$WRINGER_TORCH\" \"$@\"; }}; {line}"),
            ])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/srv/torch venvs/2.8.0|run|--hosts|./-h.yaml|--seed|7|--attempt|0|--shrink|./-x\u{202e}.yaml|"
        );
    }
}
