//! The audit's observers behind one trait. An observer is wrapped around or preloaded into
//! every rank (the launcher does that, from the plan's checks); after a run it says what it
//! recorded for a rank, and what each recording shows, as findings of one type. The coordinator
//! runs every observer the same way (`audit`): fetch each rank's recordings (from its host),
//! check them in parallel (a checker that panics is a finding: it proves nothing), drop what a
//! suppression names (counted), and report each finding with the recording that shows it.
//!
//! - [`Syscalls`]: the syscall recorder (eBPF or strace), one trace per rank. The sync
//!   observer's events travel inside it (its markers are syscalls), so one trace holds one
//!   order of descriptors, locks and waits; its module maps name the call sites.
//! - [`Verbs`]: the verbs observer, one trace per process that touched verbs.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use crate::model::failure::Failure;
use crate::model::scenario::AuditCheck;
use crate::model::suppression::Suppression;
use crate::orchestration::launcher::RankGroup;
use crate::orchestration::{audit, call_sites, verbs_audit};

/// Violations shown per rank and observer before "N more".
const MAX_SHOWN: usize = 5;

/// One broken invariant an observer found, with the recording lines that show it.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// The invariant's short name (suppressions and known failures match on it).
    pub check: &'static str,
    /// The process it happened in, where the recording says (the syscall trace does).
    pub pid: Option<u32>,
    /// The program it happened in, where the recording names it.
    pub program: Option<String>,
    /// What happened, in a sentence (with the process, threads and call sites).
    pub detail: String,
    /// (line number, line) of the recording around it.
    pub context: Vec<(usize, String)>,
    /// Judged by order alone (see the syscall audit's `Violation::by_order`).
    pub by_order: bool,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.detail)?;
        for (n, l) in &self.context {
            write!(f, "\n    {n:>6}: {l}")?;
        }
        Ok(())
    }
}

/// What an observer recorded for a rank: one file's text.
pub struct Recording {
    pub path: PathBuf,
    pub text: String,
    /// The typed events of `text`, where its recorder wrote them (`model::traced::codec`).
    pub calls: Option<Vec<u8>>,
}

/// An observer of ranks: what it recorded, and what that shows.
pub trait Observer: Sync {
    /// How its findings are labelled (`rank 0`, `rank 0 (program) verbs`).
    fn label(&self, rank: u32, rec: &Recording) -> String;
    /// Rank `rank`'s recordings, fetched from its host; `Err` says why they could not be.
    fn collect(&self, group: &RankGroup, rank: u32) -> Result<Vec<Recording>, String>;
    /// What is wrong with a recording itself (empty, events lost): never clean.
    fn problems(&self, rank: u32, rec: &Recording) -> Vec<String>;
    /// The findings in one recording (pure: run on a thread of its own).
    fn analyse(&self, rec: &Recording) -> Vec<Finding>;
    /// Add what only this host knows (call sites by name, where the stacks are).
    /// Findings this host shows to be unsound may be dropped here.
    fn annotate(&self, _group: &RankGroup, _rank: u32, _findings: &mut Vec<Finding>) {}
    /// The finding when no rank recorded anything at all, if that proves nothing.
    fn nothing_recorded(&self) -> Option<String> {
        None
    }
}

/// Run `observer` over every rank's recordings: its failures, and what suppressions dropped
/// (by suppression, counted).
pub fn audit(
    observer: &dyn Observer,
    group: &RankGroup,
    ranks: u32,
    suppressions: &[Suppression],
    suppressed: &mut BTreeMap<String, u32>,
) -> Vec<Failure> {
    let mut found = vec![];
    let mut recordings: Vec<(u32, Recording)> = vec![];
    for rank in 0..ranks {
        match observer.collect(group, rank) {
            Ok(recs) => {
                for rec in recs {
                    for problem in observer.problems(rank, &rec) {
                        found.push(violation(rank, problem));
                    }
                    recordings.push((rank, rec));
                }
            }
            Err(e) => found.push(violation(rank, e)),
        }
    }
    if recordings.is_empty() && found.is_empty() {
        if let Some(nothing) = observer.nothing_recorded() {
            found.push(Failure::AuditViolation {
                rank: None,
                detail: nothing,
            });
        }
    }
    // Each recording is checked on a thread of its own: the checkers are pure, and a run's end
    // waits for the slowest recording, not their sum.
    let analysed: Vec<Option<Vec<Finding>>> = std::thread::scope(|s| {
        let handles: Vec<_> = recordings
            .iter()
            .map(|(_, rec)| s.spawn(move || observer.analyse(rec)))
            .collect();
        handles.into_iter().map(|h| h.join().ok()).collect()
    });
    for ((rank, rec), findings) in recordings.iter().zip(analysed) {
        let Some(mut findings) = findings else {
            found.push(violation(
                *rank,
                format!(
                    "{}: {} could not be checked: the checker panicked",
                    observer.label(*rank, rec),
                    rec.path.display()
                ),
            ));
            continue;
        };
        observer.annotate(group, *rank, &mut findings);
        findings.retain(|v| {
            let by = suppressions
                .iter()
                .find(|s| s.matches(v.check, v.program.as_deref(), &v.detail));
            if let Some(s) = by {
                *suppressed.entry(s.label()).or_default() += 1;
            }
            by.is_none()
        });
        let label = observer.label(*rank, rec);
        let shown = findings.len().min(MAX_SHOWN);
        for v in &findings[..shown] {
            found.push(violation(
                *rank,
                format!("{label}: {v}\n    (trace: {})", rec.path.display()),
            ));
        }
        if findings.len() > shown {
            found.push(violation(
                *rank,
                format!(
                    "{label}: {} more violations in {}",
                    findings.len() - shown,
                    rec.path.display()
                ),
            ));
        }
    }
    found
}

fn violation(rank: u32, detail: String) -> Failure {
    Failure::AuditViolation {
        rank: Some(rank),
        detail,
    }
}

/// The syscall recorder's observer, with the sync observer's events inside its trace.
pub struct Syscalls {
    pub checks: Vec<AuditCheck>,
    /// Whether the run hung (waits still in progress then count).
    pub hung: bool,
}

impl Observer for Syscalls {
    fn label(&self, rank: u32, _: &Recording) -> String {
        format!("rank {rank}")
    }

    fn collect(&self, group: &RankGroup, rank: u32) -> Result<Vec<Recording>, String> {
        let path = group.trace_path(rank);
        let text = group
            .fetch_trace(rank)
            .map_err(|e| format!("rank {rank}'s trace could not be read: {e:#}"))?;
        let calls = group.fetch_calls(rank);
        Ok(vec![Recording { path, text, calls }])
    }

    fn problems(&self, rank: u32, rec: &Recording) -> Vec<String> {
        if rec.text.trim().is_empty() {
            // An audit that saw nothing proves nothing.
            return vec![format!(
                "rank {rank}'s trace {} is empty",
                rec.path.display()
            )];
        }
        let lost = crate::hosts::syscall_trace::lost_events(&rec.text);
        if lost > 0 {
            // A trace with holes could hide the very close it should show: never clean.
            return vec![format!(
                "rank {rank}'s trace {} is incomplete: the eBPF ring buffer dropped {lost} events",
                rec.path.display()
            )];
        }
        vec![]
    }

    fn analyse(&self, rec: &Recording) -> Vec<Finding> {
        if rec.text.trim().is_empty() {
            return vec![];
        }
        // The eBPF recorder's typed events where they are whole; else the text, read as
        // strace's (strace's own trace, or a recorder killed mid-write).
        let typed = rec
            .calls
            .as_deref()
            .and_then(|c| crate::hosts::syscall_trace::typed_events(&rec.text, c));
        audit::analyse_after(&rec.text, typed, &self.checks, self.hung)
            .into_iter()
            .map(|v| Finding {
                check: v.check,
                pid: Some(v.pid),
                program: v.program,
                detail: format!("{} in pid {}: {}", v.check, v.pid, v.detail),
                context: v.context,
                by_order: v.by_order,
            })
            .collect()
    }

    fn annotate(&self, group: &RankGroup, rank: u32, findings: &mut Vec<Finding>) {
        if group.runs_here(rank) {
            // Call sites by name, from the module maps the sync observer left.
            let modules = call_sites::load(&group.sync_maps_prefix(rank));
            // Rust's std hands things over through futexes of its own and lock-free queues
            // (a channel, a parked thread), which no trace shows even when the observer does
            // not hear of a futex: there order alone proves nothing.
            findings.retain(|v| {
                !(v.by_order
                    && v.pid
                        .and_then(|p| modules.get(&p))
                        .is_some_and(call_sites::links_rust_std))
            });
            // One addr2line per module of each process, for all of its findings together.
            let pids: BTreeSet<u32> = findings.iter().filter_map(|v| v.pid).collect();
            for pid in pids {
                let Some(m) = modules.get(&pid) else {
                    continue;
                };
                let theirs: Vec<usize> = (0..findings.len())
                    .filter(|k| findings[*k].pid == Some(pid))
                    .collect();
                let texts: Vec<&str> = theirs
                    .iter()
                    .map(|k| findings[*k].detail.as_str())
                    .collect();
                let named = call_sites::annotate_all(&texts, m);
                for (k, detail) in theirs.into_iter().zip(named) {
                    let v = &mut findings[k];
                    v.detail = detail;
                    if v.program.is_none() {
                        v.program = m.program.clone();
                    }
                }
            }
        }
        // A hang's cycle comes from the observer's state; the threads' stacks, taken before
        // the harness ended them, are the evidence beside it.
        let log = group.log_path(rank);
        for v in findings.iter_mut().filter(|v| v.check == "deadlock") {
            v.detail
                .push_str(&format!("; the threads' stacks: {}", log.display()));
        }
    }
}

/// The verbs observer: one trace per process of a rank that touched verbs.
pub struct Verbs;

impl Observer for Verbs {
    fn label(&self, rank: u32, rec: &Recording) -> String {
        let exe = rec
            .text
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("exe=")))
            .unwrap_or("?");
        format!("rank {rank} ({exe}) verbs")
    }

    fn collect(&self, group: &RankGroup, rank: u32) -> Result<Vec<Recording>, String> {
        let files = group
            .fetch_verbs_traces(rank)
            .map_err(|e| format!("rank {rank}'s verbs traces could not be read: {e:#}"))?;
        Ok(files
            .into_iter()
            .map(|(path, text)| Recording {
                path,
                text,
                calls: None,
            })
            .collect())
    }

    fn problems(&self, _: u32, _: &Recording) -> Vec<String> {
        vec![]
    }

    fn analyse(&self, rec: &Recording) -> Vec<Finding> {
        verbs_audit::analyse(&rec.text)
            .into_iter()
            .map(|v| Finding {
                check: v.check,
                pid: None,
                program: None,
                // Its evidence lines as the verbs checker numbers them (`line N:`).
                detail: v.to_string(),
                context: vec![],
                by_order: false,
            })
            .collect()
    }

    fn nothing_recorded(&self) -> Option<String> {
        Some("the verbs audit saw no verbs call in any rank or program they started: an audit that saw nothing proves nothing".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finding_shows_its_sentence_then_its_lines() {
        let f = Finding {
            check: "double close",
            pid: Some(3),
            program: None,
            detail: "double close in pid 3: fd 5".into(),
            context: vec![(12, "3 close(5) = -1 EBADF".into())],
            by_order: false,
        };
        assert_eq!(
            f.to_string(),
            "double close in pid 3: fd 5\n        12: 3 close(5) = -1 EBADF"
        );
    }
}
