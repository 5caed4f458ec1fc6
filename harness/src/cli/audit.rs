//! `wringer audit [--check …] [--perturb …] -- PROGRAM ARGS…`: the lifecycle audit on any
//! command, with no scenario file. The command becomes a one-step scenario (an `exec` role,
//! `--ranks` copies of it), built as typed values and checked as a file's would be, recorded
//! in the report folder (`audit.yaml`), and run as `wringer run` runs it:
//! under the syscall recorder (children and threads followed), with the same report, replay and
//! shrink lines.

use std::path::{Path, PathBuf};

use anyhow::Context;
use std::collections::BTreeMap;
use wringer::hosts::profile as hosts;
use wringer::model::duration::HumanDuration;

use serde_saphyr::{Location, Spanned};
use wringer::model::scenario::{self, AuditBackend, AuditCheck, Scenario};
use wringer::orchestration::runner;
use wringer::outputs::progress::Progress;
use wringer::outputs::report::ReportWriter;
use wringer::rank::steps::exec::{Exec, Role};
use wringer::rank::steps::Step;

#[derive(clap::Args)]
pub struct Args {
    /// The checks (default: fd-lifecycle). `leaks` lists every descriptor the program made and
    /// had not closed when it exited, as valgrind's --track-fds does: ask for it, since
    /// runtimes keep some (an event loop's epoll, a signal pipe) for their whole life.
    #[arg(long = "check", value_enum)]
    pub checks: Vec<Check>,
    /// Copies of the command to run side by side; `{rank}`, `{ranks}`, `{dir}` (a folder they
    /// share) and `{port}` in its arguments are filled in per copy.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub ranks: u32,
    /// How long the command may run before it is stopped (and its stacks taken).
    #[arg(long, default_value = "60s", value_parser = |s: &str| HumanDuration::parse(s))]
    pub deadline: HumanDuration,
    /// The exit status the command must end with (0 to 255: what a process can exit with).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..=255))]
    pub exit: i32,
    /// Repeat the command N times (1 to 10,000).
    #[arg(long, value_parser = |s: &str| s.parse::<u32>().map_err(|e| wringer::model::invalid::Invalid(e.to_string())).and_then(wringer::model::scenario::check_repeat))]
    pub repeat: Option<u32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where to write the report (default: reports/<run-id>/).
    #[arg(long)]
    pub report_dir: Option<PathBuf>,
    /// What records the syscalls (default: eBPF where this host can use it, else strace;
    /// also WRINGER_AUDIT_BACKEND). Perturbations are applied by a preloaded observer where
    /// the program is dynamically linked, else by strace; the report says which.
    #[arg(long, value_enum)]
    pub audit_backend: Option<AuditBackend>,
    /// A suppressions file (repeatable): findings it names are counted, not failed
    /// (docs/audit.md).
    #[arg(long = "suppressions")]
    pub suppressions: Vec<PathBuf>,
    #[command(flatten)]
    pub replay: super::replay::ReplayArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Check {
    FdLifecycle,
    Leaks,
    UnboundedWaits,
    Waits,
    VerbsLifecycle,
}

impl From<Check> for AuditCheck {
    fn from(c: Check) -> AuditCheck {
        match c {
            Check::FdLifecycle => AuditCheck::FdLifecycle,
            Check::Leaks => AuditCheck::Leaks,
            Check::UnboundedWaits => AuditCheck::UnboundedWaits,
            Check::Waits => AuditCheck::Waits,
            Check::VerbsLifecycle => AuditCheck::VerbsLifecycle,
        }
    }
}

/// `./close_in_use` is run from here; a bare name is looked up as exec steps look it up.
fn program_path(p: &str) -> String {
    if p.contains('/') {
        std::fs::canonicalize(p)
            .map(|x| x.display().to_string())
            .unwrap_or_else(|_| p.to_string())
    } else {
        p.to_string()
    }
}

/// A value built here, not read from a file: nothing in it has a place in one.
fn unplaced<T>(value: T) -> Spanned<T> {
    Spanned::new(value, Location::UNKNOWN, Location::UNKNOWN)
}

/// The scenario that runs the command, as typed values.
fn scenario(a: &Args, checks: &[AuditCheck]) -> Scenario<Step> {
    let name = Path::new(&a.command[0])
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    // The scenario's name only labels the report: the program's own name, cut to fit.
    let slug: String = name
        .chars()
        .take(48)
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let deadline = a.deadline.0;
    let mut role = Role::program(
        (0..a.ranks).collect(),
        program_path(&a.command[0]),
        a.command[1..].to_vec(),
    );
    role.expect.exit = Some(a.exit);
    let exec = Exec {
        roles: BTreeMap::from([("program".to_string(), role)]),
        faults: vec![],
        no_output_timeout: None,
        deadline: HumanDuration(deadline),
        log_limit_mib: None,
    };
    Scenario {
        name: format!("audit-{}", slug.trim_matches('-')),
        description: format!("wringer audit -- {}", a.command.join(" ")),
        requires: vec![],
        ranks: unplaced(a.ranks),
        deadline: HumanDuration(deadline + std::time::Duration::from_secs(30)),
        repeat: 1,
        faults: vec![],
        steps: vec![unplaced(Step::Exec(exec))],
        audit: checks.to_vec(),
        perturb: vec![],
        must_reach: vec![],
        expect: BTreeMap::new(),
        releases: None,
        release: None,
    }
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    // A command that is not there is a mistake in the command line, not a skip.
    let program = program_path(&a.command[0]);
    if wringer::hosts::programs::resolve(&program, &wringer::hosts::programs::search_path())
        .is_none()
    {
        return Err(wringer::model::input::InputError::plain(
            Path::new(&a.command[0]),
            "no such program here (nor on PATH or among the programs `just external` builds)",
        )
        .into());
    }
    // A fault strikes at a point a step reports or an output line an exec role names; an
    // audited command has neither, so a `--fault` could only be dropped: refuse it.
    if let Some(f) = a.replay.fault.first() {
        return Err(wringer::model::input::InputError::Flag {
            flag: format!("--fault '{}'", runner::flow_yaml(f)),
            message: "`wringer audit` runs one command, which reports no named points for a fault to strike at; put the command in a scenario file (an exec role with `faults:`) and use `wringer run`".into(),
        }
        .into());
    }
    // Bad input is refused before anything is written.
    let mut supp_words = vec![];
    let suppressions = super::run::load_suppressions(&a.suppressions, &mut supp_words)?;
    let mut checks: Vec<AuditCheck> = a.checks.iter().map(|c| (*c).into()).collect();
    if checks.is_empty() {
        checks = vec![AuditCheck::FdLifecycle];
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let dir = a
        .report_dir
        .clone()
        .unwrap_or_else(|| Path::new("reports").join(format!("audit-{}", now.as_secs())));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The scenario is written down as a record of what ran (JSON, which is YAML: `wringer
    // run` takes it back); the run itself uses the typed values.
    let file = dir.join("audit.yaml");
    let loaded = scenario::checked(&file, scenario(&a, &checks))?;
    let text = serde_json::to_string_pretty(&loaded.scenario)?;
    std::fs::write(&file, &text).with_context(|| format!("writing {}", file.display()))?;
    // This machine, and nothing known to fail: an audit judges the command alone.
    let profile = hosts::parse(
        Path::new("<wringer audit>"),
        "name: local\ndescription: this machine (wringer audit)\nkind: local\n",
    )?;
    let mut head: Vec<String> = vec!["wringer".into(), "audit".into()];
    for c in &checks {
        head.push("--check".into());
        head.push(serde_json::to_value(c)?.as_str().unwrap_or_default().into());
    }
    if a.ranks > 1 {
        head.extend(["--ranks".into(), a.ranks.to_string()]);
    }
    // What the command must do and within what time are part of what failed: a pasted line
    // without them would judge it by other rules.
    head.extend(["--deadline".into(), a.deadline.to_string()]);
    if a.exit != 0 {
        head.extend(["--exit".into(), a.exit.to_string()]);
    }
    head.extend(supp_words);
    let mut tail = vec!["--".to_string()];
    tail.extend(a.command.iter().cloned());
    let opts = runner::RunOptions {
        report_dir: Some(dir),
        repeat: a.repeat,
        seed: a.seed,
        attempt: a.replay.attempt,
        perturb: a.replay.perturb(),
        faults: None,
        until_fail: a.replay.until_fail,
        replays: a.replay.replays,
        rerun: runner::Rerun {
            head,
            tail: Some(tail),
        },
        audit_backend: a.audit_backend.or_else(runner::audit_backend_from_env),
        suppressions,
        ..runner::RunOptions::default()
    };
    if a.replay.shrink {
        return super::replay::shrink(vec![loaded], &profile, opts, &a.replay);
    }
    let mut progress = Progress::default();
    let mut files = ReportWriter::default();
    runner::run(
        vec![loaded],
        &profile,
        &opts,
        &mut [&mut progress, &mut files],
    )
}
