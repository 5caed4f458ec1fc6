//! Launchers: where rank processes run and how every one of them is ended.
//!
//! - Local: `wringer rank` children in one process group per run, each tied to the
//!   coordinator's life (PR_SET_PDEATHSIG).
//! - SSH: a local `ssh` child per rank runs `wringer rank` on its host; the rank makes itself a
//!   process-group leader there, reads the run token from stdin (never from the command line)
//!   and exits when that stdin closes, so a dead coordinator or ssh leaves nothing behind. Every
//!   rank is killed by remote process group at the end, and the host's process table is checked.
//! - Slurm: one job step for all ranks (see `slurm_step`); cancelled at the end, and the
//!   scheduler's step table is checked.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::hosts::backend::Launch;
use crate::hosts::placement::{Placement, RemoteHost};
use crate::model::scenario::{AuditBackend, AuditCheck, Perturb};
use crate::orchestration::audit;
use crate::orchestration::slurm_step::SlurmStep;
pub use crate::orchestration::slurm_step::StepLimits;
use crate::rank::protocol::{TOKEN_ENV, TRANSPORT_BUG_ENV};

/// How long every thread of a rank sent SIGSTOP may take to stop: each takes the signal when it
/// next runs, which on a loaded machine can be a scheduler tick or a few away.
const STOP_TAKEN_WITHIN: Duration = Duration::from_secs(1);

struct RankProc {
    /// The local process: the rank itself, or the `ssh` that carries it (none under Slurm:
    /// one srun carries them all).
    child: Option<Child>,
    /// Kept open while the rank should live; a remote rank exits when it closes.
    stdin: Option<ChildStdin>,
    /// The rank's own PID on its host (reported in its hello); equals its process group.
    remote_pid: Option<u32>,
}

/// Ranks run under the audit: a syscall recorder (eBPF or strace) for the syscall checks and
/// perturbations, the verbs observer preloaded for the verbs check.
pub struct Tracing<'a> {
    pub checks: &'a [AuditCheck],
    pub perturb: &'a [Perturb],
    pub seed: u64,
    pub backend: AuditBackend,
    pub perturb_by: audit::PerturbBy,
}

impl Tracing<'_> {
    /// Whether ranks run under a syscall recorder.
    pub fn syscalls(&self) -> bool {
        !self.injected().is_empty() || self.checks.iter().any(|c| c.reads_syscalls())
    }

    /// The perturbations strace injects (none when the observer delays them).
    fn injected(&self) -> &[Perturb] {
        match self.perturb_by {
            audit::PerturbBy::Strace => self.perturb,
            audit::PerturbBy::Preload => &[],
        }
    }

    /// The words that run a rank (`exe` on its host) under the recorder, trace to `out`.
    fn command(&self, exe: &str, out: &Path) -> Vec<String> {
        audit::tracer_command(
            self.backend,
            exe,
            self.checks,
            self.injected(),
            self.seed,
            out,
        )
    }

    /// The perturbation observer's rules, when it delays the perturbed calls.
    pub fn preload_rules(&self) -> Option<String> {
        (self.perturb_by == audit::PerturbBy::Preload && !self.perturb.is_empty())
            .then(|| audit::preload_rules(self.perturb, self.seed))
    }

    /// Whether ranks run with the verbs observer preloaded.
    pub fn verbs(&self) -> bool {
        self.checks.contains(&AuditCheck::VerbsLifecycle)
    }

    /// Whether ranks run with the sync observer preloaded: their descriptor checks are judged
    /// by happens-before (where this build has the observer).
    pub fn sync(&self) -> bool {
        self.checks.iter().any(|c| {
            matches!(
                c,
                AuditCheck::FdLifecycle | AuditCheck::Waits | AuditCheck::UnboundedWaits
            )
        }) && crate::rank::sync_observer::available()
    }
}

pub struct RankGroup {
    procs: Vec<RankProc>,
    /// Where rank logs (and local traces) go.
    log_dir: PathBuf,
    /// Whether ranks run under strace; a remote rank's trace lies on its host until fetched.
    traced: bool,
    /// Whether ranks run with the verbs observer (their traces too lie on their hosts).
    verbs: bool,
    placement: Placement,
    /// The local process group of every local child of this run (the first leads it).
    pgid: i32,
    rendezvous: SocketAddr,
    killed: bool,
    /// This run's private folder on every remote host (0700, named from the run's secret
    /// token): remote traces and verbs traces are written, read back and removed only there.
    remote_dir: String,
    /// The ranks' Slurm step, when Slurm places them,
    step: Option<SlurmStep>,
    /// and what went wrong cancelling it (reported with the leftovers).
    step_problems: Vec<String>,
}

impl RankGroup {
    /// Start `ranks` ranks, logs in `log_dir/rank-N.log`.
    pub fn start(
        ranks: u32,
        rendezvous: SocketAddr,
        token: &str,
        log_dir: &Path,
        placement: &Placement,
        tracing: Option<&Tracing>,
        limits: StepLimits,
    ) -> Result<RankGroup> {
        let transport_bug = limits.transport_bug.clone();
        std::fs::create_dir_all(log_dir)?;
        let mut group = RankGroup {
            procs: vec![],
            log_dir: log_dir.to_owned(),
            traced: tracing.is_some_and(Tracing::syscalls),
            verbs: tracing.is_some_and(Tracing::verbs),
            placement: placement.clone(),
            pgid: 0,
            rendezvous,
            remote_dir: format!(
                "/tmp/{}",
                crate::hosts::private::run_folder_name("run", token)
            ),
            killed: false,
            step: None,
            step_problems: vec![],
        };
        if (group.traced || group.verbs) && !matches!(placement.launch(), Launch::Step(_)) {
            group.make_remote_dirs()?;
        }
        if let Launch::Step(slurm) = placement.launch() {
            // Each task's supervisor runs its rank under strace; `{rank}` in the trace's path
            // becomes the task's rank there.
            let trace = tracing
                .filter(|t| t.syscalls())
                .map(|t| t.command(&slurm.exe, Path::new(&group.remote_trace("{rank}"))));
            let logs = (0..ranks)
                .map(|r| File::create(log_dir.join(format!("rank-{r}.log"))))
                .collect::<std::io::Result<Vec<_>>>()?;
            group.step = Some(SlurmStep::launch(
                slurm,
                ranks,
                rendezvous,
                token,
                logs,
                limits,
                trace.as_deref(),
            )?);
            group.procs = (0..ranks)
                .map(|_| RankProc {
                    child: None,
                    stdin: None,
                    remote_pid: None,
                })
                .collect();
            return Ok(group);
        }
        for rank in 0..ranks {
            let log = File::create(group.log_path(rank))?;
            let (r, addr) = (rank.to_string(), rendezvous.to_string());
            let mut cmd = match placement.launch() {
                Launch::Local => {
                    let exe = std::env::current_exe().context("locating the wringer binary")?;
                    let mut c = match tracing.filter(|t| t.syscalls()) {
                        Some(t) => {
                            let trace = group.trace_path(rank);
                            let words = t.command(&exe.to_string_lossy(), &trace);
                            let mut c = Command::new(&words[0]);
                            c.args(&words[1..]).arg(exe);
                            c
                        }
                        None => Command::new(exe),
                    };
                    c.args([
                        "rank",
                        "--rendezvous",
                        &addr,
                        "--rank",
                        &r,
                        "--bind",
                        "127.0.0.1",
                    ]);
                    if group.verbs {
                        c.arg("--verbs-trace").arg(group.verbs_prefix(rank));
                    }
                    if tracing.is_some_and(Tracing::sync) {
                        // One word with `=`: a report folder named like an option (`-o`)
                        // stays a value.
                        let mut maps = std::ffi::OsString::from("--sync-maps=");
                        maps.push(group.sync_maps_prefix(rank));
                        c.arg("--sync-observer").arg(maps);
                    }
                    if let Some(rules) = tracing.and_then(Tracing::preload_rules) {
                        let mut log = std::ffi::OsString::from("--perturb-log=");
                        log.push(group.perturb_log_prefix(rank));
                        c.arg(format!("--perturb-rules={rules}")).arg(log);
                    }
                    // The resolved bug, never the run's list of them (which no rank reads).
                    match &transport_bug {
                        Some(b) => c.env(TRANSPORT_BUG_ENV, b),
                        None => c.env_remove(TRANSPORT_BUG_ENV),
                    };
                    c.env(TOKEN_ENV, token).stdin(Stdio::null());
                    c
                }
                Launch::PerRank | Launch::Step(_) => {
                    let h = &placement.hosts()[placement.host_of(rank)];
                    // Tests switch a transport bug on (a `bug-injection` build only); remote
                    // ranks need it too.
                    let mut words: Vec<String> = transport_bug
                        .as_ref()
                        .map(|b| vec!["env".into(), format!("{TRANSPORT_BUG_ENV}={b}")])
                        .unwrap_or_default();
                    words.extend(match tracing.filter(|t| t.syscalls()) {
                        Some(t) => t.command(&h.exe, Path::new(&group.remote_trace(rank))),
                        None => vec![],
                    });
                    words.push(h.exe.clone());
                    let mut words: Vec<&str> = words.iter().map(String::as_str).collect();
                    words.extend([
                        "rank",
                        "--rendezvous",
                        &addr,
                        "--rank",
                        &r,
                        "--bind",
                        &h.data_addr,
                        "--token-stdin",
                    ]);
                    let prefix = group.verbs_prefix(rank);
                    if group.verbs {
                        words.extend(["--verbs-trace", &prefix]);
                    }
                    if tracing.is_some_and(Tracing::sync) {
                        words.push("--sync-observer");
                    }
                    let rules = tracing
                        .and_then(Tracing::preload_rules)
                        .map(|r| format!("--perturb-rules={r}"));
                    words.extend(rules.as_deref());
                    let crate::hosts::shell::Via::Ssh(ssh) = &h.target.via else {
                        anyhow::bail!(
                            "{}: a Slurm node is reached through the step",
                            h.target.name
                        );
                    };
                    let mut c = ssh.command(&words);
                    c.stdin(Stdio::piped());
                    c
                }
            };
            cmd.stdout(log.try_clone()?)
                .stderr(log)
                .process_group(group.pgid);
            // SAFETY: prctl is async-signal-safe and touches no memory of the parent; it asks
            // the kernel to SIGKILL this child when the spawning thread (the coordinator's main
            // thread) dies, so a killed coordinator cannot leave ranks (or their ssh) behind.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    group.kill_all();
                    return Err(e).context("starting a rank");
                }
            };
            if group.pgid == 0 {
                group.pgid = child.id() as i32;
            }
            let mut stdin = child.stdin.take();
            if let Some(s) = stdin.as_mut() {
                writeln!(s, "{token}").context("handing the run token to ssh")?;
            }
            group.procs.push(RankProc {
                child: Some(child),
                stdin,
                remote_pid: None,
            });
        }
        Ok(group)
    }

    pub fn is_remote(&self) -> bool {
        !self.placement.hosts().is_empty()
    }

    /// The local child's PID (the rank itself, or its ssh).
    pub fn local_pid(&self, rank: u32) -> Option<u32> {
        self.procs
            .get(rank as usize)
            .and_then(|p| p.child.as_ref())
            .map(Child::id)
    }

    /// The rank's PID where it runs.
    /// The rank's own PID: as it reported it when remote, or when a syscall recorder (strace,
    /// `trace-syscalls`) is the local child, so that faults and stack captures reach the
    /// rank, not its recorder.
    pub fn pid(&self, rank: u32) -> Option<u32> {
        let p = self.procs.get(rank as usize)?;
        if self.is_remote() {
            p.remote_pid
        } else if self.traced {
            p.remote_pid.or_else(|| p.child.as_ref().map(Child::id))
        } else {
            p.child.as_ref().map(Child::id)
        }
    }

    pub fn set_remote_pid(&mut self, rank: u32, pid: u32) {
        if let Some(p) = self.procs.get_mut(rank as usize) {
            p.remote_pid = Some(pid);
        }
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    pub fn try_wait(&mut self, rank: usize) -> Option<std::process::ExitStatus> {
        if let Some(step) = self.step.as_mut() {
            return step.try_wait(rank);
        }
        self.procs
            .get_mut(rank)
            .and_then(|p| p.child.as_mut())
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn target(&self, rank: u32) -> Option<&RemoteHost> {
        self.placement.hosts().get(self.placement.host_of(rank))
    }

    /// Whether rank `rank` runs on this machine.
    pub fn runs_here(&self, rank: u32) -> bool {
        self.target(rank).is_none()
    }

    /// Send `signal` to one rank, wherever it runs.
    pub fn signal(&self, rank: u32, signal: Signal) -> Result<()> {
        let pid = self
            .pid(rank)
            .context("the rank has not reported its PID")?;
        match self.target(rank) {
            None => kill(Pid::from_raw(pid as i32), signal).context("signalling the rank"),
            Some(h) => {
                let sig = format!("-{}", signal.as_str().trim_start_matches("SIG"));
                h.target
                    .check(&["kill", &sig, &pid.to_string()], Duration::from_secs(10))
                    .map(|_| ())
            }
        }
    }

    /// Kernel stacks of every thread of `rank`, wherever it runs, and user stacks (gdb) within
    /// `gdb` when given. A rank here that was just sent SIGSTOP is read once every thread of it
    /// has stopped (within [`STOP_TAKEN_WITHIN`]), so its stacks are the frozen ones.
    pub fn stacks(&self, rank: u32, gdb: Option<Duration>) -> Option<(u32, String)> {
        let pid = self.pid(rank)?;
        match self.target(rank) {
            None => {
                crate::hosts::procfs::wait_until(
                    || crate::hosts::procfs::all_threads_stopped(pid),
                    STOP_TAKEN_WITHIN,
                );
                // The rank, then every program it started (an exec step's), so a hang inside
                // an external program shows where.
                let mut text = String::new();
                for p in crate::hosts::procfs::process_tree(pid) {
                    if p != pid {
                        let comm =
                            std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
                        text.push_str(&format!("=== child process {p} ({})\n", comm.trim()));
                    }
                    text.push_str(&crate::hosts::procfs::capture_stacks(p, gdb));
                }
                Some((pid, text))
            }
            Some(h) => {
                // The rank, then the programs under it (an exec step's), kernel stacks each.
                let script = "stacks() { for t in /proc/$1/task/*; do echo \"--- thread ${t##*/} ($(cat $t/comm)) wchan=$(cat $t/wchan) syscall=$(cut -d' ' -f1 $t/syscall)\"; cat $t/stack; done; }; \
                              stacks $1; \
                              [ \"$2\" -gt 0 ] && command -v gdb >/dev/null && { echo '--- gdb: thread apply all bt'; timeout $2 gdb -batch -nx -p $1 -ex 'thread apply all bt' 2>/dev/null; }; \
                              for c in $(cat /proc/$1/task/*/children 2>/dev/null); do echo \"=== child process $c ($(cat /proc/$c/comm 2>/dev/null))\"; stacks $c; done; true";
                let text = h
                    .target
                    .check(
                        // shell: a constant script; the PID and the gdb budget are numbers passed as "$1" and "$2".
                        &[
                            "sh",
                            "-c",
                            script,
                            "sh",
                            &pid.to_string(),
                            &gdb.map_or(0, |d| d.as_secs().max(1)).to_string(),
                        ],
                        Duration::from_secs(30),
                    )
                    .unwrap_or_else(|e| format!("(stacks unavailable: {e:#})"));
                Some((pid, format!("host {}\n{text}", h.target.name)))
            }
        }
    }

    /// End every rank: remote process groups first (over SSH, bounded), then every local child.
    pub fn kill_all(&mut self) {
        if std::mem::replace(&mut self.killed, true) {
            return;
        }
        if let Some(step) = self.step.as_mut() {
            self.step_problems = step.end();
            return;
        }
        for (i, h) in self.placement.hosts().iter().enumerate() {
            let groups: Vec<String> = self
                .pids_on(i)
                .iter()
                .map(|pid| format!("-{pid}"))
                .collect();
            if !groups.is_empty() {
                // A traced rank leads its own group; its strace (the parent) goes too.
                let script = "for g in \"$@\"; do p=$(ps -o ppid= -p ${g#-} 2>/dev/null); kill -KILL -- $g 2>/dev/null; [ -n \"$TRACED\" ] && [ -n \"$p\" ] && kill -KILL $p 2>/dev/null; done; true";
                let traced = if self.traced { "TRACED=1" } else { "TRACED=" };
                // shell: a constant script; the process groups are numbers passed as arguments.
                let mut args = vec!["env", traced, "sh", "-c", script, "sh"];
                args.extend(groups.iter().map(String::as_str));
                let _ = h.target.run(&args, Duration::from_secs(10));
            }
        }
        for p in &mut self.procs {
            p.stdin.take();
        }
        if self.pgid > 0 {
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGCONT);
        }
        for c in self.procs.iter_mut().filter_map(|p| p.child.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Where rank `rank`'s log is kept here (the stacks the watchdog takes go into it).
    pub fn log_path(&self, rank: u32) -> PathBuf {
        self.log_dir.join(format!("rank-{rank}.log"))
    }

    /// Where rank `rank`'s trace is kept here.
    pub fn trace_path(&self, rank: u32) -> PathBuf {
        self.log_dir.join(format!("rank-{rank}.strace"))
    }

    /// Where a local rank's processes write which calls the perturbation observer delayed
    /// (`PREFIX.<pid>`).
    pub fn perturb_log_prefix(&self, rank: u32) -> PathBuf {
        let dir = std::path::absolute(&self.log_dir).unwrap_or_else(|_| self.log_dir.clone());
        dir.join(format!("rank-{rank}.perturbed"))
    }

    /// Where a local rank's processes write their module maps (`PREFIX.<pid>.maps`), for the
    /// call sites of the sync observer's markers.
    pub fn sync_maps_prefix(&self, rank: u32) -> PathBuf {
        // Absolute: the programs an exec step starts may run in another folder.
        let dir = std::path::absolute(&self.log_dir).unwrap_or_else(|_| self.log_dir.clone());
        dir.join(format!("rank-{rank}"))
    }

    /// Where rank `rank`'s processes write their verbs traces (`PREFIX.<pid>.verbs`), on the
    /// rank's host.
    pub fn verbs_prefix(&self, rank: u32) -> String {
        match self.target(rank) {
            Some(_) => format!("{}/verbs-rank-{rank}", self.remote_dir),
            None => self
                .log_dir
                .join(format!("rank-{rank}"))
                .display()
                .to_string(),
        }
    }

    /// The `qp-error` fault: the verbs observer in each of the rank's processes watches for
    /// `PREFIX.qp-error` and moves its live QPs to the error state when it appears.
    pub fn force_qp_error(&self, rank: u32) -> Result<()> {
        let trigger = format!("{}.qp-error", self.verbs_prefix(rank));
        match self.target(rank) {
            None => std::fs::write(&trigger, b"").with_context(|| format!("creating {trigger}")),
            Some(h) => h
                .target
                .check(&["touch", &trigger], Duration::from_secs(10))
                .map(|_| ()),
        }
    }

    /// Every verbs trace rank `rank`'s processes wrote (none when none touched verbs), as
    /// (local path, text); remote ones are copied here first.
    pub fn fetch_verbs_traces(&self, rank: u32) -> Result<Vec<(PathBuf, String)>> {
        let prefix = self.verbs_prefix(rank);
        if let Some(h) = self.target(rank) {
            let script = "rm -f \"$1\".qp-error; for f in \"$1\".*.verbs; do [ -f \"$f\" ] || continue; echo \"@@@ $f\"; cat \"$f\"; rm -f \"$f\"; done; true";
            let text = h
                .target
                .check(
                    // shell: a constant script; the trace prefix (in the run's private folder) is "$1".
                    &["sh", "-c", script, "sh", &prefix],
                    Duration::from_secs(60),
                )
                .with_context(|| format!("fetching {prefix}.*.verbs from {}", h.target.name))?;
            let mut out: Vec<(PathBuf, String)> = vec![];
            for line in text.lines() {
                if let Some(name) = line.strip_prefix("@@@ ") {
                    let pid = name.rsplit('.').nth(1).unwrap_or("0");
                    out.push((
                        self.log_dir.join(format!("rank-{rank}.{pid}.verbs")),
                        String::new(),
                    ));
                } else if let Some((_, body)) = out.last_mut() {
                    body.push_str(line);
                    body.push('\n');
                }
            }
            for (path, body) in &out {
                std::fs::write(path, body)?;
            }
            return Ok(out);
        }
        let name = format!("rank-{rank}.");
        let mut out = vec![];
        for entry in std::fs::read_dir(&self.log_dir)? {
            let path = entry?.path();
            let file = path.file_name().unwrap_or_default().to_string_lossy();
            if file.starts_with(&name) && file.ends_with(".verbs") {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                out.push((path, text));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Rank `rank`'s trace, copied here first from its host when it ran remotely.
    pub fn fetch_trace(&self, rank: u32) -> Result<String> {
        let local = self.trace_path(rank);
        if let Some(h) = self.target(rank) {
            let remote = self.remote_trace(rank);
            let text = h
                .target
                .check(&["cat", "--", &remote], Duration::from_secs(60))
                .with_context(|| format!("fetching {remote} from {}", h.target.name))?;
            let _ = h
                .target
                .run(&["rm", "-f", "--", &remote], Duration::from_secs(10));
            std::fs::write(&local, &text)?;
            return Ok(text);
        }
        std::fs::read_to_string(&local).with_context(|| format!("reading {}", local.display()))
    }

    /// Rank `rank`'s typed events, where its recorder wrote them (the eBPF recorder's, beside
    /// its trace; kept beside the local copy of the trace). `None` where there are none.
    pub fn fetch_calls(&self, rank: u32) -> Option<Vec<u8>> {
        let local = crate::hosts::syscall_trace::calls_path(&self.trace_path(rank));
        if let Some(h) = self.target(rank) {
            let remote = format!("{}.calls", self.remote_trace(rank));
            // Bytes, not text: `run` hands stdout back as it came.
            let out = h
                .target
                .run(&["cat", "--", &remote], Duration::from_secs(60))
                .ok()
                .filter(|o| o.status.success())?;
            let _ = h
                .target
                .run(&["rm", "-f", "--", &remote], Duration::from_secs(10));
            let _ = std::fs::write(&local, &out.stdout);
            return Some(out.stdout);
        }
        std::fs::read(&local).ok()
    }

    /// Processes of this run still alive after `kill_all` (there must be none): ranks, and
    /// anything in their process groups (the programs exec steps start). Locally the run's
    /// group is read from /proc; on remote hosts from `ps`.
    pub fn leftovers(&self) -> Vec<String> {
        if let Some(step) = &self.step {
            let mut left = self.step_problems.clone();
            left.extend(step.leftovers());
            return left;
        }
        if !self.is_remote() {
            return self.local_leftovers();
        }
        let needle = format!("--rendezvous {}", self.rendezvous);
        (0..self.placement.hosts().len())
            .flat_map(|i| self.placement.leftovers(i, &needle, &self.pids_on(i)))
            .collect()
    }
}

impl RankGroup {
    /// Make (or check) this run's private folder on every remote host, before any rank
    /// writes there.
    fn make_remote_dirs(&self) -> Result<()> {
        for h in self.placement.hosts() {
            h.target
                .check(
                    // shell: a constant script (hosts::private); the folder is "$1".
                    &[
                        "sh",
                        "-c",
                        crate::hosts::private::ENSURE_DIR_SCRIPT,
                        "sh",
                        &self.remote_dir,
                    ],
                    Duration::from_secs(30),
                )
                .with_context(|| {
                    format!(
                        "making the private folder {} on {}",
                        self.remote_dir, h.target.name
                    )
                })?;
        }
        Ok(())
    }

    /// Where a remote rank's syscall trace is written on its host.
    fn remote_trace(&self, rank: impl std::fmt::Display) -> String {
        format!("{}/rank-{rank}.strace", self.remote_dir)
    }

    /// The PIDs (each leads its process group) of the ranks on remote host `host`.
    fn pids_on(&self, host: usize) -> Vec<u32> {
        self.procs
            .iter()
            .enumerate()
            .filter(|(r, _)| self.placement.host_of(*r as u32) == host)
            .filter_map(|(_, p)| p.remote_pid)
            .collect()
    }

    fn local_leftovers(&self) -> Vec<String> {
        if self.pgid <= 0 {
            return vec![];
        }
        let alive = || crate::hosts::procfs::group_members(self.pgid as u32);
        // SIGKILL is delivered at once, but a process leaves the table only once it has exited.
        crate::hosts::procfs::wait_until(|| alive().is_empty(), Duration::from_secs(2));
        alive()
            .into_iter()
            .map(|(pid, cmd)| format!("pid {pid} in the run's process group: {cmd}"))
            .collect()
    }
}

impl Drop for RankGroup {
    fn drop(&mut self) {
        self.kill_all();
        if self.traced || self.verbs {
            for h in self.placement.hosts() {
                let _ = h.target.run(
                    &["rm", "-rf", "--", &self.remote_dir],
                    Duration::from_secs(10),
                );
            }
        }
    }
}

/// The transport bug a `bug-injection` build's tests switch on in the ranks of `scenario`, from
/// `WRINGER_TRANSPORT_BUG`: one bug for every scenario (`late-timer`), or one per scenario
/// (`name:bug,name:bug`; a scenario not named gets none), so that one run (one VM boot) can try
/// several bugs. Only lower-case words, digits and dashes are taken: the bug goes on a remote
/// command line.
pub fn transport_bug(scenario: &str) -> Option<String> {
    bug_for(&std::env::var(TRANSPORT_BUG_ENV).ok()?, scenario)
}

fn bug_for(spec: &str, scenario: &str) -> Option<String> {
    let word = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let bug = if spec.contains(':') {
        spec.split(',')
            .filter_map(|pair| pair.split_once(':'))
            .find(|(name, _)| name.trim() == scenario)
            .map(|(_, bug)| bug.trim())?
    } else {
        spec.trim()
    };
    word(bug).then(|| bug.to_string())
}

#[cfg(test)]
mod tests {
    use super::bug_for;

    #[test]
    fn one_bug_goes_to_every_scenario_and_a_list_names_each_scenarios_own() {
        assert_eq!(bug_for("late-timer", "any").as_deref(), Some("late-timer"));
        let list = "shutdown-a:destroy-with-receives-posted, shutdown-b:dereg-under-posted-receive";
        assert_eq!(
            bug_for(list, "shutdown-b").as_deref(),
            Some("dereg-under-posted-receive")
        );
        assert_eq!(
            bug_for(list, "shutdown-a").as_deref(),
            Some("destroy-with-receives-posted")
        );
        assert_eq!(bug_for(list, "shutdown"), None);
        assert_eq!(bug_for("", "any"), None);
        // Nothing that a remote shell would read as more than one word.
        assert_eq!(bug_for("late-timer; reboot", "any"), None);
        assert_eq!(bug_for("a:b c", "a"), None);
    }
}
