//! The coordinator's judgement of every rank's record together: detection and exit times
//! against each role's expectations.

use super::*;

/// The first fault of the step: one a rank struck its own program with, or one of the
/// scenario's (a host kill, say): (the rank it struck, what, when).
pub(super) fn first_fault(
    records: &[Record],
    faults: &[StruckFault],
) -> Option<(u32, String, u64)> {
    let own = records
        .iter()
        .filter_map(|r| r.fault.map(|(a, at)| (r.rank, format!("{a:?}"), at)));
    let departed = records
        .iter()
        .filter_map(|r| r.departed_us.map(|at| (r.rank, "exit".to_string(), at)));
    let scenario = faults
        .iter()
        .map(|f| (f.rank, format!("{:?}", f.action), f.at_us));
    own.chain(departed).chain(scenario).min_by_key(|f| f.2)
}

pub(super) fn reconcile(
    e: &Exec,
    reports: &[(u32, &StepReport)],
    faults: &[StruckFault],
) -> Reconciled {
    let mut out = Reconciled::default();
    let mut records: Vec<Record> = vec![];
    for (rank, r) in reports {
        match r.outcomes::<Record>() {
            Ok(mine) => records.extend(mine),
            Err(e) => out.failures.push(format!("rank {rank}: {e}")),
        }
    }
    if records.is_empty() {
        return out;
    }
    let fault = first_fault(&records, faults);
    if fault.is_none() && e.timed() {
        out.failures.push(
            "a role's expectations are timed from a fault, but no fault struck (was its trigger never reached?)"
                .into(),
        );
    }
    let struck_by_scenario = |rank: u32| faults.iter().any(|f| f.rank == rank);
    let (mut worst_detect, mut worst_exit) = (None::<f64>, None::<f64>);
    for r in &records {
        let who = format!("rank {} ({})", r.rank, r.role);
        for v in &r.violations {
            out.failures
                .push(format!("{who}: {v}; its last lines: {}", tail(r)));
        }
        if r.unlogged_lines > 0 {
            out.notes.push(format!(
                "{who}: its log was cut at the {} MiB limit: {} lines not logged",
                e.log_limit() >> 20,
                r.unlogged_lines
            ));
        }
        if let Some(kib) = r.peak_rss_kib {
            out.notes.push(format!(
                "{who}: rank peak memory {:.1} MiB",
                kib as f64 / 1024.0
            ));
        }
        let Some((victim, action, fault_us)) = fault.clone() else {
            continue;
        };
        if let Some((a, _)) = r.fault {
            out.notes.push(format!("{who}: struck with {a:?}"));
            continue;
        }
        if r.departed_us.is_some() {
            out.notes.push(format!(
                "{who}: left on purpose ({})",
                r.exit.as_deref().unwrap_or("exited")
            ));
            continue;
        }
        if struck_by_scenario(r.rank) {
            out.notes
                .push(format!("{who}: struck by the scenario's fault"));
            continue;
        }
        let since = |t: Option<u64>| t.map(|t| (t as f64 - fault_us as f64) / 1000.0);
        let (detect, exit) = (since(r.first_error_us), since(r.exit_us));
        let role = &e.roles[&r.role];
        let x = &role.expect;
        if role.error.is_some() {
            if let Some(d) = detect {
                worst_detect = Some(worst_detect.map_or(d, |w| w.max(d)));
            }
        }
        if let Some(t) = exit {
            worst_exit = Some(worst_exit.map_or(t, |w| w.max(t)));
        }
        let fmt = |v: Option<f64>| {
            v.map(|v| format!("{v:.1} ms"))
                .unwrap_or_else(|| "never".into())
        };
        out.notes.push(format!(
            "{who}: after the {action} of rank {victim}: detect_ms {}{}, exit_ms {} ({})",
            fmt(detect),
            r.first_error
                .as_deref()
                .map(|l| format!(" (`{l}`)"))
                .unwrap_or_default(),
            fmt(exit),
            r.exit.as_deref().unwrap_or("did not exit")
        ));
        if let Some(limit) = x.detect_within {
            match detect {
                None => out.failures.push(format!(
                    "{who}: never printed an error line after the fault (wanted within {:?}); its last lines: {}",
                    limit.0,
                    tail(r)
                )),
                Some(d) if d > limit.0.as_secs_f64() * 1000.0 => out.failures.push(format!(
                    "{who}: noticed the fault after {d:.1} ms, over the {:?} allowed",
                    limit.0
                )),
                _ => {}
            }
        }
        if let (Some(floor), Some(d)) = (x.detect_not_before, detect) {
            if d < floor.0.as_secs_f64() * 1000.0 {
                out.failures.push(format!(
                    "{who}: reported the fault after {d:.1} ms, before its {:?} timeout could have fired",
                    floor.0
                ));
            }
        }
        if let Some(limit) = x.exit_within {
            match exit {
                None => out.failures.push(format!(
                    "{who}: {} but never exited ({}; its stacks are in its rank log); its last lines: {}",
                    detect
                        .map(|d| format!("logged the error {d:.1} ms after the fault"))
                        .unwrap_or("outlived the fault".into()),
                    r.ended_by_harness.as_deref().unwrap_or("killed by the harness"),
                    tail(r)
                )),
                Some(t) if t > limit.0.as_secs_f64() * 1000.0 => out.failures.push(format!(
                    "{who}: exited {t:.1} ms after the fault, over the {:?} allowed",
                    limit.0
                )),
                _ => {}
            }
        }
    }
    // A role that never became ready is the cause of what its dependents did after: first.
    out.failures.sort_by_key(|f| !f.contains(NEVER_READY));
    out.metrics.extend(worst_detect.map(|v| (DETECT_MS, v)));
    out.metrics.extend(worst_exit.map(|v| (EXIT_MS, v)));
    out
}

pub(super) fn tail(r: &Record) -> String {
    if r.tail.is_empty() {
        return "(none)".into();
    }
    r.tail
        .iter()
        .map(|l| format!("`{l}`"))
        .collect::<Vec<_>>()
        .join(" / ")
}
