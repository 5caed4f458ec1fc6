//! A real Slurm cluster for the tests, in containers: `slurmctld` and N `slurmd` nodes from the
//! locally built image (`just setup-slurm`), on the container hosts' private networks, with a
//! munge key made for this run. No cgroups: Slurm tracks processes with linuxproc. This machine
//! is the login node: its own `munged` (the run's key, a socket in the run's folder) and a
//! `slurm.conf` naming that socket let `srun`, `salloc`, `squeue` and `scancel` here reach it.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::hosts::containers::ContainerHosts;

const T: Duration = Duration::from_secs(60);

pub struct TestCluster {
    /// The nodes (host i is node i), then the controller, last.
    pub hosts: Arc<ContainerHosts>,
    pub nodes: usize,
    /// The clients' environment here (`SLURM_CONF`).
    pub env: Vec<(String, String)>,
    dir: PathBuf,
    /// This machine's munged, with the run's key.
    munged: Option<LocalMunged>,
}

impl TestCluster {
    pub fn start(nodes: u32, image: &str, partition: &str, run_id: &str) -> Result<TestCluster> {
        if crate::hosts::containers::docker(&["image", "inspect", image], T).is_err() {
            bail!("the image {image} is not built here: run `just setup-slurm` (there is no registry to pull from)");
        }
        for tool in ["munged", "srun"] {
            if !crate::hosts::programs::runnable(tool) {
                bail!("`{tool}` is not installed here: the test cluster's login node is this machine (install Debian's munge and slurm-client, or run `just setup-slurm`)");
            }
        }
        let hosts = Arc::new(ContainerHosts::start(nodes + 1, image, run_id, &[])?);
        hosts.wait_ssh(T)?;
        let dir = std::env::temp_dir().join(format!("wringer-slurm-{run_id}"));
        // munged insists that every folder above its socket can be searched by all.
        std::fs::create_dir_all(dir.join("munge"))?;
        set_mode(&dir, 0o755)?;
        set_mode(&dir.join("munge"), 0o755)?;
        let key = dir.join("munge.key");
        let mut bytes = vec![0u8; 1024];
        getrandom(&mut bytes)?;
        std::fs::write(&key, &bytes)?;
        set_mode(&key, 0o400)?;
        let ctl = &hosts.hosts[nodes as usize];
        let node_names: Vec<String> = (0..nodes).map(|i| format!("h{i}")).collect();
        let mut conf = format!(
            "# Made by wringer for run {run_id}.\n\
             ClusterName=wringer\n\
             SlurmctldHost=h{nodes}({ctl_ip})\n\
             SlurmUser=root\nSlurmdUser=root\n\
             AuthType=auth/munge\nCredType=cred/munge\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
             StateSaveLocation=/var/spool/slurmctld\nSlurmdSpoolDir=/var/spool/slurmd\n\
             SlurmctldPidFile=/run/slurmctld.pid\nSlurmdPidFile=/run/slurmd.pid\n\
             SlurmctldLogFile=/var/log/slurmctld.log\nSlurmdLogFile=/var/log/slurmd.log\n\
             AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n\
             JobCompType=jobcomp/none\nMpiDefault=none\n\
             # A node back from a host fault serves again as soon as its slurmd registers.\n\
             ReturnToService=2\nSlurmdTimeout=30\nSlurmctldTimeout=30\n\
             # Cancelled tasks get SIGKILL 1 s after SIGTERM.\n\
             KillWait=1\nMessageTimeout=10\nInactiveLimit=0\n\
             # The containers share this machine's CPUs; 64 slots each let 64 ranks start.\n\
             SlurmdParameters=config_overrides\n",
            ctl_ip = ctl.ctl_ip
        );
        for (i, name) in node_names.iter().enumerate() {
            conf.push_str(&format!(
                "NodeName={name} NodeAddr={} CPUs=64 State=UNKNOWN\n",
                hosts.hosts[i].ctl_ip
            ));
        }
        conf.push_str(&format!(
            "PartitionName={partition} Nodes={} Default=YES MaxTime=INFINITE State=UP\n",
            node_names.join(",")
        ));
        let conf_path = dir.join("slurm-nodes.conf");
        std::fs::write(&conf_path, &conf)?;
        let here = dir.join("slurm.conf");
        std::fs::write(
            &here,
            format!(
                "{conf}AuthInfo=socket={}\n",
                dir.join("munge/munge.sock").display()
            ),
        )?;
        let mut cluster = TestCluster {
            hosts,
            nodes: nodes as usize,
            env: vec![("SLURM_CONF".into(), here.to_string_lossy().into_owned())],
            dir,
            munged: None,
        };
        for i in 0..=cluster.nodes {
            let t = cluster.hosts.target(i);
            let put = |file: &PathBuf, dest: &str, owner: &str, mode: &str| {
                t.run(
                    // shell: a constant script; destination, owner and mode are "$1" to "$3".
                    &[
                        "sh",
                        "-c",
                        "mkdir -p \"$(dirname \"$1\")\" && cat > \"$1\" && chown \"$2\" \"$1\" && chmod \"$3\" \"$1\"",
                        "sh",
                        dest,
                        owner,
                        mode,
                    ],
                    Some(file),
                    T,
                )
                .and_then(|o| {
                    if o.status.success() {
                        Ok(())
                    } else {
                        bail!("{}: {}", t.name, String::from_utf8_lossy(&o.stderr).trim())
                    }
                })
            };
            put(&key, "/etc/munge/munge.key", "munge:munge", "400")?;
            put(&conf_path, "/etc/slurm/slurm.conf", "root:root", "644")?;
        }
        cluster.munged = Some(cluster.start_local_munged(&key)?);
        cluster.start_daemons()?;
        cluster.wait_nodes_up(T)?;
        Ok(cluster)
    }

    /// A Slurm client command here, pointed at this cluster.
    fn client(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// The data-network address of each node, in node order.
    pub fn data_addrs(&self) -> Vec<IpAddr> {
        self.hosts.hosts[..self.nodes]
            .iter()
            .map(|h| h.data_ip)
            .collect()
    }

    /// After host faults: start the daemons of every container that was restarted, and have
    /// slurmctld forget what ran on those nodes (down, then resumed). Returns those nodes: a
    /// step that ran on one waits for tasks that no longer exist until its job ends.
    pub fn recover(&self) -> Result<Vec<usize>> {
        let restarted = self.start_daemons()?;
        for node in restarted.iter().filter(|i| **i < self.nodes) {
            let name = format!("NodeName=h{node}");
            for state in ["State=DOWN", "State=RESUME"] {
                let mut cmd = self.client("scontrol");
                cmd.args(["update", &name, state, "Reason=wringer-host-fault"]);
                let out = crate::hosts::child::output_within(&mut cmd, None, T)?;
                let said = String::from_utf8_lossy(&out.stderr);
                // A registered slurmd may return the node to service by itself
                // (ReturnToService=2) before the resume: then there is nothing to resume.
                let resumed_by_itself =
                    state == "State=RESUME" && said.contains("Invalid node state");
                if !out.status.success() && !resumed_by_itself {
                    bail!("scontrol update {name} {state}: {}", said.trim());
                }
            }
        }
        self.wait_nodes_up(T)?;
        Ok(restarted)
    }

    /// Start munged and the Slurm daemon on every container where they are not running (all
    /// at first; after a host fault, those of a restarted container). Returns the containers
    /// whose Slurm daemon it started.
    pub fn start_daemons(&self) -> Result<Vec<usize>> {
        let mut started = vec![];
        for i in 0..=self.nodes {
            let daemon = if i == self.nodes {
                "slurmctld"
            } else {
                "slurmd"
            };
            let script = "mkdir -p /run/munge /var/spool/slurmctld /var/spool/slurmd /var/log/munge && \
                          chown munge:munge /run/munge /var/log/munge && \
                          { pidof munged >/dev/null || runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1; } && \
                          if pidof \"$1\" >/dev/null; then echo running; else \"$1\" </dev/null >/dev/null 2>&1 && echo started; fi";
            let said = self
                .hosts
                .target(i)
                // shell: a constant script; the daemon's name is "$1".
                .check(&["sh", "-c", script, "sh", daemon], T)
                .with_context(|| format!("starting {daemon}"))?;
            if said.trim() == "started" {
                started.push(i);
            }
        }
        Ok(started)
    }

    /// Wait (bounded) until every node is up in slurmctld's view.
    pub fn wait_nodes_up(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        loop {
            let mut sinfo = self.client("sinfo");
            sinfo.args(["--noheader", "--Node", "--format=%N %T"]);
            // Bounded: a controller that does not answer must not hold the wait past its limit.
            let out = crate::hosts::child::output_within(&mut sinfo, None, Duration::from_secs(10));
            if let Ok(o) = out {
                last = format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
                let states: Vec<&str> = last
                    .lines()
                    .filter_map(|l| l.split_whitespace().nth(1))
                    .collect();
                let serving = |s: &&str| {
                    let s = s.trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-']);
                    matches!(s, "idle" | "allocated" | "mixed" | "completing")
                };
                if states.len() == self.nodes && states.iter().all(serving) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the test cluster's nodes did not come up within {limit:?}: {}",
                    last.trim()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// munged here, under a small shell that outlives us by 3 s: a killed coordinator's
    /// salloc still needs munged to give its allocation back. The shell reads our pipe; at its
    /// end (we are gone) it waits, then ends munged. A normal end stops the whole group.
    fn start_local_munged(&self, key: &std::path::Path) -> Result<LocalMunged> {
        use std::os::unix::process::CommandExt;
        let socket = self.dir.join("munge/munge.sock");
        // shell: a constant script; munged's words are "$@".
        let child = Command::new("sh")
            .args([
                "-c",
                "\"$@\" & m=$!; cat >/dev/null; sleep 3; kill $m; wait $m",
                "sh",
                "munged",
                "--foreground",
            ])
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!(
                "--pid-file={}",
                self.dir.join("munged.pid").display()
            ))
            .arg(format!(
                "--seed-file={}",
                self.dir.join("munged.seed").display()
            ))
            .arg(format!(
                "--log-file={}",
                self.dir.join("munged.log").display()
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("starting munged here")?;
        let mut child = LocalMunged(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if let Some(s) = child.0.try_wait()? {
                bail!(
                    "munged here exited ({s}): {}",
                    std::fs::read_to_string(self.dir.join("munged.log")).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!("munged here made no socket within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(child)
    }
}

/// The shell holding munged here; its process group ends when dropped.
struct LocalMunged(std::process::Child);

impl Drop for LocalMunged {
    fn drop(&mut self) {
        // SAFETY: signals the process group made for this shell and its munged alone.
        unsafe { libc::killpg(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.munged.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn set_mode(path: &std::path::Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}

fn getrandom(buf: &mut [u8]) -> Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)?;
    Ok(())
}
