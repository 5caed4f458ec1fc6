//! Scenario files: the schema, loading, and the checks that make bad input a located error.
//! The step kinds themselves live with the rank side (`rank::steps`); the schema only needs
//! what a step declares about itself ([`StepSpec`]).

use crate::model::invalid::Invalid;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::duration::HumanDuration;
use super::input::{located, InputError};
use super::metric::{Bound, Metric, Series};
use super::requirement::Requirement;

/// A step's kind name as YAML spells it (`teardown-cycles`); the registry knows it.
pub trait Named {
    fn name(&self) -> &'static str;
}

/// What a step kind declares about itself, so a scenario can be checked before anything runs.
pub trait StepSpec {
    /// Every metric the step records; recording another one is an error.
    fn metrics(&self) -> &'static [Metric];
    /// Every latency series the step samples.
    fn series(&self) -> &'static [Series] {
        &[]
    }
    /// Fewest ranks the step needs.
    fn min_ranks(&self) -> u32 {
        2
    }
    /// Parameter checks against the scenario's rank count; the message says what to fix.
    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        Ok(())
    }
    /// Faults the step asks the coordinator to strike (at points its ranks report), on top of
    /// the scenario's own; `step` is the step's place in the scenario.
    fn faults(&self, _step: usize) -> Vec<Fault> {
        vec![]
    }
    /// Whether the step names `{release}`, which only a scenario with `releases:` fills.
    fn uses_release(&self) -> bool {
        false
    }
    /// The points its ranks report reaching, where a scenario's fault may strike (`at:`).
    fn points(&self) -> Vec<String> {
        vec![]
    }
    /// The points its purpose depends on, which its ranks count as they reach them; a
    /// scenario's `must_reach:` names those it requires.
    fn reach_points(&self) -> &'static [super::reach::ReachPoint] {
        &[]
    }
    /// What its hosts must have (RDMA for a step over `fabric: rdma`): added to the
    /// scenario's own `requires`, so a scenario that forgets one is skipped, not failed.
    fn requires(&self) -> Vec<Requirement> {
        vec![]
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[serde(bound(deserialize = "S: Deserialize<'de>", serialize = "S: Serialize"))]
pub struct Scenario<S> {
    #[serde(deserialize_with = "super::name::checked")]
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub requires: Vec<Requirement>,
    pub ranks: Spanned<u32>,
    /// Whole-scenario deadline, per repeat.
    pub deadline: HumanDuration,
    #[serde(default = "one", deserialize_with = "at_least_one")]
    pub repeat: u32,
    #[serde(default)]
    pub faults: Vec<Spanned<Fault>>,
    #[serde(deserialize_with = "not_empty")]
    pub steps: Vec<Spanned<S>>,
    /// Lifecycle checks on the ranks' syscalls (they run under strace).
    #[serde(default)]
    pub audit: Vec<AuditCheck>,
    /// Syscall delays that widen race windows (under strace too).
    #[serde(default)]
    pub perturb: Vec<Spanned<Perturb>>,
    /// Points its steps declare that some repeat must reach, or the scenario fails.
    #[serde(default)]
    pub must_reach: Vec<Spanned<String>>,
    pub expect: BTreeMap<Metric, Spanned<Bound>>,
    /// Run once per installed release of this program (`torch`): each run is its own
    /// scenario, named with the release, and `{release}` in its exec roles is that release's
    /// folder.
    #[serde(default)]
    pub releases: Option<ReleaseFamily>,
    /// The release this copy of the scenario runs against (set when releases are expanded).
    #[serde(skip)]
    pub release: Option<Release>,
}

/// A program whose releases a scenario runs against, one copy per release.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseFamily {
    /// PyTorch (its Gloo): venvs installed by `just external-torch`, or named by WRINGER_TORCH.
    Torch,
}

impl ReleaseFamily {
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseFamily::Torch => "torch",
        }
    }

    /// The skip's code when no release is installed.
    pub fn skip_code(self) -> super::requirement::SkipCode {
        match self {
            ReleaseFamily::Torch => super::requirement::SkipCode::NoTorch,
        }
    }

    /// A scenario's name with a release in it: `torch-gloo-allreduce` on 2.15.0 is
    /// `torch-2.15.0-gloo-allreduce`, so the matrix has a row per release.
    pub fn name(self, scenario: &str, version: &str) -> String {
        let family = self.as_str();
        match scenario.strip_prefix(&format!("{family}-")) {
            Some(rest) => format!("{family}-{version}-{rest}"),
            None => format!("{scenario}-{family}-{version}"),
        }
    }
}

/// A version's order: its leading numbers as numbers (2.15.0 after 2.8.0), then the text.
pub fn version_order(version: &str) -> (Vec<u64>, String) {
    let numbers = version
        .split(['.', '_', '-'])
        .map_while(|p| p.parse::<u64>().ok())
        .collect();
    (numbers, version.to_string())
}

/// One installed release: its version (as it appears in names: letters, digits, `.`, `_`,
/// `-`) and its folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub version: String,
    pub root: PathBuf,
}

fn one() -> u32 {
    1
}

/// The most repeats a scenario (or `--repeat`) may ask for: more is a typo, not a plan.
pub const MAX_REPEAT: u32 = 10_000;

/// `repeat: 0` and repeats past [`MAX_REPEAT`] are errors where they stand (line and column),
/// not after the file loaded.
fn at_least_one<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u32::deserialize(d)?;
    check_repeat(n).map_err(serde::de::Error::custom)?;
    Ok(n)
}

/// What is wrong with a repeat count, if anything.
pub fn check_repeat(n: u32) -> Result<u32, Invalid> {
    if n == 0 {
        return Err("repeat must be at least 1".into());
    }
    if n > MAX_REPEAT {
        return Err(format!("repeat is at most {MAX_REPEAT}, got {n}").into());
    }
    Ok(n)
}

fn not_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    let v = Vec::<T>::deserialize(d)?;
    if v.is_empty() {
        return Err(serde::de::Error::custom(
            "a scenario needs at least one step",
        ));
    }
    Ok(v)
}

impl<S> Scenario<S> {
    /// The name as the file gives it, before a release was put into it.
    pub fn file_name(&self) -> String {
        match &self.release {
            Some(r) => self.name.replacen(&format!("-{}", r.version), "", 1),
            None => self.name.clone(),
        }
    }
}

impl<S: StepSpec> Scenario<S> {
    /// The scenario's faults and those its steps ask for.
    pub fn all_faults(&self) -> Vec<Fault> {
        let own = self.faults.iter().map(|f| f.value.clone());
        own.chain(self.step_faults()).collect()
    }

    /// The faults its steps ask for (exec roles'), without the scenario-level ones.
    pub fn step_faults(&self) -> Vec<Fault> {
        self.steps
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.value.faults(i))
            .collect()
    }
}

/// A lifecycle check the audit can run on a rank's syscall trace.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum AuditCheck {
    /// Close while in use, close before the receiver is done, use after close.
    FdLifecycle,
    /// Fds and threads a step created that outlive it.
    Leaks,
    /// Blocking calls without a timeout still in progress when a hang was declared; and, where
    /// the sync observer is loaded, every untimed join, condition, semaphore or barrier wait.
    UnboundedWaits,
    /// Deadlocks that did not happen: lock-order cycles, and joins or waits made while holding
    /// a lock another thread takes (from the sync observer).
    Waits,
    /// Verbs object lifecycles, posts and completions, seen by an observer preloaded into the
    /// ranks and every program they start (the RDMA data path bypasses the kernel).
    VerbsLifecycle,
}

/// What records the ranks' syscalls for the audit: the kernel (eBPF, no thread stops) or
/// strace (ptrace; also what injects perturbations).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AuditBackend {
    Ebpf,
    Strace,
}

impl std::fmt::Display for AuditBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AuditBackend::Ebpf => "ebpf",
            AuditBackend::Strace => "strace",
        })
    }
}

impl AuditCheck {
    /// Whether the check reads the syscall trace (eBPF or strace); the verbs check does not.
    pub fn reads_syscalls(self) -> bool {
        self != AuditCheck::VerbsLifecycle
    }
}

/// A delay injected into one syscall, on entry or exit, on every call or a share of them.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Perturb {
    pub syscall: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_enter: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_exit: Option<HumanDuration>,
    /// Share of calls delayed, in (0, 1]; the calls chosen follow from the run's seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
    /// Exactly which calls, counted per thread from 1 (strace's `when=`): `3` (the third),
    /// `3..7`, `3+2` (the third and every second after it), `3..9+2`. What a replay records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
}

/// The longest delay a perturbation may inject: longer ones stop measuring races and start
/// measuring timeouts.
pub const MAX_PERTURB_DELAY: Duration = Duration::from_secs(1);

impl Perturb {
    /// What is wrong with it, if anything (the syscall name reaches strace's command line).
    pub fn check(&self) -> Result<(), Invalid> {
        let name_ok = !self.syscall.is_empty()
            && self.syscall.len() <= 32
            && self
                .syscall
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !name_ok {
            return Err(format!(
                "`{}` is not a syscall name (lowercase letters, digits, _)",
                self.syscall
            )
            .into());
        }
        if !super::syscalls::exists(&self.syscall) {
            return Err(format!(
                "`{}` is not a syscall of this architecture (x86_64): strace could not perturb it",
                self.syscall
            )
            .into());
        }
        if self.delay_enter.is_none() && self.delay_exit.is_none() {
            return Err("a perturbation needs delay_enter or delay_exit".into());
        }
        for d in [self.delay_enter, self.delay_exit].into_iter().flatten() {
            if d.0 > MAX_PERTURB_DELAY {
                return Err(format!(
                    "a delay of {:?} is over the {MAX_PERTURB_DELAY:?} limit",
                    d.0
                )
                .into());
            }
        }
        if let Some(p) = self.probability {
            if !(p > 0.0 && p <= 1.0) {
                return Err(format!("probability must be in (0, 1], got {p}").into());
            }
            // A replay spells p as every round(1/p)-th call, and strace counts to 65535.
            if (1.0 / p).round() > 65535.0 {
                return Err(format!(
                    "probability {p} is rarer than strace can inject (every 65535th call at most): use at least 0.0000153"
                )
                .into());
            }
        }
        if let Some(w) = &self.when {
            if self.probability.is_some() {
                return Err("give either probability or when, not both".into());
            }
            parse_when(w).map_err(|e| Invalid::from(format!("when `{w}`: {e}")))?;
        }
        Ok(())
    }

    /// The same perturbation with the calls it delays spelled out by count (`when`), as the
    /// run with `seed` chose them: it replays without the seed. `probability` p becomes every
    /// round(1/p)-th call from an offset drawn from the seed.
    pub fn exact(&self, seed: u64) -> Perturb {
        let mut p = self.clone();
        if let Some(prob) = p.probability.take().filter(|p| *p < 1.0) {
            let every = (1.0 / prob).round().max(1.0) as u64;
            let first = 1 + splitmix(seed) % every;
            p.when = Some(format!("{first}+{every}"));
        }
        p
    }
}

/// `its steps report `a`, `b``, or `none` when there are none.
fn listed<T: AsRef<str>>(names: &[T], intro: &str, none: &str) -> String {
    if names.is_empty() {
        return none.to_string();
    }
    let quoted: Vec<String> = names.iter().map(|p| format!("`{}`", p.as_ref())).collect();
    format!("{intro} {}", quoted.join(", "))
}

/// A `when` expression: first[..last][+step], counted from 1.
pub fn parse_when(w: &str) -> Result<(u64, Option<u64>, Option<u64>), String> {
    // Digits only: strace reads the expression as it is, so a space or a sign that Rust's
    // parser would forgive is refused here rather than by strace at run time.
    let num = |s: &str| -> Result<u64, String> {
        if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("`{s}` is not a count (digits only, no spaces)"));
        }
        let n: u64 = s.parse().map_err(|_| format!("`{s}` is not a count"))?;
        if !(1..=65535).contains(&n) {
            return Err(format!("{n} is out of 1..=65535 (strace's range)"));
        }
        Ok(n)
    };
    let (range, step) = match w.split_once('+') {
        Some((r, s)) => (r, Some(num(s)?)),
        None => (w, None),
    };
    let (first, last) = match range.split_once("..") {
        Some((f, l)) => (num(f)?, Some(num(l)?)),
        None => (num(range)?, None),
    };
    if last.is_some_and(|l| l < first) {
        return Err("the last call comes before the first".into());
    }
    Ok((first, last, step))
}

pub use super::seed::splitmix;

/// Kill or freeze a rank when it reports reaching a named point.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub rank: u32,
    pub at: String,
    pub action: FaultAction,
}

pub use super::faults::{FaultAction, Reach, Strikes};

const QP_ERROR_NEEDS_OBSERVER: &str = "a `qp-error` fault moves the rank's QPs through the verbs observer: add `audit: [verbs-lifecycle]`";

/// A scenario as loaded from disk, with where it came from.
#[derive(Clone, Debug)]
pub struct Loaded<S> {
    pub path: PathBuf,
    pub scenario: Scenario<S>,
}

impl<S: Clone> Loaded<S> {
    pub fn steps(&self) -> Vec<S> {
        self.scenario
            .steps
            .iter()
            .map(|s| s.value.clone())
            .collect()
    }

    pub fn faults(&self) -> Vec<Fault>
    where
        S: StepSpec,
    {
        self.scenario.all_faults()
    }

    pub fn ranks(&self) -> u32 {
        self.scenario.ranks.value
    }
}

/// Parse and check one scenario file.
pub fn load<S: StepSpec + Named + DeserializeOwned>(path: &Path) -> Result<Loaded<S>, InputError> {
    let text = super::input::read_text(path, crate::model::input::FileKind::Scenario)?;
    parse(path, &text)
}

/// Parse and check a scenario's text (`path` names it in errors).
pub fn parse<S: StepSpec + Named + DeserializeOwned>(
    path: &Path,
    text: &str,
) -> Result<Loaded<S>, InputError> {
    let scenario: Scenario<S> = super::input::parse_yaml(path, text)?;
    checked(path, scenario)
}

/// A scenario built as typed values (`wringer audit` builds one) checked as a file's is, with
/// the requirements of its steps; `path` is where its record is written.
pub fn checked<S: StepSpec + Named>(
    path: &Path,
    mut scenario: Scenario<S>,
) -> Result<Loaded<S>, InputError> {
    if let Err(why) = super::name::check(&scenario.name) {
        return Err(InputError::plain(path, format!("name: {why}")));
    }
    check(path, &scenario)?;
    let from_steps: Vec<Requirement> = scenario
        .steps
        .iter()
        .flat_map(|s| s.value.requires())
        .collect();
    // After the scenario's own, in their order: the first unmet one names the skip.
    for r in from_steps {
        if !scenario.requires.contains(&r) {
            scenario.requires.push(r);
        }
    }
    Ok(Loaded {
        path: path.to_owned(),
        scenario,
    })
}

fn check<S: StepSpec + Named>(path: &Path, s: &Scenario<S>) -> Result<(), InputError> {
    let ranks = s.ranks.value;
    if !(1..=256).contains(&ranks) {
        return Err(located(
            path,
            &s.ranks.referenced,
            format!("ranks must be 1..=256, got {ranks}"),
        ));
    }
    for step in &s.steps {
        if ranks < step.value.min_ranks() {
            return Err(located(
                path,
                &step.referenced,
                format!(
                    "step `{}` needs at least {} ranks, the scenario has {ranks}",
                    step.value.name(),
                    step.value.min_ranks()
                ),
            ));
        }
        if s.releases.is_none() && step.value.uses_release() {
            return Err(located(
                path,
                &step.referenced,
                format!(
                    "step `{}` names `{{release}}`, which only a scenario with `releases:` (torch) fills",
                    step.value.name()
                ),
            ));
        }
        if let Err(why) = step.value.check(ranks) {
            return Err(located(
                path,
                &step.referenced,
                format!("step `{}`: {why}", step.value.name()),
            ));
        }
    }
    for p in &s.perturb {
        if let Err(why) = p.value.check() {
            return Err(located(path, &p.referenced, why.0));
        }
    }
    let observed = s.audit.contains(&AuditCheck::VerbsLifecycle);
    for (i, step) in s.steps.iter().enumerate() {
        if !observed
            && step
                .value
                .faults(i)
                .iter()
                .any(|f| f.action.kind().needs_verbs_observer())
        {
            return Err(located(
                path,
                &step.referenced,
                QP_ERROR_NEEDS_OBSERVER.into(),
            ));
        }
    }
    let reachable: Vec<&str> = s
        .steps
        .iter()
        .flat_map(|st| st.value.reach_points().iter().map(|p| p.name))
        .collect();
    for want in &s.must_reach {
        if !reachable.contains(&want.value.as_str()) {
            let known = listed(
                &reachable,
                "its steps declare",
                "its steps declare no points",
            );
            return Err(located(
                path,
                &want.referenced,
                format!(
                    "must_reach `{}`: no step of this scenario declares that point; {known}",
                    want.value
                ),
            ));
        }
    }
    for fault in &s.faults {
        if let Err(why) = fault_problem(s, &fault.value) {
            return Err(located(path, &fault.referenced, why));
        }
    }
    let produced: Vec<Metric> = s
        .steps
        .iter()
        .flat_map(|st| st.value.metrics().iter().copied())
        .collect();
    for (metric, bound) in &s.expect {
        if !produced.contains(metric) {
            return Err(located(
                path,
                &bound.referenced,
                format!("no step of this scenario reports `{metric}`; it would never be checked"),
            ));
        }
        let b = bound.value;
        if b.min.is_none() && b.max.is_none() && b.equals.is_none() {
            return Err(located(
                path,
                &bound.referenced,
                "a bound needs min, max or equals".into(),
            ));
        }
        if let Err(why) = b.satisfiable() {
            return Err(located(
                path,
                &bound.referenced,
                format!("`{metric}`: {why}"),
            ));
        }
    }
    Ok(())
}

/// What is wrong with a scenario-level fault in `s`, if anything: the same checks for one
/// read from the file and one given with `--fault`.
pub fn fault_problem<S: StepSpec + Named>(s: &Scenario<S>, fault: &Fault) -> Result<(), String> {
    let mut points: Vec<String> = s.steps.iter().flat_map(|st| st.value.points()).collect();
    points.sort();
    points.dedup();
    if !points.contains(&fault.at) {
        let known = listed(
            &points,
            "its steps report",
            "no step of this scenario reports a point a fault could strike at",
        );
        return Err(format!(
            "fault at `{}`: no step reaches that point, so the fault would never strike; {known}",
            fault.at
        ));
    }
    if let Err(why) = fault.action.kind().check() {
        return Err(format!("fault: {}", why.0));
    }
    if fault.action.kind().needs_verbs_observer() && !s.audit.contains(&AuditCheck::VerbsLifecycle)
    {
        return Err(QP_ERROR_NEEDS_OBSERVER.into());
    }
    if fault.rank >= s.ranks.value {
        return Err(format!(
            "fault names rank {}, the scenario has {}",
            fault.rank, s.ranks.value
        ));
    }
    Ok(())
}

/// Expand files and folders into scenario files, sorted, so a run's order is stable.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>, InputError> {
    let mut found = vec![];
    for p in paths {
        if p.is_dir() {
            let entries = std::fs::read_dir(p).map_err(|e| InputError::io(p, e))?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| matches!(f.extension().and_then(|x| x.to_str()), Some("yaml" | "yml")))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(InputError::plain(
                    p,
                    "is a folder with no .yaml or .yml files in it",
                ));
            }
            found.extend(files);
        } else if p.exists() {
            // A FIFO or a device too: reading it says what it is (see `input::read_bytes`).
            found.push(p.clone());
        } else {
            return Err(InputError::plain(p, "no such scenario file or folder"));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perturb(yaml: &str) -> Perturb {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn when_names_calls_by_count_in_straces_range() {
        assert_eq!(parse_when("3"), Ok((3, None, None)));
        assert_eq!(parse_when("3..9+2"), Ok((3, Some(9), Some(2))));
        assert_eq!(parse_when("1+4"), Ok((1, None, Some(4))));
        for bad in [
            "0", "9..3", "x", "3+", "70000", "-1", "3 ", " 3", "3.. 9", "3 +2", "+3", "3++2", "",
        ] {
            assert!(parse_when(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_perturbation_takes_either_probability_or_when() {
        assert!(perturb("{ syscall: poll, delay_exit: 1ms, when: \"2+3\" }")
            .check()
            .is_ok());
        let both = perturb("{ syscall: poll, delay_exit: 1ms, when: \"2\", probability: 0.5 }");
        assert!(both.check().unwrap_err().0.contains("not both"));
        let rare = perturb("{ syscall: poll, delay_exit: 1ms, probability: 0.000001 }");
        assert!(rare.check().unwrap_err().0.contains("rarer than strace"));
        assert!(
            perturb("{ syscall: poll, delay_exit: 1ms, probability: 0.0000153 }")
                .check()
                .is_ok()
        );
        let bad = perturb("{ syscall: poll, delay_exit: 1ms, when: \"0\" }");
        assert!(bad.check().unwrap_err().0.contains("when `0`"));
    }

    #[test]
    fn the_exact_form_draws_its_calls_from_the_seed_and_keeps_an_explicit_when() {
        let p = perturb("{ syscall: poll, delay_exit: 1ms, probability: 0.25 }");
        let e = p.exact(7);
        assert_eq!(e, p.exact(7));
        assert_eq!(e.probability, None);
        let (first, last, step) = parse_when(e.when.as_deref().unwrap()).unwrap();
        assert!(
            (1..=4).contains(&first) && last.is_none() && step == Some(4),
            "{e:?}"
        );
        let fixed = perturb("{ syscall: poll, delay_exit: 1ms, when: \"5\" }");
        assert_eq!(fixed.exact(99), fixed);
        let always = perturb("{ syscall: poll, delay_exit: 1ms, probability: 1.0 }");
        assert_eq!(
            (always.exact(3).when, always.exact(3).probability),
            (None, None)
        );
    }
}
