//! The judgement: from a repeat's evidence and the scenario's expectations to pass or fail,
//! with every reason; and from every repeat to the scenario's verdict and its reason.

use std::collections::BTreeMap;

use serde_saphyr::Spanned;

use crate::model::failure::{Failed, Failure};
use crate::model::metric::{Bound, Metric};
use crate::model::result::{Reach, ScenarioResult, Verdict};
use crate::orchestration::coordinator::Attempt;

/// Every reason this repeat failed; empty means it passed.
pub fn judge(attempt: &Attempt, expect: &BTreeMap<Metric, Spanned<Bound>>) -> Vec<Failure> {
    let mut failures = vec![];
    if let Some(detail) = &attempt.setup_error {
        failures.push(Failure::HarnessError {
            detail: detail.clone(),
        });
    }
    if attempt.interrupted {
        failures.push(Failure::Interrupted {
            detail: "interrupted (SIGINT/SIGTERM) before the scenario finished".into(),
        });
    }
    if let Some(h) = &attempt.hang {
        failures.push(Failure::Watchdog {
            summary: h.summary.clone(),
        });
    }
    for detail in &attempt.unexpected_exits {
        failures.push(Failure::UnexpectedExit {
            detail: detail.clone(),
        });
    }
    for (rank, step, error) in &attempt.step_errors {
        // A rank a fault struck fails by design; its survivors' evidence is what counts.
        if !attempt.faulted_ranks.contains(rank) {
            failures.push(Failure::StepError {
                rank: *rank,
                step: *step,
                error: error.clone(),
            });
        }
    }
    failures.extend(attempt.audit.iter().cloned());
    failures.extend(attempt.reconciled_failures.iter().cloned());
    for process in &attempt.leftovers {
        failures.push(Failure::Leftover {
            process: process.clone(),
        });
    }
    for detail in &attempt.faults_missed {
        failures.push(Failure::FaultMissed {
            detail: detail.clone(),
        });
    }
    if !failures.is_empty() {
        // Metrics of a broken run prove nothing; do not pile "missing evidence" on top.
        return failures;
    }
    for (metric, bound) in expect {
        let seen: Vec<(u32, f64)> = attempt
            .reports
            .iter()
            .filter_map(|(rank, r)| r.metrics.get(metric).map(|v| (*rank, *v)))
            .collect();
        if seen.is_empty() {
            failures.push(Failure::Bound {
                metric: *metric,
                rank: None,
                value: None,
                expected: bound.value,
            });
        }
        for (rank, value) in seen {
            if bound.value.check(value).is_err() {
                failures.push(Failure::Bound {
                    metric: *metric,
                    rank: Some(rank),
                    value: Some(value),
                    expected: bound.value,
                });
            }
        }
    }
    failures
}

/// A scenario's verdict and its reason, once every repeat and replay is recorded: it fails
/// when a repeat failed (the reason: the first failure, how many repeats failed, and how
/// its replays went), or when a point it must reach no repeat reached (unless the run was
/// cut short).
pub fn conclude(result: &mut ScenarioResult, mut reach: Vec<Reach>) {
    for r in &mut reach {
        r.repeats = result.repeats;
    }
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
}
