//! One repeat's ranks as one Slurm job step: `srun`, one task per rank, run from here.
//!
//! - The run token goes to every task on stdin (`--input=all`), never on a command line or in
//!   the job's environment; when srun's stdin closes (we are gone), every rank exits.
//! - Output comes back labelled by task (`--label`) and is split into the rank logs.
//! - Each task is a small supervisor around the rank (`wringer rank --slurm`), which prints
//!   the rank's exit status as a marker line, so a rank's end is known when it happens, not
//!   when the whole step ends. For the lifecycle audit it runs the rank under strace; the
//!   traces are fetched from the nodes like SSH hosts' (through `srun --overlap`).
//! - Cancelled with `scancel` on every exit path; srun itself dies with the coordinator
//!   (PR_SET_PDEATHSIG, set by the launcher), which closes the tasks' stdin.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::hosts::slurm::{BindRule, Slurm, EXIT_MARKER};
use crate::rank::protocol::TRANSPORT_BUG_ENV;

/// How long the step may take to leave the scheduler's table once cancelled.
pub const GONE_WITHIN: Duration = Duration::from_secs(5);

/// What a Slurm step needs to know of the attempt.
pub struct StepLimits {
    pub deadline: Duration,
    /// Faults strike ranks or hosts: a rank's bad exit must not end the others.
    pub faults: bool,
    /// The transport bug a `bug-injection` build's tests switch on in every rank (see
    /// [`crate::orchestration::launcher::transport_bug`]).
    pub transport_bug: Option<String>,
}

pub struct SlurmStep {
    srun: Child,
    stdin: Option<ChildStdin>,
    slurm: Arc<Slurm>,
    /// The step's name: the run's, plus the rendezvous port (unique per attempt).
    pub name: String,
    exits: Arc<Mutex<Vec<Option<ExitStatus>>>>,
    readers: Vec<JoinHandle<()>>,
    ended: bool,
}

impl SlurmStep {
    /// Launch `ranks` ranks as one step; logs in `logs` (one per rank).
    pub fn launch(
        slurm: &Arc<Slurm>,
        ranks: u32,
        rendezvous: SocketAddr,
        token: &str,
        logs: Vec<File>,
        limits: StepLimits,
        trace: Option<&[String]>,
    ) -> Result<SlurmStep> {
        let (deadline, kill_on_bad_exit) = (limits.deadline, !limits.faults);
        let nodes = slurm.layout.nodes_for(ranks, slurm.nodes.len());
        if nodes > slurm.nodes.len() {
            bail!(
                "{ranks} ranks at {} need {nodes} nodes; the allocation has {}",
                slurm.layout.arg(),
                slurm.nodes.len()
            );
        }
        slurm.ensure_standing()?;
        let name = format!("{}-{}", slurm.run_name, rendezvous.port());
        let mut cmd = slurm.client("srun");
        // srun hands its environment to the tasks: the resolved bug, never the run's list.
        match &limits.transport_bug {
            Some(b) => cmd.env(TRANSPORT_BUG_ENV, b),
            None => cmd.env_remove(TRANSPORT_BUG_ENV),
        };
        cmd.arg(format!("--jobid={}", slurm.job()))
            .arg(format!("--job-name={name}"))
            .arg(format!("--nodes={nodes}"))
            .arg(format!("--nodelist={}", slurm.nodes[..nodes].join(",")))
            .arg(format!("--ntasks={ranks}"))
            .args(["--input=all", "--label", "--unbuffered", "--overlap"])
            // The step's own time limit: the attempt's deadline, rounded up, plus a minute.
            .arg(format!("--time={}", deadline.as_secs().div_ceil(60) + 1))
            .arg(format!(
                "--kill-on-bad-exit={}",
                if kill_on_bad_exit { 1 } else { 0 }
            ));
        match slurm.layout {
            crate::hosts::slurm::Layout::Cyclic => cmd.arg("--distribution=cyclic"),
            crate::hosts::slurm::Layout::Block(n) => cmd
                .arg("--distribution=block")
                .arg(format!("--ntasks-per-node={n}")),
        };
        if !kill_on_bad_exit {
            // A rank a fault kills, or a host a fault takes, must not end the survivors: they
            // are the evidence.
            cmd.arg("--no-kill");
        }
        cmd.args(slurm.chdir.iter().map(|d| format!("--chdir={d}")));
        cmd.args(&slurm.srun_options);
        cmd.args([
            "--",
            &slurm.exe,
            "rank",
            "--rendezvous",
            &rendezvous.to_string(),
            "--slurm",
            &slurm.layout.arg(),
            "--token-stdin",
        ]);
        match &slurm.bind {
            BindRule::PerNode(addrs) => {
                let list: Vec<String> = addrs[..nodes].iter().map(|a| a.to_string()).collect();
                cmd.arg(format!("--bind-per-node={}", list.join(",")));
            }
            BindRule::Interface(i) => {
                cmd.arg(format!("--bind-interface={i}"));
            }
            BindRule::NodeName => {}
        }
        // `=` keeps a word that starts with `-` a value.
        cmd.args(
            trace
                .unwrap_or_default()
                .iter()
                .map(|w| format!("--trace-word={w}")),
        );
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent: srun dies
        // with the coordinator's spawning thread, which closes every task's stdin.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut srun = cmd.spawn().context("starting srun")?;
        let mut stdin = srun.stdin.take().expect("piped");
        writeln!(stdin, "{token}").context("handing the run token to srun")?;
        let logs: Arc<Vec<Mutex<File>>> = Arc::new(logs.into_iter().map(Mutex::new).collect());
        let exits = Arc::new(Mutex::new(vec![None; ranks as usize]));
        let readers = [
            Box::new(srun.stdout.take().expect("piped")) as Box<dyn std::io::Read + Send>,
            Box::new(srun.stderr.take().expect("piped")),
        ]
        .into_iter()
        .map(|pipe| {
            let (logs, exits) = (Arc::clone(&logs), Arc::clone(&exits));
            std::thread::spawn(move || demux(pipe, &logs, &exits))
        })
        .collect();
        Ok(SlurmStep {
            srun,
            stdin: Some(stdin),
            slurm: Arc::clone(slurm),
            name,
            exits,
            readers,
            ended: false,
        })
    }

    /// Rank `rank`'s exit, once its supervisor has reported it, or once srun has ended (a rank
    /// whose supervisor never reported then gets srun's status).
    pub fn try_wait(&mut self, rank: usize) -> Option<ExitStatus> {
        if !self.ended {
            if let Ok(Some(status)) = self.srun.try_wait() {
                self.ended = true;
                // Every line srun printed is read before the missing exits are filled in.
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                let mut exits = self.exits.lock().unwrap_or_else(|p| p.into_inner());
                for e in exits.iter_mut().filter(|e| e.is_none()) {
                    *e = Some(if status.success() {
                        // srun succeeded without the marker: the supervisor died silently.
                        ExitStatus::from_raw(1 << 8)
                    } else {
                        status
                    });
                }
            }
        }
        self.exits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(rank)
            .copied()
            .flatten()
    }

    /// Cancel the step and end srun; every call after the first does nothing.
    pub fn end(&mut self) -> Vec<String> {
        let mut problems = vec![];
        if !self.ended {
            match self.slurm.steps_named(&self.name) {
                Ok(ids) => {
                    if let Err(e) = self.slurm.cancel(&ids) {
                        problems.push(format!("scancel {}: {e:#}", ids.join(" ")));
                    }
                }
                Err(e) => problems.push(format!("listing the step's id: {e:#}")),
            }
        }
        self.stdin.take();
        let deadline = Instant::now() + GONE_WITHIN;
        while self.srun.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: signals the process group made for this srun alone.
        unsafe { libc::killpg(self.srun.id() as i32, libc::SIGKILL) };
        let _ = self.srun.wait();
        self.ended = true;
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        problems
    }

    /// The step as the scheduler still shows it, waited for up to [`GONE_WITHIN`]: a step of
    /// this run still listed then is a leftover.
    pub fn leftovers(&self) -> Vec<String> {
        let deadline = Instant::now() + GONE_WITHIN;
        loop {
            match self.slurm.steps_named(&self.name) {
                Ok(ids) if ids.is_empty() => return vec![],
                Ok(ids) if Instant::now() > deadline => {
                    return ids
                        .iter()
                        .map(|id| {
                            format!(
                                "Slurm step {id} ({}) still in squeue {GONE_WITHIN:?} after it was cancelled",
                                self.name
                            )
                        })
                        .collect()
                }
                Err(e) if Instant::now() > deadline => {
                    return vec![format!("could not list the job's steps: {e:#}")]
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for SlurmStep {
    fn drop(&mut self) {
        self.end();
    }
}

/// Route srun's labelled lines (`  3: text`) to the rank logs, and its own lines (`srun: ...`)
/// to every rank log; an exit marker records that rank's end.
fn demux(
    pipe: Box<dyn std::io::Read + Send>,
    logs: &[Mutex<File>],
    exits: &Mutex<Vec<Option<ExitStatus>>>,
) {
    for line in BufReader::new(pipe).lines().map_while(Result::ok) {
        match labelled(&line) {
            Some((rank, text)) if rank < logs.len() => {
                if let Some(raw) = text.strip_prefix(EXIT_MARKER) {
                    if let Ok(raw) = raw.trim().parse::<i32>() {
                        let mut e = exits.lock().unwrap_or_else(|p| p.into_inner());
                        e[rank].get_or_insert(ExitStatus::from_raw(raw));
                        continue;
                    }
                }
                let mut f = logs[rank].lock().unwrap_or_else(|p| p.into_inner());
                let _ = writeln!(f, "{text}");
            }
            _ => {
                for f in logs {
                    let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = writeln!(f, "{line}");
                }
            }
        }
    }
}

/// `  3: text` → (3, "text").
fn labelled(line: &str) -> Option<(usize, &str)> {
    let (label, text) = line.trim_start().split_once(": ")?;
    Some((label.parse().ok()?, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labelled_lines_go_to_their_rank() {
        assert_eq!(labelled(" 3: hello: world"), Some((3, "hello: world")));
        assert_eq!(labelled("12: x"), Some((12, "x")));
        assert_eq!(labelled("srun: error: n1: task 1: Killed"), None);
        assert_eq!(labelled("no label"), None);
    }

    #[test]
    fn markers_record_exits_and_other_lines_reach_the_logs() {
        let dir = std::env::temp_dir().join(format!("wringer-demux-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths: Vec<_> = (0..2).map(|r| dir.join(format!("r{r}"))).collect();
        let logs: Vec<Mutex<File>> = paths
            .iter()
            .map(|p| Mutex::new(File::create(p).unwrap()))
            .collect();
        let exits = Mutex::new(vec![None, None]);
        let text = format!(
            "0: joined\n1: {EXIT_MARKER}9\nsrun: error: h1: task 1: Killed\n0: {EXIT_MARKER}0\n 5: out of range\n"
        );
        demux(Box::new(std::io::Cursor::new(text)), &logs, &exits);
        let e = exits.lock().unwrap();
        assert!(e[0].unwrap().success());
        assert_eq!(e[1].unwrap().signal(), Some(9));
        let log0 = std::fs::read_to_string(&paths[0]).unwrap();
        let log1 = std::fs::read_to_string(&paths[1]).unwrap();
        assert!(log0.starts_with("joined\n"), "{log0}");
        assert!(log0.contains("srun: error: h1: task 1: Killed"));
        assert!(log1.contains("srun: error") && !log1.contains("joined"));
        assert!(log0.contains(" 5: out of range"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
