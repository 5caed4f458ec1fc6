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
            if matches!(f.action, FaultAction::Sigkill | FaultAction::Sigstop) {
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

/// A role's fault that is still to strike.
struct Pending<'a> {
    /// Its place in the step's `faults`, which names its point.
    index: usize,
    fault: &'a RoleFault,
    line: Option<Regex>,
    due: Option<Instant>,
    struck: bool,
}

/// The point where the coordinator strikes a role's host-level fault.
fn fault_point(step: usize, index: usize) -> String {
    format!("exec-{step}-fault-{index}")
}

fn ready_barrier(step: usize, role: &str) -> String {
    format!("step-{step}-exec-ready-{role}")
}

impl StepKind for Exec {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        let Some((name, role)) = self.role_of(ctx.rank) else {
            return Ok(());
        };
        let started = Instant::now();
        // Leave the coordinator's watchdog time to hear from us after our own limit.
        let margin = (self.deadline.0 / 10).min(Duration::from_secs(5));
        let end = started + self.deadline.0 - margin;
        let left = || end.saturating_duration_since(Instant::now());
        let dir = ctx.run_dir()?.join(format!("step-{step}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // The step's programs start together: a rank that sat out the steps before would
        // otherwise start its program while its peers still run theirs, and a program that
        // waits for its group with a timeout (a torch or Gloo store) would give up on them.
        ctx.control
            .barrier_among(
                &format!("step-{step}-exec-start"),
                &self.all_ranks(),
                left(),
            )
            .context("waiting for the step's other ranks to start")?;
        let values = values(ctx, &dir);
        for dep in &role.after {
            ctx.control
                .barrier_among(&ready_barrier(step, dep), &self.ready_members(dep), left())
                .with_context(|| format!("role `{name}` waited for role `{dep}` to be ready"))?;
        }
        let fill = |t: &String| template::fill(t, &values).map_err(anyhow::Error::msg);
        let program = fill(&role.program)?;
        let args = role.args.iter().map(fill).collect::<Result<Vec<_>>>()?;
        let env = template::fill_map(&role.env, &values).map_err(anyhow::Error::msg)?;
        // Escaped: an argument holding a newline must not forge a line of the rank log.
        let shown: Vec<String> = args.iter().map(|a| printable(a)).collect();
        log(
            ctx,
            name,
            started,
            &format!("starting: {} {}", printable(&program), shown.join(" ")),
        );
        // Shipped programs (beside wringer) come first; a missing one stays a typed error.
        let path = programs::search_path();
        let resolved = programs::resolve(&program, &path)
            .map(|p| p.display().to_string())
            .ok_or_else(|| missing(&program, role))?;
        let stdbuf = programs::resolve("stdbuf", &path).filter(|_| role.line_buffered);
        let (program, args) = match stdbuf {
            Some(stdbuf) => {
                let mut words = vec!["-oL".to_string(), "-eL".to_string(), resolved];
                words.extend(args);
                (stdbuf.display().to_string(), words)
            }
            None => (resolved, args),
        };
        let mut proc = External::spawn(&program, &args, &env).map_err(|e| match e {
            SpawnError::Missing(p) => missing(&p, role),
            other => anyhow::anyhow!(other),
        })?;
        let mut watch = Watch::new(self, name, role, ctx.rank, values.ports[ctx.rank as usize])?;
        watch.record.started_us = wall_us(started);
        watch.trigger(&Trigger::Started, started);
        // Where a scenario's own faults (a host kill, a link cut) can strike this role.
        ctx.control.point(step, &format!("{name}:started"))?;
        let mut last_output = Instant::now();
        let mut next_port_check = Instant::now();
        // Whether the program has ended is asked between bursts of output, not once a line:
        // each ask is a wait4, and under a syscall recorder a chatty program would pay one
        // traced call per line.
        let mut next_exit_check = Instant::now();
        loop {
            let exited = if Instant::now() >= next_exit_check {
                next_exit_check = Instant::now() + POLL;
                proc.exited()
            } else {
                None
            };
            if let Some(exit) = exited {
                for l in proc.finish(Duration::from_millis(200)) {
                    watch.line(ctx, &l, started);
                }
                watch.record.exit = Some(exit.to_string());
                watch.record.exit_us = Some(wall_us(Instant::now()));
                watch.exit = Some(exit);
                break;
            }
            let now = Instant::now();
            if now >= end {
                match role
                    .ready
                    .as_ref()
                    .filter(|_| watch.record.ready_us.is_none())
                {
                    // Its readiness never came: that is the reason, and the roles after it
                    // are released rather than left to fail on the barrier.
                    Some(r) => {
                        watch.ended(&format!(
                            "not ready by the step's deadline: {}",
                            r.awaited(watch.port)
                        ));
                        if self.has_dependents(name) {
                            let _ = ctx.control.barrier_among(
                                &ready_barrier(step, name),
                                &self.ready_members(name),
                                margin / 4,
                            );
                        }
                    }
                    None => watch.ended("still running at the step's deadline"),
                }
                hang_evidence(ctx, name, &proc);
                break;
            }
            if watch.frozen() {
                // Frozen on purpose: it stays frozen until every rank is done.
                break;
            }
            if let Some(t) = self.no_output_timeout {
                if now.duration_since(last_output) > t.0 {
                    watch.ended(&format!("printed nothing for {:?}", t.0));
                    hang_evidence(ctx, name, &proc);
                    break;
                }
            }
            match proc.next_line(POLL) {
                Some(l) => {
                    last_output = l.at;
                    if watch.line(ctx, &l, started) {
                        watch.on_ready(ctx, step, l.at)?;
                    }
                }
                // Quiet: write what is logged, and the next turn asks whether it ended.
                None => {
                    watch.flush_log();
                    next_exit_check = Instant::now();
                }
            }
            if let Some(r) = role
                .ready
                .as_ref()
                .filter(|_| watch.record.ready_us.is_none())
            {
                if Instant::now() >= next_port_check {
                    let ready = if r.listening {
                        next_port_check = Instant::now() + Duration::from_millis(20);
                        external::listening_on(watch.port)
                    } else if let Some(c) = &r.command {
                        next_port_check = Instant::now() + Duration::from_millis(100);
                        ready_command(c, &values)?
                    } else {
                        false
                    };
                    if ready {
                        watch.on_ready(ctx, step, Instant::now())?;
                    }
                }
            }
            if let Some(r) = &role.ready {
                // Readiness is given up before the step's own end, whatever its timeout says,
                // so this role (not the roles waiting for it) says why the step failed.
                let limit = r
                    .timeout
                    .0
                    .min(self.deadline.0.saturating_sub(margin + margin / 2));
                if watch.record.ready_us.is_none() && started.elapsed() > limit {
                    watch.ended(&format!(
                        "not ready within {limit:?}: {}",
                        r.awaited(watch.port)
                    ));
                    // Release the roles that wait for this one: they would otherwise wait
                    // out the step, and the reason would be a barrier, not this.
                    if self.has_dependents(name) {
                        let _ = ctx.control.barrier_among(
                            &ready_barrier(step, name),
                            &self.ready_members(name),
                            left(),
                        );
                    }
                    break;
                }
            }
            watch.strike_due(ctx, step, &proc);
        }
        // Every rank of the step meets here before any program is ended, so a frozen peer
        // stays frozen (and a dead one dead) until every survivor has had its say.
        let done = ctx.control.barrier_among(
            &format!("step-{step}-exec-done"),
            &self.all_ranks(),
            left() + margin / 2,
        );
        for l in proc.finish(Duration::from_millis(200)) {
            watch.line(ctx, &l, started);
        }
        let stray = external::end_descendants();
        if stray > 0 {
            log(
                ctx,
                name,
                started,
                &format!("ended {stray} processes the program left behind"),
            );
        }
        for l in proc.close_pipes(Duration::from_secs(2)) {
            watch.line(ctx, &l, started);
        }
        watch.flush_log();
        let _ = std::fs::remove_dir_all(&dir);
        done.context("waiting for the other ranks' programs to end")?;
        if watch.record.exit.is_none() && watch.exit.is_none() {
            if let Some(e) = proc.exited() {
                log(ctx, name, started, &format!("ended by the harness: {e}"));
            }
        }
        if watch.record.unlogged_lines > 0 {
            log(
                ctx,
                name,
                started,
                &format!(
                    "the log was cut: {} lines past its limit not logged",
                    watch.record.unlogged_lines
                ),
            );
        }
        watch.record.peak_rss_kib = procfs::peak_rss_kib();
        watch.judge_alone();
        for (metric, value) in &watch.metrics {
            report.metrics.insert(*metric, *value);
        }
        report.outcome(&watch.record)?;
        Ok(())
    }

    fn reconcile(&self, reports: &[(u32, &StepReport)], faults: &[StruckFault]) -> Reconciled {
        reconcile(self, reports, faults)
    }

    fn preflight(&self) -> Vec<Preflight> {
        let mut needs = vec![];
        for role in self.roles.values() {
            if !role.program.contains('{') {
                needs.push(Preflight::Program {
                    name: role.program.clone(),
                    package: role.package.clone(),
                });
            }
            if let Some(p) = &role.precheck {
                needs.push(Preflight::Check {
                    command: p.command.clone(),
                    reason: p.skip.clone(),
                });
            }
        }
        needs
    }
}

/// Whether a readiness command exits 0 now (bounded: a check that hangs counts as not yet).
fn ready_command(words: &[String], values: &Values) -> Result<bool> {
    let filled = words
        .iter()
        .map(|w| template::fill(w, values))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let refs: Vec<&str> = filled.iter().map(String::as_str).collect();
    Ok(matches!(
        crate::hosts::child::run_bounded(&refs, Duration::from_secs(5)),
        Ok((Some(s), _)) if s.success()
    ))
}

fn missing(program: &str, role: &Role) -> anyhow::Error {
    anyhow::anyhow!(
        "missing-program: {}",
        programs::missing(program, role.package.as_deref())
    )
}

fn values(ctx: &RankContext, dir: &std::path::Path) -> Values {
    let host = ctx.peers[ctx.rank as usize].transport.ip();
    Values {
        rank: ctx.rank,
        ranks: ctx.ranks,
        iface: interface_of(host).unwrap_or_default(),
        dir: dir.display().to_string(),
        seed: ctx.seed,
        hosts: ctx
            .peers
            .iter()
            .map(|p| p.transport.ip().to_string())
            .collect(),
        ports: ctx.peers.iter().map(|p| p.exec_port).collect(),
        rdma: ctx
            .peers
            .iter()
            .map(|p| p.rdma.map(|a| a.to_string()))
            .collect(),
    }
}

/// The interface that holds `ip` on this host.
fn interface_of(ip: std::net::IpAddr) -> Option<String> {
    nix::ifaddrs::getifaddrs().ok()?.find_map(|a| {
        let addr = a.address?;
        let same = match ip {
            std::net::IpAddr::V4(v4) => addr.as_sockaddr_in().is_some_and(|s| s.ip() == v4),
            std::net::IpAddr::V6(v6) => addr.as_sockaddr_in6().is_some_and(|s| s.ip() == v6),
        };
        same.then(|| a.interface_name.clone())
    })
}

/// Stacks of the program and every process under it, into the rank log, before the harness
/// ends it: a hang is evidence like any other.
fn hang_evidence(ctx: &RankContext, role: &str, proc: &External) {
    for pid in procfs::process_tree(proc.pid()) {
        let stacks = procfs::capture_stacks(pid, Some(Duration::from_secs(10)));
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        eprintln!(
            "[exec {role} rank {}] stacks of pid {pid} ({}) before the harness ends it:\n{stacks}",
            ctx.rank,
            comm.trim()
        );
    }
}

fn log(ctx: &RankContext, role: &str, started: Instant, text: &str) {
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    eprintln!("[exec {role} rank {} +{ms:.3}ms] {text}", ctx.rank);
}

/// What one rank watches of its program while it runs.
struct Watch<'a> {
    role: &'a Role,
    name: &'a str,
    exec: &'a Exec,
    port: u16,
    error: Option<Regex>,
    ready_line: Option<Regex>,
    departs: Option<Regex>,
    extracts: Vec<(Metric, Option<Regex>, Option<String>)>,
    /// This rank's faults, each with when it becomes due (once triggered) and whether it struck.
    faults: Vec<Pending<'a>>,
    metrics: BTreeMap<Metric, f64>,
    record: Record,
    exit: Option<Exit>,
    /// Bytes of output logged so far, against the step's log limit.
    logged: u64,
    /// Log lines not yet written: written in blocks (when quiet, past 64 KiB, before any other
    /// log line), so a chatty program costs one write per block, not per line, and a syscall
    /// recorder does not trace the rank's own logging line by line.
    pending_log: Vec<u8>,
}

const LOG_BLOCK: usize = 64 << 10;

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.flush_log();
    }
}

impl<'a> Watch<'a> {
    fn new(
        exec: &'a Exec,
        name: &'a str,
        role: &'a Role,
        rank: u32,
        port: u16,
    ) -> Result<Watch<'a>> {
        let re = |r: &Option<String>| r.as_deref().map(Regex::new).transpose();
        let faults = exec
            .faults
            .iter()
            .enumerate()
            .filter(|(_, f)| f.role == name && f.rank.is_none_or(|r| r == rank))
            .map(|(index, fault)| {
                let line = match &fault.at {
                    Trigger::Line(l) => Some(Regex::new(l)?),
                    _ => None,
                };
                Ok(Pending {
                    index,
                    fault,
                    line,
                    due: None,
                    struck: false,
                })
            })
            .collect::<Result<Vec<_>, regex::Error>>()?;
        Ok(Watch {
            role,
            name,
            exec,
            port,
            error: re(&role.error)?,
            ready_line: re(&role.ready.as_ref().and_then(|r| r.line.clone()))?,
            departs: re(&role.departs)?,
            extracts: role
                .metrics
                .iter()
                .map(|x| Ok((x.metric, re(&x.regex)?, x.json.clone())))
                .collect::<Result<_, regex::Error>>()?,
            faults,
            metrics: BTreeMap::new(),
            record: Record {
                role: name.to_string(),
                rank,
                ..Record::default()
            },
            exit: None,
            logged: 0,
            pending_log: Vec::new(),
        })
    }

    /// Write the log lines held back, in one write.
    fn flush_log(&mut self) {
        use std::io::Write;
        if !self.pending_log.is_empty() {
            let _ = std::io::stderr().write_all(&self.pending_log);
            self.pending_log.clear();
        }
    }

    /// Log and read one output line; true when it makes the program ready.
    fn line(&mut self, ctx: &RankContext, l: &Line, started: Instant) -> bool {
        let pipe = match l.pipe {
            Pipe::Out => "out",
            Pipe::Err => "err",
        };
        let ms = l.at.saturating_duration_since(started).as_secs_f64() * 1000.0;
        let limit = self.exec.log_limit();
        if self.logged < limit {
            self.logged += l.text.len() as u64 + 1;
            use std::io::Write;
            let _ = writeln!(
                self.pending_log,
                "[exec {} rank {} +{ms:.3}ms {pipe}] {}",
                self.name,
                ctx.rank,
                printable(&l.text)
            );
            if self.pending_log.len() >= LOG_BLOCK {
                self.flush_log();
            }
            if self.logged >= limit {
                self.flush_log();
                eprintln!(
                    "[exec {} rank {}] output past the {} MiB log limit is not logged (still read for errors and metrics)",
                    self.name,
                    ctx.rank,
                    limit >> 20
                );
            }
        } else {
            self.record.unlogged_lines += 1;
        }
        self.record.tail.push(l.text.chars().take(300).collect());
        if self.record.tail.len() > TAIL_LINES {
            self.record.tail.remove(0);
        }
        if self.record.departed_us.is_none()
            && self.departs.as_ref().is_some_and(|r| r.is_match(&l.text))
        {
            self.record.departed_us = Some(wall_us(l.at));
        }
        if self.record.first_error_us.is_none()
            && self.error.as_ref().is_some_and(|r| r.is_match(&l.text))
        {
            self.record.first_error_us = Some(wall_us(l.at));
            self.record.first_error = Some(l.text.chars().take(300).collect());
        }
        for (metric, regex, json) in &self.extracts {
            let value = match (regex, json) {
                (Some(r), _) => r
                    .captures(&l.text)
                    .and_then(|c| c.get(1))
                    .and_then(|m| m.as_str().parse::<f64>().ok()),
                (None, Some(key)) => json_number(&l.text, key),
                _ => None,
            };
            if let Some(v) = value.filter(|v| v.is_finite()) {
                self.metrics.insert(*metric, v);
            }
        }
        for f in &mut self.faults {
            if f.due.is_none() && f.line.as_ref().is_some_and(|r| r.is_match(&l.text)) {
                f.due = Some(l.at + f.fault.delay.map(|d| d.0).unwrap_or_default());
            }
        }
        self.record.ready_us.is_none()
            && self
                .ready_line
                .as_ref()
                .is_some_and(|r| r.is_match(&l.text))
    }

    fn trigger(&mut self, t: &Trigger, at: Instant) {
        for f in &mut self.faults {
            if f.due.is_none() && f.fault.at == *t {
                f.due = Some(at + f.fault.delay.map(|d| d.0).unwrap_or_default());
            }
        }
    }

    fn on_ready(&mut self, ctx: &RankContext, step: usize, at: Instant) -> Result<()> {
        self.record.ready_us = Some(wall_us(at));
        self.flush_log();
        eprintln!("[exec {} rank {}] ready", self.name, ctx.rank);
        ctx.control.point(step, &format!("{}:ready", self.name))?;
        self.trigger(&Trigger::Ready, at);
        if self.exec.has_dependents(self.name) {
            let limit = self
                .role
                .ready
                .as_ref()
                .map(|r| r.timeout.0)
                .unwrap_or(Duration::from_secs(30));
            ctx.control
                .barrier_among(
                    &ready_barrier(step, self.name),
                    &self.exec.ready_members(self.name),
                    limit,
                )
                .context("waiting for the roles that come after this one to start")?;
        }
        Ok(())
    }

    /// Strike every fault whose time has come: a signal to the program, or, for a fault on its
    /// host, the point where the coordinator strikes it (see `faults`).
    fn strike_due(&mut self, ctx: &RankContext, step: usize, proc: &External) {
        let now = Instant::now();
        for f in &mut self.faults {
            if f.struck || f.due.is_none_or(|due| now < due) {
                continue;
            }
            f.struck = true;
            if !self.pending_log.is_empty() {
                use std::io::Write;
                let _ = std::io::stderr().write_all(&std::mem::take(&mut self.pending_log));
            }
            let action = f.fault.action;
            let outcome = match action {
                FaultAction::Sigkill => proc.signal(Signal::SIGKILL).map_err(|e| e.to_string()),
                FaultAction::Sigstop => proc.signal(Signal::SIGSTOP).map_err(|e| e.to_string()),
                _ => ctx
                    .control
                    .point(step, &fault_point(step, f.index))
                    .map_err(|e| format!("{e:#}")),
            };
            match outcome {
                Ok(()) => {
                    eprintln!(
                        "[exec {} rank {}] fault: {action:?} (program pid {})",
                        self.name,
                        self.record.rank,
                        proc.pid()
                    );
                    self.record.fault.get_or_insert((action, wall_us(now)));
                }
                Err(e) => self
                    .record
                    .violations
                    .push(format!("the {action:?} fault could not strike: {e}")),
            }
        }
    }

    fn frozen(&self) -> bool {
        matches!(self.record.fault, Some((FaultAction::Sigstop, _)))
    }

    fn ended(&mut self, why: &str) {
        self.record.ended_by_harness = Some(why.to_string());
    }

    /// What this rank can judge alone: how its program ended, and whether its faults struck.
    fn judge_alone(&mut self) {
        let x = &self.role.expect;
        let v = &mut self.record.violations;
        for f in &self.faults {
            if !f.struck {
                v.push(format!(
                    "the {:?} fault at {:?} never struck (its trigger never came)",
                    f.fault.action, f.fault.at
                ));
            }
        }
        let struck = self.record.fault.is_some();
        match (&self.exit, &self.record.ended_by_harness) {
            _ if struck && x.exit.is_none() && x.signal.is_none() => {}
            // Exiting in time after a fault is judged with the fault's time, by the coordinator.
            (None, _) if x.exit_within.is_some() => {}
            (None, why) => {
                v.push(format!(
                    "did not exit: {} (killed by the harness)",
                    why.as_deref()
                        .unwrap_or("still running when the others were done")
                ));
            }
            (Some(exit), _) => {
                let wanted = match (&x.exit, &x.signal) {
                    (Some(code), _) => Some(Exit::Code(*code)),
                    (None, Some(s)) => s.parse::<Signal>().ok().map(|s| Exit::Signal(s as i32)),
                    (None, None) if x.exit_within.is_none() => Some(Exit::Code(0)),
                    (None, None) => None,
                };
                if let Some(w) = wanted.filter(|w| w != exit) {
                    v.push(format!("ended with {exit}, expected {w}"));
                }
            }
        }
        if self.role.departs.is_some() && self.record.departed_us.is_none() {
            v.push("never announced that it leaves (no line matched `departs`)".into());
        }
        if let Some(r) = self
            .role
            .ready
            .as_ref()
            .filter(|_| self.record.ready_us.is_none() && !struck)
        {
            v.push(format!(
                "{NEVER_READY} within {:?}: {}",
                r.timeout.0,
                r.awaited(self.port)
            ));
        }
    }
}

/// The number at dotted `key` in a JSON line. Lenient: bare keys (`{avg: 1.5}`, as perftest
/// writes them) are quoted first, and numbers given as strings are read too.
fn json_number(line: &str, key: &str) -> Option<f64> {
    let text = line.trim();
    if !text.starts_with('{') {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(text).ok().or_else(|| {
        let bare = Regex::new(r#"([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:"#).ok()?;
        serde_json::from_str(&bare.replace_all(text, r#"$1"$2":"#)).ok()
    })?;
    let mut at = &value;
    for part in key.split('.') {
        at = at.get(part)?;
    }
    at.as_f64().or_else(|| at.as_str()?.trim().parse().ok())
}

/// The first fault of the step: one a rank struck its own program with, or one of the
/// scenario's (a host kill, say): (the rank it struck, what, when).
fn first_fault(records: &[Record], faults: &[StruckFault]) -> Option<(u32, String, u64)> {
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

fn reconcile(e: &Exec, reports: &[(u32, &StepReport)], faults: &[StruckFault]) -> Reconciled {
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

fn tail(r: &Record) -> String {
    if r.tail.is_empty() {
        return "(none)".into();
    }
    r.tail
        .iter()
        .map(|l| format!("`{l}`"))
        .collect::<Vec<_>>()
        .join(" / ")
}

#[cfg(test)]
mod tests;
