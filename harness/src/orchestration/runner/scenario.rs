//! One scenario run: its repeats under the audit's recorder, the evidence of each attempt,
//! replays of a failure, reachability, and its verdict.

use super::*;
use crate::orchestration::audit::PerturbBy;

/// `WRINGER_AUDIT_BACKEND` (`ebpf` or `strace`), when set to one of them.
pub fn audit_backend_from_env() -> Option<AuditBackend> {
    let v = std::env::var("WRINGER_AUDIT_BACKEND").ok()?;
    <AuditBackend as clap::ValueEnum>::from_str(&v, true).ok()
}

/// The syscall recorder for a scenario: strace for perturbations (it injects them) or when
/// asked for, else eBPF where every host can use it. Err: eBPF was asked for and cannot be.
pub(super) fn choose_recorder(
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

pub(super) fn run_scenario(
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
    let Overrides {
        own_faults,
        faults,
        audit,
        perturb,
    } = overrides(s, profile_audit, cx);
    let (perturb_by, perturb_why) = crate::orchestration::audit::perturb_mechanism(
        &perturb,
        &statically_linked_programs(&steps),
        matches!(placement.launch(), crate::hosts::backend::Launch::Step(_)),
    );
    // `--no-audit` runs nothing under a tracer: the scenario keeps the perturbations the
    // preloaded observer delays (they widen the race window it is about, and are no part of
    // the audit's cost), and sets aside those only strace could inject.
    let perturb = match perturb_by {
        PerturbBy::Strace if cx.opts.no_audit => vec![],
        _ => perturb,
    };
    let injected: &[Perturb] = match perturb_by {
        PerturbBy::Strace => &perturb,
        PerturbBy::Preload => &[],
    };
    if !perturb.is_empty() {
        result.evidence.perturbed_by = Some(match (perturb_by, &perturb_why) {
            (PerturbBy::Preload, _) => {
                "the preloaded observer (libc's wrappers; no tracer attached)".into()
            }
            (PerturbBy::Strace, Some(why)) => format!("strace's --inject ({why})"),
            (PerturbBy::Strace, None) => "strace's --inject".into(),
        });
    }
    let recorded = !injected.is_empty() || audit.iter().any(|c| c.reads_syscalls());
    let recorder = match choose_recorder(cx.opts.audit_backend, injected, ebpf_absent) {
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
            scenario: &s.name,
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
            perturb_by,
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
        let mut failures = crate::orchestration::verdict::judge(&attempt, &s.expect);
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
        if repeat == 0 || !failures.is_empty() {
            result.evidence.notes.extend(
                attempt
                    .perturbed
                    .iter()
                    .map(|p| format!("repeat {repeat}: perturbed: {p}")),
            );
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
            let index = cx.opts.attempt.unwrap_or(repeat);
            let exact = crate::orchestration::audit::exact_perturbations(&perturb, seed_of(repeat));
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
    let worth_it = cx.opts.replays > 0
        && result.evidence.stacks.is_empty()
        && !cx.known.iter().any(|k| k.matches(&s.name));
    if worth_it {
        replay_first_failure(
            &mut result,
            &run_attempt,
            first_failed_took.unwrap_or_default(),
            s,
            cx,
        );
    }
    summarise(&mut result, seen);
    crate::orchestration::verdict::conclude(&mut result, reach);
    result.duration_s = started.elapsed().as_secs_f64();
    result
}

/// What one scenario runs with once the command line has had its say: its own faults (or
/// `--fault`'s), with those its steps declare; the audit's checks, the scenario's and the
/// profile's; its perturbations (or `--perturb`'s). No audit under `--no-audit`; its
/// perturbations stay where the preloaded observer delays them (see [`run_scenario`]).
struct Overrides {
    own_faults: Vec<Fault>,
    faults: Vec<Fault>,
    audit: Vec<AuditCheck>,
    perturb: Vec<Perturb>,
}

fn overrides(
    s: &crate::model::scenario::Scenario<crate::rank::steps::Step>,
    profile_audit: &[AuditCheck],
    cx: &RunContext,
) -> Overrides {
    let own_faults: Vec<Fault> = match &cx.opts.faults {
        Some(f) => f.clone(),
        None => s.faults.iter().map(|f| f.value.clone()).collect(),
    };
    let faults: Vec<Fault> = own_faults.iter().cloned().chain(s.step_faults()).collect();
    let mut audit: Vec<AuditCheck> = s.audit.iter().chain(profile_audit).copied().collect();
    audit.sort();
    audit.dedup();
    let perturb: Vec<Perturb> = match &cx.opts.perturb {
        Some(p) => p.clone(),
        None => s.perturb.iter().map(|p| p.value.clone()).collect(),
    };
    if cx.opts.no_audit {
        audit.clear();
    }
    Overrides {
        own_faults,
        faults,
        audit,
        perturb,
    }
}

/// The programs the scenario's exec steps start that are statically linked (where they can be
/// found here): no preloaded library reaches their calls.
fn statically_linked_programs(steps: &[crate::rank::steps::Step]) -> Vec<String> {
    let path = crate::hosts::programs::search_path();
    let mut out = vec![];
    for step in steps {
        let crate::rank::steps::Step::Exec(e) = step else {
            continue;
        };
        for role in e.roles.values() {
            let found = crate::hosts::programs::resolve(&role.program, &path);
            if found.is_some_and(|p| crate::orchestration::audit::statically_linked(&p)) {
                out.push(role.program.clone());
            }
        }
    }
    out
}

/// Run the first failed attempt again, `--replays` times, within the scenario's deadline
/// (`took`: how long that attempt ran), and record how many of them failed too.
fn replay_first_failure(
    result: &mut ScenarioResult,
    run_attempt: &dyn Fn(u32, String) -> (coordinator::Attempt, PathBuf),
    took: Duration,
    s: &crate::model::scenario::Scenario<crate::rank::steps::Step>,
    cx: &RunContext,
) {
    let Some(repeat) = result.evidence.replays.first().map(|r| r.repeat) else {
        return;
    };
    let mut failed = 0;
    let mut of = 0;
    // The failed attempt and its replays together stay within the scenario's deadline: a
    // failure that took most of it (a program that ran to its step's deadline) is not run
    // again, so a run never spends several deadlines on one scenario.
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
        if !crate::orchestration::verdict::judge(&attempt, &s.expect).is_empty() {
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

/// Every point the scenario's steps declare, once, marked required when it must be reached.
pub(super) fn declared_points(
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
pub(super) fn count_reached(
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

pub(super) fn drop_traces(log_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(log_dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.path().extension().is_some_and(|x| x == "strace") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
