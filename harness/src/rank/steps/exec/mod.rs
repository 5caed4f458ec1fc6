//! exec: programs nobody here wrote, as ranks. Each role is a set of ranks running one
//! program (placeholders for rank, world size, hosts and ports, see `template`); `after:` orders
//! roles by readiness (a listening port read from /proc/net/tcp, or an output line). Faults
//! strike a role's program when it starts, when it is ready, or on a matching output line, after
//! an optional delay. Every line a program prints goes into the rank log with its time.
//!
//! Each rank reports one record of its program (times on the shared wall clock); the
//! coordinator judges them together: per survivor, `detect_ms` (fault to the first line matching
//! the role's `error`) and `exit_ms` (fault to exit), against each role's expectations. A
//! program that logs the error and never exits is killed at the deadline and judged for it.

use super::support::{DATA_MISMATCHES, DETECT_MS};
use crate::model::invalid::Invalid;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use nix::sys::signal::Signal;
use regex::Regex;
use serde::{Deserialize, Serialize};

use super::external::{self, wall_us, Exit, External, Line, Pipe, SpawnError};
use super::template::{self, Values};
use super::{Preflight, Reconciled, StepKind, StruckFault};
use crate::hosts::{procfs, programs};
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::name::printable;
use crate::model::scenario::{Fault, FaultAction, StepSpec};
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

mod reconcile;
mod run;
#[cfg(test)]
mod tests;
mod watch;

use self::{reconcile::*, run::*, watch::*};

crate::declare_metrics! {
    pub EXIT_MS = "exit_ms", Milliseconds, Lower;
    pub LATENCY_P50_US = "latency_p50_us", Microseconds, Lower;
    pub LATENCY_P99_US = "latency_p99_us", Microseconds, Lower;
    pub LATENCY_AVG_US = "latency_avg_us", Microseconds, Lower;
    pub BANDWIDTH_GBPS = "bandwidth_gbps", GbitPerSecond, Higher;
    pub ROUNDS = "rounds", Count, Neither;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Exec {
    pub roles: BTreeMap<String, Role>,
    #[serde(default)]
    pub faults: Vec<RoleFault>,
    /// A program that prints nothing for this long (while not frozen by a fault) is killed
    /// and judged for it, well before the deadline.
    #[serde(default)]
    pub no_output_timeout: Option<HumanDuration>,
    pub deadline: HumanDuration,
    /// How much of each program's output goes into its rank log (MiB, 1 to 1024; 16 when
    /// absent). Past it, lines are still read for errors, readiness and metrics, but not
    /// logged; the log and the result say how many were left out.
    #[serde(default)]
    pub log_limit_mib: Option<u32>,
}

const DEFAULT_LOG_LIMIT_MIB: u32 = 16;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Role {
    pub ranks: Vec<u32>,
    pub program: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The Debian package that has `program`, named in the skip when it is missing.
    #[serde(default)]
    pub package: Option<String>,
    /// A command that must exit 0 on the host first; otherwise the scenario is skipped.
    #[serde(default)]
    pub precheck: Option<Precheck>,
    /// Roles that must be ready before this one starts.
    #[serde(default)]
    pub after: Vec<String>,
    #[serde(default)]
    pub ready: Option<Ready>,
    /// An output line matching this regex is the program noticing a fault.
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub metrics: Vec<Extract>,
    #[serde(default)]
    pub expect: RoleExpect,
    /// The program leaves on purpose (it exits by itself, as a rank that quits before a
    /// subgroup's first collective does): the first output line matching this regex, printed
    /// just before it exits, is the fault its peers are timed from.
    #[serde(default)]
    pub departs: Option<String>,
    /// Run the program under `stdbuf -oL -eL` (when coreutils has it), so its lines arrive
    /// as it prints them: a pipe makes C stdio buffer whole blocks, which would hide output
    /// until exit and skew every timing taken from it.
    #[serde(default = "yes")]
    pub line_buffered: bool,
}

fn yes() -> bool {
    true
}

impl Role {
    /// `program` with `args` on `ranks`, everything else as a file that names only these
    /// would have it (`wringer audit` builds its role so).
    pub fn program(ranks: Vec<u32>, program: String, args: Vec<String>) -> Role {
        Role {
            ranks,
            program,
            args,
            env: BTreeMap::new(),
            package: None,
            precheck: None,
            after: vec![],
            ready: None,
            error: None,
            metrics: vec![],
            expect: RoleExpect::default(),
            departs: None,
            line_buffered: yes(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Precheck {
    pub command: Vec<String>,
    /// Why the scenario cannot run when the command fails ("no tcp provider", say).
    pub skip: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    /// Ready once something listens on this rank's `{port}` (read from /proc/net/tcp).
    #[serde(default)]
    pub listening: bool,
    /// Ready at the first output line matching this regex.
    #[serde(default)]
    pub line: Option<String>,
    /// Ready once this command (placeholders filled) exits 0, tried every 100 ms: for a
    /// listener /proc/net/tcp cannot show, such as an RDMA CM one (`rdma res show cm_id`).
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default = "ready_timeout")]
    pub timeout: HumanDuration,
}

impl Ready {
    /// What readiness waited for, as a reason says it.
    fn awaited(&self, port: u16) -> String {
        match (&self.line, self.listening, &self.command) {
            (Some(l), _, _) => format!("no output line matched `{l}`"),
            (None, true, _) => format!("nothing listened on its port {port}"),
            (None, false, Some(c)) => format!("`{}` never exited 0", c.join(" ")),
            (None, false, None) => "nothing it could wait for".into(),
        }
    }
}

/// How a role that never became ready is reported; its failures come first in the verdict.
const NEVER_READY: &str = "never became ready";

fn ready_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

/// A metric read from the program's output: the first capture group of `regex`, or the
/// number at `json` (a dotted key) in a JSON line, parsed leniently. The last match counts.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Extract {
    pub metric: Metric,
    #[serde(default)]
    pub regex: Option<String>,
    #[serde(default)]
    pub json: Option<String>,
}

/// What a role's program must do. With neither `exit` nor `signal` nor `exit_within`, it
/// must exit 0.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoleExpect {
    pub exit: Option<i32>,
    /// Killed by this signal (`SIGKILL`).
    pub signal: Option<String>,
    /// Exits, any way, within this long of the fault.
    pub exit_within: Option<HumanDuration>,
    /// Prints an `error` line within this long of the fault,
    pub detect_within: Option<HumanDuration>,
    /// and not before this long after it (a timeout that fires early is a bug too).
    pub detect_not_before: Option<HumanDuration>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoleFault {
    pub role: String,
    /// One rank of the role; all of them when absent.
    #[serde(default)]
    pub rank: Option<u32>,
    /// `sigkill` and `sigstop` strike the program; the host-level ones (`host-kill`,
    /// `host-freeze`, `link-cut`, `rate-limit`, container hosts only) its rank's host, and the
    /// wire ones (`roce-loss`, `roce-blackhole`, `link-down`, …, the soft-RoCE VM pair) its
    /// host's RoCE link.
    pub action: FaultAction,
    pub at: Trigger,
    #[serde(default)]
    pub delay: Option<HumanDuration>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    Started,
    Ready,
    /// The first output line matching this regex.
    Line(String),
}

/// Metrics an exec role may read from its program's output.
pub const EXTRACTABLE: &[Metric] = &[
    LATENCY_P50_US,
    LATENCY_P99_US,
    LATENCY_AVG_US,
    BANDWIDTH_GBPS,
    ROUNDS,
    DATA_MISMATCHES,
];

/// One rank's account of its program, on the wall clock (µs since the epoch).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Record {
    pub role: String,
    pub rank: u32,
    pub started_us: u64,
    pub ready_us: Option<u64>,
    /// The fault this rank struck its program with, and when.
    pub fault: Option<(FaultAction, u64)>,
    /// When the program of a `departs` role announced that it leaves: the fault for its peers.
    #[serde(default)]
    pub departed_us: Option<u64>,
    pub first_error_us: Option<u64>,
    pub first_error: Option<String>,
    /// How it ended by itself; `None` when it was still running (or frozen) at the end.
    pub exit: Option<String>,
    pub exit_us: Option<u64>,
    /// Why the harness ended it, when it did.
    pub ended_by_harness: Option<String>,
    /// Expectations this rank could judge alone, broken.
    pub violations: Vec<String>,
    /// The last lines it printed, for the verdict's evidence.
    pub tail: Vec<String>,
    /// Lines past the log limit, read but not logged.
    #[serde(default)]
    pub unlogged_lines: u64,
    /// The rank's peak resident memory (VmHWM) when the step ended, KiB.
    #[serde(default)]
    pub peak_rss_kib: Option<u64>,
}

const TAIL_LINES: usize = 12;
const POLL: Duration = Duration::from_millis(10);

impl super::Describe for Exec {
    const ABOUT: &'static str = "programs nobody here wrote as ranks (see below)";
}

impl StepSpec for Exec {
    fn metrics(&self) -> &'static [Metric] {
        &[
            DETECT_MS,
            EXIT_MS,
            LATENCY_P50_US,
            LATENCY_P99_US,
            LATENCY_AVG_US,
            BANDWIDTH_GBPS,
            ROUNDS,
            DATA_MISMATCHES,
        ]
    }

    fn min_ranks(&self) -> u32 {
        1
    }

    fn check(&self, ranks: u32) -> Result<(), Invalid> {
        check(self, ranks)
    }

    fn uses_release(&self) -> bool {
        self.roles.values().any(|r| {
            r.templates().any(|t| template::uses_release(t))
                || r.precheck_words().any(|w| w.contains("{release}"))
        })
    }

    /// Each role's ranks report starting it and its ready line.
    fn points(&self) -> Vec<String> {
        self.roles
            .keys()
            .flat_map(|role| [format!("{role}:started"), format!("{role}:ready")])
            .collect()
    }

    /// Role faults the coordinator strikes (host-level, wire, a QP forced to error) become
    /// scenario faults at the points the role's ranks report.
    fn faults(&self, step: usize) -> Vec<Fault> {
        let mut out = vec![];
        for (i, f) in self.faults.iter().enumerate() {
            if f.action.kind().signal().is_some() {
                continue;
            }
            let ranks = match (f.rank, self.roles.get(&f.role)) {
                (Some(r), _) => vec![r],
                (None, Some(role)) => role.ranks.clone(),
                (None, None) => vec![],
            };
            out.extend(ranks.into_iter().map(|rank| Fault {
                rank,
                at: fault_point(step, i),
                action: f.action,
            }));
        }
        out
    }
}

fn check(e: &Exec, ranks: u32) -> Result<(), Invalid> {
    if e.roles.is_empty() {
        return Err("an exec step needs at least one role".into());
    }
    if e.deadline.0 < Duration::from_secs(1) {
        return Err("the deadline must be at least 1s".into());
    }
    if e.log_limit_mib.is_some_and(|m| !(1..=1024).contains(&m)) {
        return Err("log_limit_mib must be 1..=1024".into());
    }
    if let Some(t) = e.no_output_timeout {
        if t.0 >= e.deadline.0 {
            return Err("no_output_timeout must be shorter than the deadline".into());
        }
    }
    let mut owner: BTreeMap<u32, &str> = BTreeMap::new();
    for (name, role) in &e.roles {
        // Role names reach the reports and the rank logs, as scenario names do.
        crate::model::name::check(name).map_err(|why| format!("role {why}"))?;
        let at = |why: Invalid| Invalid(format!("role `{name}`: {why}"));
        if role.ranks.is_empty() {
            return Err(at("needs at least one rank".into()));
        }
        for &r in &role.ranks {
            if r >= ranks {
                return Err(at(format!(
                    "rank {r} is not below the scenario's {ranks} ranks"
                )
                .into()));
            }
            if let Some(other) = owner.insert(r, name) {
                return Err(at(format!("rank {r} is already in role `{other}`").into()));
            }
        }
        let templates = std::iter::once(&role.program)
            .chain(&role.args)
            .chain(role.env.values());
        for t in templates {
            template::check(t, ranks).map_err(at)?;
        }
        if role.program.trim().is_empty() {
            return Err(at("program is empty".into()));
        }
        for dep in &role.after {
            let Some(d) = e.roles.get(dep) else {
                return Err(at(
                    format!("comes after `{dep}`, which is not a role").into()
                ));
            };
            if d.ready.is_none() {
                return Err(at(format!(
                    "comes after `{dep}`, which has no `ready:` (when would it be ready?)"
                )
                .into()));
            }
        }
        if let Some(r) = &role.ready {
            match (&r.line, r.listening, &r.command) {
                (Some(l), false, None) => {
                    compile(l).map_err(at)?;
                }
                (None, true, None) => {}
                (None, false, Some(c)) if !c.is_empty() => {
                    for t in c {
                        template::check(t, ranks).map_err(at)?;
                    }
                }
                _ => {
                    return Err(at(
                        "ready needs exactly one of `listening: true`, `line:` or `command:`"
                            .into(),
                    ))
                }
            };
        }
        if let Some(l) = &role.error {
            compile(l).map_err(at)?;
        }
        if let Some(l) = &role.departs {
            compile(l).map_err(at)?;
            if role.expect.signal.is_some() || role.expect.exit_within.is_some() {
                return Err(at("a role that departs exits by itself: expect `exit`, not `signal` or `exit_within`".into()));
            }
        }
        for x in &role.metrics {
            if !EXTRACTABLE.contains(&x.metric) {
                let names: Vec<String> = EXTRACTABLE.iter().map(|m| m.to_string()).collect();
                return Err(at(format!(
                    "`{}` cannot be read from output (these can: {})",
                    x.metric,
                    names.join(", ")
                )
                .into()));
            }
            match (&x.regex, &x.json) {
                (Some(r), None) => {
                    let re = compile(r).map_err(at)?;
                    if re.captures_len() < 2 {
                        return Err(at(
                            format!("metric regex `{r}` needs a capture group").into()
                        ));
                    }
                }
                (None, Some(_)) => {}
                _ => {
                    return Err(at(
                        "a metric needs exactly one of `regex:` or `json:`".into()
                    ))
                }
            }
        }
        let x = &role.expect;
        if let Some(s) = &x.signal {
            if s.parse::<Signal>().is_err() {
                return Err(at(format!(
                    "`{s}` is not a signal name (SIGKILL, SIGTERM, ...)"
                )
                .into()));
            }
            if x.exit.is_some() {
                return Err(at("expect either `exit` or `signal`, not both".into()));
            }
        }
        if (x.detect_within.is_some() || x.detect_not_before.is_some()) && role.error.is_none() {
            return Err(at(
                "detection is timed by the `error:` line; set `error:`".into()
            ));
        }
    }
    cycle_free(e)?;
    for f in &e.faults {
        let Some(role) = e.roles.get(&f.role) else {
            return Err(format!("a fault names role `{}`, which does not exist", f.role).into());
        };
        f.action.check()?;
        if let Some(r) = f.rank {
            if !role.ranks.contains(&r) {
                return Err(
                    format!("a fault names rank {r}, which is not in role `{}`", f.role).into(),
                );
            }
        }
        match &f.at {
            Trigger::Ready if role.ready.is_none() => {
                return Err(format!(
                    "a fault strikes `{}` when ready, but it has no `ready:`",
                    f.role
                )
                .into())
            }
            Trigger::Line(l) => {
                compile(l)?;
            }
            _ => {}
        }
        if f.delay.is_some_and(|d| d.0 >= e.deadline.0) {
            return Err("a fault's delay must be shorter than the deadline".into());
        }
    }
    Ok(())
}

fn compile(r: &str) -> Result<Regex, Invalid> {
    Regex::new(r).map_err(|e| Invalid(format!("bad regex `{r}`: {e}")))
}

fn cycle_free(e: &Exec) -> Result<(), Invalid> {
    fn visit<'a>(
        e: &'a Exec,
        name: &'a str,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Result<(), Invalid> {
        if path.contains(&name) {
            path.push(name);
            return Err(format!(
                "roles wait for each other in a circle: {}",
                path.join(" -> ")
            )
            .into());
        }
        if done.contains(name) {
            return Ok(());
        }
        path.push(name);
        for dep in &e.roles[name].after {
            visit(e, dep, path, done)?;
        }
        path.pop();
        done.insert(name);
        Ok(())
    }
    let mut done = BTreeSet::new();
    for name in e.roles.keys() {
        visit(e, name, &mut vec![], &mut done)?;
    }
    Ok(())
}

impl Role {
    /// Every string of the role that placeholders are filled in.
    fn templates(&self) -> impl Iterator<Item = &String> {
        let ready = self.ready.iter().flat_map(|r| r.command.iter().flatten());
        std::iter::once(&self.program)
            .chain(&self.args)
            .chain(self.env.values())
            .chain(ready)
    }

    /// The pre-check's words, which run as they are (no placeholders but `{release}`).
    fn precheck_words(&self) -> impl Iterator<Item = &String> {
        self.precheck.iter().flat_map(|p| &p.command)
    }
}

impl Exec {
    /// The step with `{release}` put in as `root` everywhere placeholders are filled.
    fn log_limit(&self) -> u64 {
        u64::from(self.log_limit_mib.unwrap_or(DEFAULT_LOG_LIMIT_MIB)) << 20
    }

    pub fn for_release(&self, root: &str) -> Result<Exec, Invalid> {
        let put = |t: &mut String| -> Result<(), Invalid> {
            *t = template::put_release(t, root)?;
            Ok(())
        };
        let mut e = self.clone();
        for role in e.roles.values_mut() {
            put(&mut role.program)?;
            role.args.iter_mut().try_for_each(put)?;
            role.env.values_mut().try_for_each(put)?;
            if let Some(p) = &mut role.precheck {
                for w in &mut p.command {
                    *w = w.replace("{release}", root);
                }
            }
            if let Some(c) = role.ready.as_mut().and_then(|r| r.command.as_mut()) {
                c.iter_mut().try_for_each(put)?;
            }
        }
        Ok(e)
    }

    fn role_of(&self, rank: u32) -> Option<(&String, &Role)> {
        self.roles.iter().find(|(_, r)| r.ranks.contains(&rank))
    }

    /// Ranks that meet at role `name`'s ready barrier: its own and those that come after it.
    fn ready_members(&self, name: &str) -> Vec<u32> {
        let mut m: Vec<u32> = self.roles[name].ranks.clone();
        for r in self
            .roles
            .values()
            .filter(|r| r.after.iter().any(|d| d == name))
        {
            m.extend(&r.ranks);
        }
        m
    }

    fn has_dependents(&self, name: &str) -> bool {
        self.roles
            .values()
            .any(|r| r.after.iter().any(|d| d == name))
    }

    fn all_ranks(&self) -> Vec<u32> {
        self.roles
            .values()
            .flat_map(|r| r.ranks.iter().copied())
            .collect()
    }

    fn timed(&self) -> bool {
        self.roles.values().any(|r| {
            let x = &r.expect;
            x.exit_within.is_some() || x.detect_within.is_some() || x.detect_not_before.is_some()
        })
    }
}
