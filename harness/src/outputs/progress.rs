//! Progress on the terminal: a bar on a TTY, plain lines when not a TTY or when CI is set.
//! Names and reasons come from files and peers, so control characters are escaped before
//! they reach the terminal.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Result;

use crate::orchestration::events::{Reporter, RunEvent};

#[derive(Default)]
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: usize,
    dir: String,
}

impl Reporter for Progress {
    fn on_event(&mut self, event: &RunEvent) -> Result<()> {
        match event {
            RunEvent::Started {
                meta,
                dir,
                scenarios,
            } => {
                self.total = *scenarios;
                self.dir = dir.display().to_string();
                crate::say!(
                    "wringer run {}: {scenarios} scenarios on `{}`, report in {}",
                    meta.run_id,
                    printable(&meta.host_profile),
                    printable(&self.dir)
                );
                let tty = std::io::stdout().is_terminal() && std::env::var_os("CI").is_none();
                self.bar = tty.then(|| {
                    let b = indicatif::ProgressBar::new(*scenarios as u64);
                    b.set_style(
                        indicatif::ProgressStyle::with_template(
                            "{bar:30} {pos}/{len} {elapsed} {msg}",
                        )
                        .expect("static template"),
                    );
                    b.enable_steady_tick(Duration::from_millis(200));
                    b
                });
            }
            RunEvent::ScenarioStarted { index, name } => match &self.bar {
                Some(b) => b.set_message(printable(name)),
                None => crate::say!("[{}/{}] {} ...", index + 1, self.total, printable(name)),
            },
            RunEvent::ScenarioFinished { index, result, .. } => {
                let verdict = result.verdict.as_str().to_uppercase();
                let line = format!(
                    "[{}/{}] {verdict} {} ({:.1} s){}",
                    index + 1,
                    self.total,
                    printable(&result.name),
                    result.duration_s,
                    result
                        .reason
                        .as_deref()
                        .map(|x| format!(": {}", printable(x)))
                        .unwrap_or_default()
                );
                let mut line = line;
                if result.verdict == crate::model::result::Verdict::Fail {
                    for r in result.replay_lines() {
                        line.push_str(&format!("\n    {}", printable(&r)));
                    }
                }
                match &self.bar {
                    Some(b) => {
                        b.println(line);
                        b.inc(1);
                    }
                    None => crate::say!("{line}"),
                }
            }
            RunEvent::Finished {
                counts,
                interrupted,
                elapsed,
            } => {
                if let Some(b) = self.bar.take() {
                    b.finish_and_clear();
                }
                let known = match (counts.xfail, counts.xpass) {
                    (0, 0) => String::new(),
                    (x, y) => {
                        format!(", {x} known failures (xfail), {y} unexpected passes (xpass)")
                    }
                };
                crate::say!(
                    "{} passed, {} failed, {} skipped{known} in {:.1} s{}; report: {}",
                    counts.pass,
                    counts.fail,
                    counts.skip,
                    elapsed.as_secs_f64(),
                    if *interrupted { " (interrupted)" } else { "" },
                    printable(&self.dir)
                );
            }
        }
        Ok(())
    }
}

pub use crate::model::name::printable;

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_cannot_reach_the_terminal() {
        let s = printable("a\x1b]0;title\x07\n[1/1] PASS forged");
        assert!(!s.chars().any(char::is_control), "{s}");
        assert!(s.contains("\\n[1/1]"), "{s}");
        assert_eq!(printable("plain µs"), "plain µs");
    }
}
