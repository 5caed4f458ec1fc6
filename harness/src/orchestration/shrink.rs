//! Shrinking a failed attempt: delta debugging over its perturbations and faults, then smaller
//! delays, fewer delayed calls and fewer cycles, keeping only what still fails on every one
//! of K replays. The search (`ddmin`, `Candidate::smaller`) is pure; `shrink` runs each
//! candidate through the runner, within a time budget.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::events::{Reporter, RunEvent};
use super::runner::{self, RunOptions};
use crate::hosts::profile::HostProfile;
use crate::model::duration::HumanDuration;
use crate::model::scenario::{parse_when, Fault, Perturb};
use crate::rank::steps::Loaded;

/// What a shrink varies: the perturbations (each call chosen by count), the scenario-level
/// faults, and the `cycles` of each step that has them (step index, cycles).
#[derive(Clone, Debug)]
pub struct Candidate {
    pub perturb: Vec<Perturb>,
    pub faults: Vec<Fault>,
    pub cycles: Vec<(usize, u64)>,
}

/// The smallest sublist of `items` that still fails (Zeller's ddmin), given that all of
/// `items` fails. `fails` answers None once the budget is spent; the list so far is kept.
pub fn ddmin<T: Clone>(items: Vec<T>, fails: &mut dyn FnMut(&[T]) -> Option<bool>) -> Vec<T> {
    let mut items = items;
    if items.is_empty() {
        return items;
    }
    // Nothing at all may already fail.
    match fails(&[]) {
        Some(true) => return vec![],
        None => return items,
        Some(false) => {}
    }
    let mut n = 2usize;
    while items.len() >= 2 {
        let chunk = items.len().div_ceil(n);
        let parts: Vec<Vec<T>> = items.chunks(chunk).map(|c| c.to_vec()).collect();
        let mut reduced = false;
        for (i, part) in parts.iter().enumerate() {
            match fails(part) {
                None => return items,
                Some(true) => {
                    items = part.clone();
                    n = 2;
                    reduced = true;
                    break;
                }
                Some(false) => {}
            }
            if parts.len() > 2 {
                let rest: Vec<T> = parts
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .flat_map(|(_, p)| p.iter().cloned())
                    .collect();
                match fails(&rest) {
                    None => return items,
                    Some(true) => {
                        items = rest;
                        n = (n - 1).max(2);
                        reduced = true;
                        break;
                    }
                    Some(false) => {}
                }
            }
        }
        if !reduced {
            if n >= items.len() {
                break;
            }
            n = (2 * n).min(items.len());
        }
    }
    items
}

impl Candidate {
    /// Smaller versions of the perturbation `i`: its delays halved, and only the first of the
    /// calls it delays. Each is one step; the caller keeps those that still fail.
    pub fn smaller_perturbation(p: &Perturb) -> Vec<Perturb> {
        let mut out = vec![];
        // strace delays in whole microseconds: a delay halves while it stays one.
        let halvable =
            |d: Option<HumanDuration>| d.is_none_or(|d| d.0 / 2 >= Duration::from_micros(1));
        let half = |d: Option<HumanDuration>| d.map(|d| HumanDuration(d.0 / 2));
        if halvable(p.delay_enter) && halvable(p.delay_exit) {
            let mut q = p.clone();
            q.delay_enter = half(p.delay_enter);
            q.delay_exit = half(p.delay_exit);
            out.push(q);
        }
        // Every call, or first+step: try the first one alone.
        let first_only = match p.when.as_deref().map(parse_when) {
            Some(Ok((first, last, step))) if step.is_some() || last.is_some_and(|l| l > first) => {
                Some(first.to_string())
            }
            None => Some("1".to_string()),
            _ => None,
        };
        if let Some(w) = first_only {
            let mut q = p.clone();
            q.when = Some(w);
            q.probability = None;
            out.push(q);
        }
        out
    }
}

/// The outcome of a shrink.
pub struct Shrunk {
    pub start: Candidate,
    pub end: Candidate,
    pub runs: u32,
    pub elapsed: Duration,
    /// The budget ran out before the search ended.
    pub stopped_early: bool,
    /// The starting attempt failed on this many of K replays (all, or the shrink did not start).
    pub start_failed: (u32, u32),
}

/// Shrink attempt `opts.attempt` of seed `opts.seed` of the one scenario in `loaded`.
pub fn shrink(
    loaded: &Loaded,
    profile: &HostProfile,
    opts: &RunOptions,
    replays: u32,
    budget: Duration,
    dir: &Path,
) -> Result<Shrunk> {
    let attempt = opts
        .attempt
        .context("a shrink needs --seed and --attempt")?;
    let seed = opts.seed.context("a shrink needs --seed and --attempt")?;
    let s = &loaded.scenario;
    let own: Vec<Perturb> = s.perturb.iter().map(|p| p.value.clone()).collect();
    let perturb = opts.perturb.clone().unwrap_or_else(|| {
        super::audit::exact_perturbations(&own, seed.wrapping_add(attempt as u64))
    });
    let faults = opts
        .faults
        .clone()
        .unwrap_or_else(|| s.faults.iter().map(|f| f.value.clone()).collect());
    let bytes =
        crate::model::input::read_bytes(&loaded.path, crate::model::input::FileKind::Scenario)?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    // JSON's values hold any YAML scenario, and JSON is YAML: the variants load as files do.
    let yaml: serde_json::Value = serde_saphyr::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", loaded.path.display()))?;
    let start = Candidate {
        perturb,
        faults,
        cycles: cycles_of(&yaml),
    };
    let started = Instant::now();
    let mut runs = 0u32;
    let mut tries = 0u32;
    let mut out_of_time = false;
    let mut test = |c: &Candidate| -> Result<Option<(u32, u32)>> {
        if started.elapsed() >= budget {
            out_of_time = true;
            return Ok(None);
        }
        tries += 1;
        let variant = with_cycles(&yaml, &c.cycles, &loaded.path)?;
        let o = RunOptions {
            report_dir: Some(dir.join(format!("try-{tries}"))),
            filter: None,
            repeat: Some(replays),
            seed: Some(seed),
            strict: opts.strict,
            no_audit: opts.no_audit,
            attempt: Some(attempt),
            perturb: Some(c.perturb.clone()),
            faults: Some(c.faults.clone()),
            until_fail: None,
            replays: 0,
            rerun: opts.rerun.clone(),
            audit_backend: opts.audit_backend,
            suppressions: opts.suppressions.clone(),
        };
        let mut seen = Tally::default();
        runner::run(vec![variant], profile, &o, &mut [&mut seen])?;
        runs += seen.repeats;
        Ok(Some((seen.failed, seen.repeats)))
    };
    let first = test(&start)?.unwrap_or((0, 0));
    if first.0 < replays || first.1 < replays {
        return Ok(Shrunk {
            end: start.clone(),
            start,
            runs,
            elapsed: started.elapsed(),
            stopped_early: false,
            start_failed: first,
        });
    }
    let mut err = None;
    let mut fails = |c: &Candidate| -> Option<bool> {
        match test(c) {
            Ok(r) => r.map(|(f, n)| n > 0 && f == n),
            Err(e) => {
                err.get_or_insert(e);
                None
            }
        }
    };
    let mut best = start.clone();
    best.perturb = ddmin(best.perturb.clone(), &mut |p: &[Perturb]| {
        fails(&Candidate {
            perturb: p.to_vec(),
            ..best.clone()
        })
    });
    best.faults = ddmin(best.faults.clone(), &mut |f: &[Fault]| {
        fails(&Candidate {
            faults: f.to_vec(),
            ..best.clone()
        })
    });
    // Then each survivor made smaller, as long as it still fails.
    for i in 0..best.perturb.len() {
        'smaller: loop {
            for q in Candidate::smaller_perturbation(&best.perturb[i]) {
                let mut c = best.clone();
                c.perturb[i] = q;
                match fails(&c) {
                    Some(true) => {
                        best = c;
                        continue 'smaller;
                    }
                    Some(false) => {}
                    None => break 'smaller,
                }
            }
            break;
        }
    }
    for i in 0..best.cycles.len() {
        while best.cycles[i].1 > 1 {
            let mut c = best.clone();
            c.cycles[i].1 = (c.cycles[i].1 / 2).max(1);
            if fails(&c) != Some(true) {
                break;
            }
            best = c;
        }
    }
    if let Some(e) = err {
        return Err(e);
    }
    Ok(Shrunk {
        start,
        end: best,
        runs,
        elapsed: started.elapsed(),
        stopped_early: out_of_time,
        start_failed: first,
    })
}

/// Counts the repeats of the one scenario a shrink's candidate runs.
#[derive(Default)]
struct Tally {
    repeats: u32,
    failed: u32,
}

impl Reporter for Tally {
    fn on_event(&mut self, e: &RunEvent) -> Result<()> {
        if let RunEvent::ScenarioFinished { result, .. } = e {
            self.repeats += result.repeats;
            self.failed += result.repeats_failed;
        }
        Ok(())
    }
}

/// Each step's `cycles`, where it has one: `steps: [ { teardown-cycles: { cycles: 2500 } } ]`.
fn cycles_of(yaml: &serde_json::Value) -> Vec<(usize, u64)> {
    let Some(steps) = yaml.get("steps").and_then(|s| s.as_array()) else {
        return vec![];
    };
    steps
        .iter()
        .enumerate()
        .filter_map(|(i, st)| {
            let (_, body) = st.as_object()?.iter().next()?;
            Some((i, body.get("cycles")?.as_u64()?))
        })
        .collect()
}

/// The scenario with those cycles, loaded as the runner loads a file.
fn with_cycles(yaml: &serde_json::Value, cycles: &[(usize, u64)], path: &Path) -> Result<Loaded> {
    let mut y = yaml.clone();
    for (i, n) in cycles {
        let body = y
            .get_mut("steps")
            .and_then(|s| s.get_mut(*i))
            .and_then(|st| st.as_object_mut()?.iter_mut().next().map(|(_, b)| b));
        if let Some(serde_json::Value::Object(m)) = body {
            m.insert("cycles".into(), (*n).into());
        }
        // A bound on the cycles themselves follows them.
        if let Some(serde_json::Value::Object(e)) =
            y.get_mut("expect").and_then(|e| e.get_mut("cycles"))
        {
            if e.contains_key("equals") {
                e.insert("equals".into(), (*n).into());
            }
        }
    }
    let text = serde_json::to_string_pretty(&y)?;
    match crate::rank::steps::parse(path, &text) {
        Ok(l) => Ok(l),
        Err(e) => bail!("the shrunk scenario does not load: {e}"),
    }
}

impl Shrunk {
    /// The shrunk attempt as a scenario snippet, what was removed, and the cost.
    pub fn describe(&self, rerun: &str) -> String {
        let mut s = String::new();
        let (f, k) = self.start_failed;
        if f < k || k == 0 {
            s.push_str(&format!(
                "the attempt failed on {f} of {k} replays: it does not fail every time, so there is nothing to shrink it to (run it with --repeat to see how flaky it is)\n"
            ));
            return s;
        }
        s.push_str(
            "# the smallest attempt that still fails on every replay; paste into the scenario:\n",
        );
        if self.end.perturb.is_empty() {
            s.push_str("perturb: []\n");
        } else {
            s.push_str("perturb:\n");
            for p in &self.end.perturb {
                s.push_str(&format!("  - {}\n", flow(p)));
            }
        }
        if !self.start.faults.is_empty() {
            if self.end.faults.is_empty() {
                s.push_str("faults: []\n");
            } else {
                s.push_str("faults:\n");
                for x in &self.end.faults {
                    s.push_str(&format!("  - {}\n", flow(x)));
                }
            }
        }
        for (i, n) in &self.end.cycles {
            s.push_str(&format!("# step {}: cycles: {n}\n", i + 1));
        }
        let removed_p: Vec<String> = self
            .start
            .perturb
            .iter()
            .filter(|p| !self.end.perturb.iter().any(|q| q.syscall == p.syscall))
            .map(|p| p.syscall.clone())
            .collect();
        s.push_str(&format!(
            "removed: {} of {} perturbations ({}), {} of {} faults",
            removed_p.len(),
            self.start.perturb.len(),
            if removed_p.is_empty() {
                "none".into()
            } else {
                removed_p.join(", ")
            },
            self.start.faults.len() - self.end.faults.len(),
            self.start.faults.len()
        ));
        for ((i, a), (_, b)) in self.start.cycles.iter().zip(&self.end.cycles) {
            if a != b {
                s.push_str(&format!("; step {} cycles {a} -> {b}", i + 1));
            }
        }
        s.push_str(&format!(
            "\n{} runs in {:.1} s{}\nreplay: {rerun}\n",
            self.runs,
            self.elapsed.as_secs_f64(),
            if self.stopped_early {
                " (stopped early: the time budget ran out; the result is smaller than where it started, not the smallest)"
            } else {
                ""
            }
        ));
        s
    }
}

fn flow<T: serde::Serialize>(x: &T) -> String {
    runner::flow_yaml(x)
}

/// The folder a shrink writes its tries into.
pub fn folder(report_dir: Option<&Path>) -> PathBuf {
    report_dir.map(Path::to_path_buf).unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Path::new("reports").join(format!("shrink-{}", now.as_secs()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ddmin_finds_the_one_item_that_matters_among_eight() {
        let items: Vec<u32> = (0..8).collect();
        let mut calls = 0;
        let out = ddmin(items, &mut |s: &[u32]| {
            calls += 1;
            Some(s.contains(&5))
        });
        assert_eq!(out, vec![5]);
        assert!(calls <= 12, "{calls} tests");
    }

    #[test]
    fn ddmin_keeps_a_pair_that_fails_only_together() {
        let out = ddmin((0..8).collect(), &mut |s: &[u32]| {
            Some(s.contains(&1) && s.contains(&6))
        });
        assert_eq!(out, vec![1, 6]);
    }

    #[test]
    fn ddmin_empties_a_list_that_fails_without_any_of_it() {
        assert!(ddmin(vec![1, 2, 3], &mut |_: &[u32]| Some(true)).is_empty());
    }

    #[test]
    fn ddmin_stops_with_what_it_has_when_the_budget_runs_out() {
        let mut left = 3;
        let out = ddmin((0..8).collect::<Vec<u32>>(), &mut |s: &[u32]| {
            if left == 0 {
                return None;
            }
            left -= 1;
            Some(s.contains(&5))
        });
        assert!(out.contains(&5) && out.len() < 8, "{out:?}");
    }

    #[test]
    fn a_perturbation_gets_smaller_by_delay_and_by_calls() {
        let p = Perturb {
            syscall: "poll".into(),
            delay_enter: None,
            delay_exit: Some(HumanDuration(Duration::from_micros(100))),
            probability: None,
            when: Some("3+2".into()),
        };
        let smaller = Candidate::smaller_perturbation(&p);
        assert_eq!(smaller[0].delay_exit.unwrap().0, Duration::from_micros(50));
        assert_eq!(smaller[1].when.as_deref(), Some("3"));
        let single = Perturb {
            when: Some("3".into()),
            delay_exit: Some(HumanDuration(Duration::from_micros(1))),
            ..p
        };
        assert!(Candidate::smaller_perturbation(&single).is_empty());
        let every_call = Perturb {
            when: None,
            ..single.clone()
        };
        assert_eq!(
            Candidate::smaller_perturbation(&every_call)[0]
                .when
                .as_deref(),
            Some("1")
        );
    }
}
