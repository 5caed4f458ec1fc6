//! The runner's event stream. Every output (progress, results.jsonl, results.json, JUnit,
//! summary.md, and through results.json the page) is a [`Reporter`] fed these events, as
//! nextest's runner feeds its reporters.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use crate::hosts::probe::HostFacts;
use crate::model::result::{ScenarioResult, Verdict, SCHEMA};

/// What identifies a run in every report.
#[derive(Debug, Serialize)]
pub struct RunMeta {
    /// The results.json schema this run writes.
    pub schema: u32,
    pub run_id: String,
    pub wringer_version: &'static str,
    pub host_profile: String,
    pub seed: u64,
    pub hosts: Vec<HostFacts>,
    pub started_unix: u64,
}

impl RunMeta {
    pub fn new(
        run_id: String,
        host_profile: String,
        seed: u64,
        hosts: Vec<HostFacts>,
        started_unix: u64,
    ) -> RunMeta {
        RunMeta {
            schema: SCHEMA,
            run_id,
            wringer_version: env!("CARGO_PKG_VERSION"),
            host_profile,
            seed,
            hosts,
            started_unix,
        }
    }
}

/// Verdict counts so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub pass: usize,
    pub fail: usize,
    pub skip: usize,
    pub xfail: usize,
    pub xpass: usize,
}

impl Counts {
    pub fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Pass => self.pass += 1,
            Verdict::Fail => self.fail += 1,
            Verdict::Skip => self.skip += 1,
            Verdict::Xfail => self.xfail += 1,
            Verdict::Xpass => self.xpass += 1,
        }
    }
}

pub enum RunEvent<'a> {
    Started {
        meta: &'a RunMeta,
        dir: &'a Path,
        scenarios: usize,
    },
    ScenarioStarted {
        index: usize,
        name: &'a str,
    },
    ScenarioFinished {
        index: usize,
        result: &'a ScenarioResult,
        elapsed: Duration,
    },
    Finished {
        counts: Counts,
        interrupted: bool,
        elapsed: Duration,
    },
}

/// One consumer of the event stream. An error stops the run: a report that cannot be written
/// must not be lost silently.
pub trait Reporter {
    fn on_event(&mut self, event: &RunEvent) -> Result<()>;
}
