//! Reports, written as results arrive so a crash still leaves a readable partial report:
//! results.jsonl (streamed), results.json (canonical), junit.xml and summary.md.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
use serde::Serialize;

use crate::model::metric::{Metric, SampleKey, Series};
use crate::model::result::{ScenarioResult, Verdict};
use crate::orchestration::events::{Reporter, RunEvent};

#[derive(Serialize)]
struct Document<'a> {
    #[serde(flatten)]
    meta: &'a serde_json::Value,
    complete: bool,
    interrupted: bool,
    duration_s: f64,
    counts: BTreeMap<&'static str, usize>,
    scenarios: &'a [ScenarioResult],
}

/// The report folder's files, kept current as results arrive.
struct Open {
    dir: PathBuf,
    meta_json: serde_json::Value,
    run_id: String,
    host_profile: String,
    jsonl: File,
}

/// Writes `reports/<run-id>/`: results.jsonl (one line per scenario, appended as it ends),
/// results.json, junit.xml and summary.md (rewritten after each scenario).
#[derive(Default)]
pub struct ReportWriter {
    open: Option<Open>,
    results: Vec<ScenarioResult>,
}

impl Reporter for ReportWriter {
    fn on_event(&mut self, event: &RunEvent) -> Result<()> {
        match event {
            RunEvent::Started { meta, dir, .. } => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating the report folder {}", dir.display()))?;
                let jsonl = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join("results.jsonl"))?;
                self.open = Some(Open {
                    dir: dir.to_path_buf(),
                    meta_json: serde_json::to_value(meta)?,
                    run_id: meta.run_id.clone(),
                    host_profile: meta.host_profile.clone(),
                    jsonl,
                });
                self.write_all(false, false, Duration::ZERO)
            }
            RunEvent::ScenarioStarted { .. } => Ok(()),
            RunEvent::ScenarioFinished {
                result, elapsed, ..
            } => {
                let open = self
                    .open
                    .as_mut()
                    .context("a result before the run started")?;
                let mut line = serde_json::to_vec(result)?;
                line.push(b'\n');
                open.jsonl.write_all(&line)?;
                open.jsonl.flush()?;
                // The result is owned by the runner; keep our own copy for the whole files.
                self.results.push(serde_json::from_slice(&line)?);
                self.write_all(false, false, *elapsed)
            }
            RunEvent::Finished {
                interrupted,
                elapsed,
                ..
            } => self.write_all(!interrupted, *interrupted, *elapsed),
        }
    }
}

impl ReportWriter {
    fn write_all(&self, complete: bool, interrupted: bool, elapsed: Duration) -> Result<()> {
        let Some(open) = &self.open else {
            return Ok(());
        };
        let mut counts = BTreeMap::new();
        for v in Verdict::ALL {
            counts.insert(
                v.as_str(),
                self.results.iter().filter(|r| r.verdict == v).count(),
            );
        }
        let doc = Document {
            meta: &open.meta_json,
            complete,
            interrupted,
            duration_s: elapsed.as_secs_f64(),
            counts,
            scenarios: &self.results,
        };
        write_atomically(
            &open.dir.join("results.json"),
            &serde_json::to_vec_pretty(&doc)?,
        )?;
        write_atomically(
            &open.dir.join("junit.xml"),
            self.junit(&open.host_profile)?.as_bytes(),
        )?;
        write_atomically(
            &open.dir.join("summary.md"),
            self.summary(&open.run_id, &open.host_profile, complete, interrupted)
                .as_bytes(),
        )?;
        Ok(())
    }

    fn junit(&self, host_profile: &str) -> Result<String> {
        let mut suite = TestSuite::new(format!("wringer ({host_profile})"));
        for r in &self.results {
            let status = match r.verdict {
                Verdict::Pass => TestCaseStatus::success(),
                Verdict::Skip | Verdict::Xpass => {
                    let mut s = TestCaseStatus::skipped();
                    s.set_message(r.reason.clone().unwrap_or_default());
                    s
                }
                // JUnit has no expected failure: a skip that says so, with the evidence.
                Verdict::Xfail => {
                    let mut s = TestCaseStatus::skipped();
                    s.set_message(format!("xfail: {}", r.reason.clone().unwrap_or_default()));
                    s.set_description(evidence_summary(r));
                    s
                }
                Verdict::Fail => {
                    let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                    s.set_message(r.reason.clone().unwrap_or_default());
                    // The first failure's kind (`bound`, `watchdog`...), for CI's grouping.
                    if let Some(first) = r.evidence.failures.first() {
                        s.set_type(first.failure.kind().as_str());
                    }
                    s.set_description(evidence_summary(r));
                    s
                }
            };
            let mut case = TestCase::new(r.name.clone(), status);
            case.set_classname(r.file.display().to_string());
            case.set_time(Duration::from_secs_f64(r.duration_s));
            suite.add_test_case(case);
        }
        let mut report = Report::new("wringer");
        report.add_test_suite(suite);
        Ok(report.to_string()?)
    }

    fn summary(
        &self,
        run_id: &str,
        host_profile: &str,
        complete: bool,
        interrupted: bool,
    ) -> String {
        let mut s = format!("## wringer run `{run_id}` ({host_profile})\n\n");
        if interrupted {
            s.push_str("**Interrupted**: this report is partial.\n\n");
        } else if !complete {
            s.push_str("_In progress: this report is partial._\n\n");
        }
        s.push_str("| scenario | verdict | time | details |\n|---|---|---|---|\n");
        for r in &self.results {
            let verdict = match r.verdict {
                Verdict::Pass => "✅ pass",
                Verdict::Fail => "❌ fail",
                Verdict::Skip => "⏭️ skip",
                Verdict::Xfail => "⚠️ xfail",
                Verdict::Xpass => "❔ xpass",
            };
            let mut details = r.reason.clone().unwrap_or_default();
            if details.is_empty() {
                details = headline_metrics(r);
            }
            // Newlines end the row; every other control character (an ANSI escape in a
            // program's output, say) is written escaped, never raw.
            let details = super::progress::printable(&details.replace('\n', " "));
            s.push_str(&format!(
                "| {} | {verdict} | {:.1} s | {} |\n",
                super::progress::printable(&r.name),
                r.duration_s,
                md_cell(&details)
            ));
        }
        let failed: Vec<&ScenarioResult> = self
            .results
            .iter()
            .filter(|r| !r.evidence.replays.is_empty())
            .collect();
        if !failed.is_empty() {
            s.push_str("\n### Replay a failure\n\n");
            for r in failed {
                s.push_str(&format!(
                    "`{}`:\n\n```sh\n",
                    super::progress::printable(&r.name)
                ));
                for line in r.replay_lines() {
                    s.push_str(&format!("# {}\n", line.split(": ").next().unwrap_or("")));
                    s.push_str(&super::progress::printable(
                        line.split_once(": ").map(|x| x.1).unwrap_or(""),
                    ));
                    s.push('\n');
                }
                s.push_str("```\n\n");
            }
        }
        let matrix = super::matrix::markdown(&self.results);
        if !matrix.is_empty() {
            s.push_str("\n### Implementation × scenario class\n\n");
            s.push_str(&matrix);
        }
        let c = |v| self.results.iter().filter(|r| r.verdict == v).count();
        s.push_str(&format!(
            "\n{} passed, {} failed, {} skipped.\n",
            c(Verdict::Pass),
            c(Verdict::Fail),
            c(Verdict::Skip)
        ));
        let (xfail, xpass) = (c(Verdict::Xfail), c(Verdict::Xpass));
        if xfail + xpass > 0 {
            s.push_str(&format!(
                "{xfail} known failures (xfail), {xpass} unexpected passes (xpass).\n"
            ));
        }
        s
    }
}

/// A few numbers that say what a passing scenario measured.
fn headline_metrics(r: &ScenarioResult) -> String {
    let mut parts: Vec<String> = r
        .latency
        .iter()
        .filter(|(k, _)| {
            k.series == Series::Latency && matches!(k.size, 8 | 4096 | 1048576 | 4194304)
        })
        .map(|(k, l): (&SampleKey, _)| {
            format!("{} B p50/p99 {:.0}/{:.0} µs", k.size, l.p50_us, l.p99_us)
        })
        .collect();
    // The headline metrics, when a scenario has them.
    for name in [
        "cycles",
        "shutdown_p99_ms",
        "detect_ms",
        "frames_intact",
        "eof_cases",
        "gpu_bandwidth_gbps",
        "gpu_dmabuf",
    ] {
        let Some(key) = Metric::named(name) else {
            continue;
        };
        if let Some(m) = r.metrics.get(&key) {
            parts.push(format!(
                "{key} {}",
                if m.max >= 100.0 {
                    format!("{:.0}", m.max)
                } else {
                    format!("{:.2}", m.max)
                }
            ));
        }
    }
    if r.repeats > 1 {
        parts.push(format!("{} repeats", r.repeats));
    }
    // The points the scenario must reach: in how many repeats it did.
    for p in r.evidence.reach.iter().filter(|p| p.required) {
        parts.push(format!(
            "reached {} in {}/{}",
            p.point, p.repeats_reached, p.repeats
        ));
    }
    parts.join(", ")
}

fn evidence_summary(r: &ScenarioResult) -> String {
    let mut s = r
        .evidence
        .failures
        .iter()
        .map(|f| format!("[{}] {f}", f.failure.kind()))
        .collect::<Vec<_>>()
        .join("\n");
    for st in &r.evidence.stacks {
        s.push_str(&format!(
            "\n--- stacks of rank {} (pid {}), repeat {}\n{}",
            st.rank, st.pid, st.repeat, st.text
        ));
    }
    for log in &r.evidence.rank_logs {
        s.push_str(&format!("\nrank log: {}", log.display()));
    }
    for line in r.replay_lines() {
        s.push_str(&format!("\n{line}"));
    }
    s
}

/// Write `path` whole or not at all; a failure (a full disk, say) names the file and leaves no
/// temporary file behind.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

/// Text in a Markdown table cell: `|` would end the cell and `<...>` would render as markup.
fn md_cell(text: &str) -> String {
    text.replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_rows_carry_no_raw_control_characters() {
        let mut r = crate::model::result::ScenarioResult::not_run(
            "s",
            Path::new("s.yaml"),
            Verdict::Fail,
            "line one\n[1/1] PASS forged \u{1b}]0;title\u{7} | cell <img src=x onerror=alert(1)>"
                .into(),
        );
        r.duration_s = 1.0;
        let w = ReportWriter {
            results: vec![r],
            ..ReportWriter::default()
        };
        let md = w.summary("run", "local", true, false);
        let row = md.lines().find(|l| l.starts_with("| s |")).unwrap();
        assert!(!md.contains('\u{1b}') && !md.contains('\u{7}'), "{md:?}");
        assert!(
            row.contains("line one [1/1] PASS forged") && row.contains("\\|"),
            "{row}"
        );
        assert!(!md.lines().any(|l| l.starts_with("[1/1]")));
        // Markup from a program's output is text in the cell, not markup.
        assert!(
            !md.contains("<img") && row.contains("&lt;img src=x"),
            "{row}"
        );
    }

    #[test]
    fn a_failed_write_names_its_file_and_leaves_no_temporary_behind() {
        let dir = std::env::temp_dir().join(format!("wringer-atomic-{}", std::process::id()));
        // The target is a non-empty folder: the write of the temporary works, the rename fails.
        let target = dir.join("results.json");
        std::fs::create_dir_all(target.join("inside")).unwrap();
        let e = write_atomically(&target, b"{}").unwrap_err();
        assert!(format!("{e:#}").contains("results.json"), "{e:#}");
        assert!(!dir.join("results.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
