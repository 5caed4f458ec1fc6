//! The coordinator's judgement: from a repeat's evidence and the scenario's expectations to
//! pass or fail, with every reason.

use std::collections::BTreeMap;

use serde_saphyr::Spanned;

use crate::model::metric::{Bound, Metric};
use crate::orchestration::coordinator::{Attempt, COORDINATOR};

/// Every reason this repeat failed; empty means it passed.
pub fn judge(attempt: &Attempt, expect: &BTreeMap<Metric, Spanned<Bound>>) -> Vec<String> {
    let mut failures = vec![];
    if let Some(e) = &attempt.setup_error {
        failures.push(format!("harness error: {e}"));
    }
    if attempt.interrupted {
        failures.push("interrupted (SIGINT/SIGTERM) before the scenario finished".into());
    }
    if let Some(h) = &attempt.hang {
        failures.push(format!("watchdog: {}", h.summary));
    }
    for e in &attempt.unexpected_exits {
        failures.push(e.clone());
    }
    for (rank, step, e) in &attempt.step_errors {
        // A rank a fault struck fails by design; its survivors' evidence is what counts.
        if !attempt.faulted_ranks.contains(rank) {
            failures.push(format!("rank {rank} step {step}: {e}"));
        }
    }
    failures.extend(attempt.audit.iter().cloned());
    failures.extend(attempt.reconciled_failures.iter().cloned());
    for l in &attempt.leftovers {
        failures.push(format!("process left behind: {l}"));
    }
    failures.extend(attempt.faults_missed.iter().cloned());
    if !failures.is_empty() {
        // Metrics of a broken run prove nothing; do not pile "missing evidence" on top.
        return failures;
    }
    for (metric, bound) in expect {
        let name = metric.as_str();
        let seen: Vec<(u32, f64)> = attempt
            .reports
            .iter()
            .filter_map(|(rank, r)| r.metrics.get(metric).map(|v| (*rank, *v)))
            .collect();
        if seen.is_empty() {
            failures.push(format!(
                "no rank reported `{name}`: no evidence for `{name}` {}",
                bound.value
            ));
        }
        for (rank, value) in seen {
            if let Err(why) = bound.value.check(value) {
                let whose = if rank == COORDINATOR {
                    "from both sides' evidence".to_string()
                } else {
                    format!("on rank {rank}")
                };
                failures.push(format!(
                    "`{name}` {whose}: {why} (expected {})",
                    bound.value
                ));
            }
        }
    }
    failures
}
