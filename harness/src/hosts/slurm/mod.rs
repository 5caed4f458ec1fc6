//! Slurm as a launcher. Inside an allocation (`SLURM_JOB_ID` set, as in a nightly `sbatch`
//! script) wringer uses it; outside one it obtains one with `salloc`, bounded, and releases it
//! on every exit path: the allocation is held by a `salloc` whose command reads our pipe, so
//! even a killed coordinator closes the pipe and Slurm takes the allocation back.
//!
//! Each repeat's ranks are one job step (`srun`, one task per rank, see the launcher); this
//! module is the scheduler side: the allocation, small steps on one node (`on_node`), and the
//! step table (`squeue`, `scancel`).

pub mod cluster;
pub mod profile;

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::hosts::child::{output_within, ToolFailed};
use profile::{Nodes, SlurmSpec};

const CLIENT_LIMIT: Duration = Duration::from_secs(30);

/// The line a Slurm task's supervisor prints when its rank ends: the raw wait status follows.
pub const EXIT_MARKER: &str = "@wringer-rank-exit ";

/// How ranks place themselves on the step's nodes; the coordinator's `host_of` uses the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Rank r on node r % nodes (`--distribution=cyclic`).
    Cyclic,
    /// Rank r on node r / n (`--distribution=block --ntasks-per-node=n`).
    Block(u32),
}

impl Layout {
    pub fn node_of(self, rank: u32, nodes: usize) -> usize {
        match self {
            Layout::Cyclic => rank as usize % nodes.max(1),
            Layout::Block(n) => (rank / n.max(1)) as usize,
        }
    }

    /// How many nodes a step of `ranks` ranks uses.
    pub fn nodes_for(self, ranks: u32, allocated: usize) -> usize {
        match self {
            Layout::Cyclic => (ranks as usize).min(allocated),
            Layout::Block(n) => ranks.div_ceil(n.max(1)) as usize,
        }
    }

    /// As the rank's `--slurm` argument gives it.
    pub fn arg(self) -> String {
        match self {
            Layout::Cyclic => "cyclic".into(),
            Layout::Block(n) => format!("block:{n}"),
        }
    }

    pub fn parse(s: &str) -> Option<Layout> {
        match s.split_once(':') {
            None if s == "cyclic" => Some(Layout::Cyclic),
            Some(("block", n)) => n.parse().ok().filter(|n| *n > 0).map(Layout::Block),
            _ => None,
        }
    }
}

/// What ranks bind to on each node.
#[derive(Clone, Debug)]
pub enum BindRule {
    /// One address per node of the allocation, in its order (the test cluster's data network).
    PerNode(Vec<IpAddr>),
    /// The IPv4 address of this interface, read on the node.
    Interface(String),
    /// The address the node's own name resolves to there.
    NodeName,
}

/// The run's allocation and how to reach the cluster's clients.
pub struct Slurm {
    /// Set for the clients (the test cluster's `SLURM_CONF`); empty for the caller's cluster.
    env: Vec<(String, String)>,
    /// The job now holding the allocation (renewed when a host fault has taken a node).
    job: Mutex<String>,
    /// The allocation's nodes, in Slurm's order (the order of `SLURM_NODEID`).
    pub nodes: Vec<String>,
    /// The `salloc` holding an allocation we obtained (None: the caller's allocation), and
    /// the pipe its command reads: closing it releases the allocation.
    holder: Mutex<Option<(Child, ChildStdin)>>,
    /// What `salloc` is asked, and how long it may wait (None: the caller's allocation).
    salloc: Option<(Vec<String>, u32)>,
    /// Held while an allocation is obtained again.
    renewing: Mutex<()>,
    /// Steps and the job are named after the run, so its leftovers can be told apart.
    pub run_name: String,
    /// This build of wringer, as the nodes see it.
    pub exe: String,
    pub bind: BindRule,
    pub layout: Layout,
    pub srun_options: Vec<String>,
    pub time_limit_minutes: u64,
    /// The tasks' working folder on the nodes (default: srun's, this folder on a shared
    /// filesystem; the test cluster's nodes have none of ours).
    pub chdir: Option<String>,
}

impl std::fmt::Debug for Slurm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slurm job {} on {}", self.job(), self.nodes.join(","))
    }
}

impl Slurm {
    /// Use the caller's allocation, or obtain one within the profile's wait. `env` is what the
    /// clients need (the test cluster's configuration), `cluster_own` whether the allocation
    /// must come from that cluster even inside another allocation.
    pub fn obtain(
        spec: &SlurmSpec,
        env: Vec<(String, String)>,
        run_id: &str,
        test_cluster: bool,
    ) -> Result<Slurm> {
        let run_name = format!("wringer-{run_id}");
        let layout = spec
            .tasks_per_node
            .as_ref()
            .map_or(Layout::Cyclic, |t| Layout::Block(t.value));
        let exe = match &spec.exe {
            Some(e) => e.value.clone(),
            None => std::env::current_exe()?.to_string_lossy().into_owned(),
        };
        let bind = match &spec.data_interface {
            Some(i) => BindRule::Interface(i.value.clone()),
            None => BindRule::NodeName,
        };
        let mut slurm = Slurm {
            env,
            job: Mutex::new(String::new()),
            nodes: vec![],
            holder: Mutex::new(None),
            salloc: None,
            renewing: Mutex::new(()),
            run_name,
            exe,
            bind,
            layout,
            srun_options: spec.srun_options.iter().map(|o| o.value.clone()).collect(),
            time_limit_minutes: spec.time_limit_minutes(),
            chdir: None,
        };
        match std::env::var("SLURM_JOB_ID") {
            Ok(job) if !test_cluster && !job.is_empty() => {
                *slurm.job.lock().unwrap_or_else(|p| p.into_inner()) = job;
            }
            _ => {
                slurm.salloc = Some((salloc_args(spec, &slurm.run_name), spec.allocation_wait_s));
                slurm.allocate()?;
            }
        }
        slurm.nodes = slurm.job_nodes()?;
        if slurm.nodes.len() < spec.node_count() {
            bail!(
                "the allocation (job {}) has {} nodes ({}); the profile asks for {}",
                slurm.job(),
                slurm.nodes.len(),
                slurm.nodes.join(","),
                spec.node_count()
            );
        }
        Ok(slurm)
    }

    /// The job holding the allocation now.
    pub fn job(&self) -> String {
        self.job.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The running job's nodes, in Slurm's order.
    fn job_nodes(&self) -> Result<Vec<String>> {
        let job = self.job();
        let list = self.check(&["squeue", "--noheader", "--jobs", &job, "--format=%T %N"])?;
        let (state, nodelist) = list
            .trim()
            .split_once(' ')
            .with_context(|| format!("job {job} is not in squeue: `{}`", list.trim()))?;
        if state != "RUNNING" {
            bail!("job {job} is {state}, not RUNNING");
        }
        Ok(self
            .check(&["scontrol", "show", "hostnames", nodelist])?
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// Before each repeat: the allocation must still hold every node. A host fault can take
    /// one (Slurm drops a node it lost from the job); an allocation we obtained is then
    /// released and obtained again, the caller's is an error.
    pub fn ensure_standing(&self) -> Result<()> {
        if self.ensure_allocated()? {
            return Ok(());
        }
        match self.job_nodes() {
            Ok(nodes) if nodes == self.nodes => return Ok(()),
            Ok(_) | Err(_) if self.salloc.is_none() => bail!(
                "the allocation (job {}) no longer holds {}",
                self.job(),
                self.nodes.join(",")
            ),
            _ => {}
        }
        self.release();
        self.ensure_allocated().map(|_| ())
    }

    /// An allocation of ours that was released (after a host fault) is obtained again before
    /// anything uses it; true when it was.
    fn ensure_allocated(&self) -> Result<bool> {
        let _one_at_a_time = self.renewing.lock().unwrap_or_else(|p| p.into_inner());
        let released = self.salloc.is_some()
            && self
                .holder
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none();
        if !released {
            return Ok(false);
        }
        self.allocate()?;
        let nodes = self.job_nodes()?;
        if nodes != self.nodes {
            bail!(
                "the new allocation (job {}) holds {}, not {}",
                self.job(),
                nodes.join(","),
                self.nodes.join(",")
            );
        }
        Ok(true)
    }

    /// `salloc` holding an allocation until our pipe closes; its command prints the job id.
    fn allocate(&self) -> Result<()> {
        let Some((args, wait)) = &self.salloc else {
            bail!("no allocation to obtain: the caller's is used");
        };
        let mut cmd = self.client("salloc");
        cmd.args(args);
        cmd.args([
            // shell: a constant script (salloc's command), no value in it.
            "--",
            "sh",
            "-c",
            "echo \"wringer-job $SLURM_JOB_ID\"; exec cat >/dev/null",
        ]);
        use std::os::unix::process::CommandExt;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: a Ctrl-C meant for us must not reach it (we release it ourselves).
            .process_group(0)
            .spawn()
            .context("starting salloc (install Debian's slurm-client)")?;
        let stdin = child.stdin.take().expect("piped");
        let (tx, rx) = crossbeam_channel::bounded(1);
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(job) = line.strip_prefix("wringer-job ") {
                    let _ = tx.send(job.trim().to_string());
                }
            }
        });
        let stderr = child.stderr.take().expect("piped");
        let said = std::sync::Arc::new(Mutex::new(String::new()));
        let said2 = std::sync::Arc::clone(&said);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut s = said2.lock().unwrap_or_else(|p| p.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        let limit = Duration::from_secs(*wait as u64 + 10);
        let deadline = Instant::now() + limit;
        let job = loop {
            if let Ok(job) = rx.recv_timeout(Duration::from_millis(50)) {
                break job;
            }
            let gone = child.try_wait()?.is_some();
            if gone || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(50));
                let said = said.lock().unwrap_or_else(|p| p.into_inner()).clone();
                bail!(
                    "no allocation within {limit:?} (salloc {}): {}",
                    if gone { "exited" } else { "still waiting" },
                    said.trim()
                );
            }
        };
        *self.job.lock().unwrap_or_else(|p| p.into_inner()) = job;
        *self.holder.lock().unwrap_or_else(|p| p.into_inner()) = Some((child, stdin));
        Ok(())
    }

    /// A Slurm client command, with the cluster's environment.
    pub fn client(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// Run a client to completion (bounded); its stdout, or an error quoting its stderr.
    pub fn check(&self, words: &[&str]) -> Result<String> {
        let mut cmd = self.client(words[0]);
        cmd.args(&words[1..]);
        let out = output_within(&mut cmd, None, CLIENT_LIMIT)
            .with_context(|| format!("`{}`", words.join(" ")))?;
        if !out.status.success() {
            return Err(ToolFailed {
                command: words.join(" "),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            }
            .into());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Run `words` on one node of the allocation, as a small step beside the ranks' own.
    pub fn on_node(&self, node: &str, words: &[&str], limit: Duration) -> Result<Output> {
        self.ensure_allocated()?;
        let mut cmd = self.client("srun");
        cmd.arg(format!("--jobid={}", self.job()))
            .arg(format!("--job-name={}-ctl", self.run_name))
            .arg(format!("--nodelist={node}"))
            .args(["--nodes=1", "--ntasks=1", "--overlap", "--quiet"])
            .args(self.chdir.iter().map(|d| format!("--chdir={d}")))
            .arg(format!("--time={}", limit.as_secs().div_ceil(60).max(1)))
            .arg("--")
            .args(words);
        output_within(&mut cmd, None, limit)
            .with_context(|| format!("{node}: `{}`", words.join(" ")))
    }

    /// Our steps named `name`, as `JOB.STEP` ids, in any job (an allocation renewed after a
    /// host fault has a new job id; the step names carry the run and the attempt).
    pub fn steps_named(&self, name: &str) -> Result<Vec<String>> {
        let table = self.check(&["squeue", "--steps", "--me", "--noheader", "--format=%i %j"])?;
        Ok(table
            .lines()
            .filter_map(|l| l.trim().split_once(' '))
            .filter(|(_, n)| *n == name)
            .map(|(id, _)| id.to_string())
            .collect())
    }

    /// Cancel these steps (their tasks are killed); errors are for the caller to report. A step
    /// that ended between listing and cancelling is not one ("Invalid job id").
    pub fn cancel(&self, steps: &[String]) -> Result<()> {
        if steps.is_empty() {
            return Ok(());
        }
        let mut words = vec!["scancel", "--quiet"];
        words.extend(steps.iter().map(String::as_str));
        match self.check(&words) {
            Err(e) if ToolFailed::says(&e, "Invalid job id specified") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Release an allocation we obtained: close the holder's pipe (salloc then gives it back
    /// itself), and cancel the job if salloc has not within a few seconds.
    pub fn release(&self) {
        let Some((mut child, stdin)) = self.holder.lock().unwrap_or_else(|p| p.into_inner()).take()
        else {
            return;
        };
        drop(stdin);
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if child.try_wait().ok().flatten().is_none() {
            let _ = self.check(&["scancel", "--quiet", &self.job()]);
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// What wringer asks `salloc` for (the command that holds the allocation follows).
fn salloc_args(spec: &SlurmSpec, run_name: &str) -> Vec<String> {
    let mut args = vec![
        format!("--job-name={run_name}"),
        format!("--time={}", spec.time_limit.value),
        format!("--immediate={}", spec.allocation_wait_s),
        // A host fault on one node must not end the allocation for the repeats after it.
        "--no-kill".into(),
        // Whole nodes: a step of any size up to the nodes' CPUs fits, and no other job shares
        // the hosts that faults strike.
        "--exclusive".into(),
    ];
    match &spec.nodes.value {
        Nodes::Count(n) => args.push(format!("--nodes={n}")),
        Nodes::List(l) => {
            args.push(format!("--nodes={}", spec.node_count()));
            args.push(format!("--nodelist={l}"));
        }
    }
    for (flag, v) in [
        ("partition", &spec.partition),
        ("account", &spec.account),
        ("qos", &spec.qos),
    ] {
        if let Some(v) = v {
            args.push(format!("--{flag}={}", v.value));
        }
    }
    args.extend(spec.allocation_options());
    args
}

impl Drop for Slurm {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_place_ranks_as_srun_distributes_them() {
        // cyclic: round-robin over the step's nodes, like the SSH fan-out.
        assert_eq!(
            (0..8)
                .map(|r| Layout::Cyclic.node_of(r, 3))
                .collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2, 0, 1]
        );
        assert_eq!(Layout::Cyclic.nodes_for(2, 3), 2);
        assert_eq!(Layout::Cyclic.nodes_for(64, 3), 3);
        // block: N per node, in order.
        let b = Layout::Block(4);
        assert_eq!(
            (0..9).map(|r| b.node_of(r, 3)).collect::<Vec<_>>(),
            [0, 0, 0, 0, 1, 1, 1, 1, 2]
        );
        assert_eq!(b.nodes_for(9, 3), 3);
        assert_eq!(
            b.nodes_for(13, 3),
            4,
            "more nodes than allocated is for the caller to refuse"
        );
    }

    #[test]
    fn a_layout_survives_the_command_line() {
        for l in [Layout::Cyclic, Layout::Block(1), Layout::Block(22)] {
            assert_eq!(Layout::parse(&l.arg()), Some(l));
        }
        for bad in ["", "block", "block:0", "block:x", "cyclic:2", "plane:4"] {
            assert_eq!(Layout::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn salloc_is_asked_for_what_the_profile_says_and_no_more() {
        let text = "partition: batch\naccount: acct\nqos: high\nnodes: \"gpu[01-02]\"\ntime_limit: \"1:00:00\"\nsrun_options: [\"--gres=gpu:1\", \"--mpi=pmix\"]\n";
        let path = std::path::Path::new("s.yaml");
        let spec: SlurmSpec = crate::model::input::parse_yaml(path, text).unwrap();
        spec.check(path).unwrap();
        let args = salloc_args(&spec, "wringer-x");
        for want in [
            "--job-name=wringer-x",
            "--time=1:00:00",
            "--no-kill",
            "--exclusive",
            "--nodes=2",
            "--nodelist=gpu[01-02]",
            "--partition=batch",
            "--account=acct",
            "--qos=high",
            "--gres=gpu:1",
        ] {
            assert!(
                args.iter().any(|a| a == want),
                "{want} missing from {args:?}"
            );
        }
        // An option of the step alone (`--mpi`) is not the allocation's.
        assert!(!args.iter().any(|a| a.starts_with("--mpi")), "{args:?}");
    }
}
