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
use crate::model::name::hidden;
use crate::model::requirement::{Requirement, SkipCode, SkipReason};
use crate::model::result::{AuditRecorder, Reach, Replay};
use crate::model::result::{Latency, MetricSummary, ScenarioResult, Stacks, Verdict};
use crate::model::scenario::{AuditBackend, AuditCheck, Fault, Perturb};
use crate::rank::steps::Loaded;

mod replay_line;
mod scenario;
mod summary;
#[cfg(test)]
mod tests;

pub use self::replay_line::*;
pub use self::scenario::audit_backend_from_env;
use self::scenario::*;
pub use self::summary::latency;
pub(crate) use self::summary::summarise;

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
