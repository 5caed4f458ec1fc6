//! Container test hosts: N containers from the locally built image on two private Docker
//! networks made for this run (control: SSH and the rendezvous; data: rank-to-rank traffic),
//! started with the `docker` CLI and reached over SSH exactly like real hosts. Host-level faults
//! act on them: kill, freeze (pause), cut the data link, rate-limit it (tc tbf).

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::hosts::ssh::SshTarget;

pub struct ContainerHost {
    pub name: String,
    /// On the control network (SSH, rendezvous).
    pub ctl_ip: IpAddr,
    /// On the data network (what ranks advertise to each other).
    pub data_ip: IpAddr,
}

pub struct ContainerHosts {
    pub hosts: Vec<ContainerHost>,
    pub ctl_net: String,
    pub data_net: String,
    /// The control network's gateway: this machine, as the containers see it.
    pub gateway: IpAddr,
    key: PathBuf,
    key_dir: PathBuf,
}

/// `docker ...`, bounded, without a shell; stdout on success.
pub fn docker(args: &[&str], limit: Duration) -> Result<String> {
    let mut child = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running docker")?;
    let deadline = Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "`docker {}` did not finish within {limit:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(crate::hosts::child::ToolFailed {
            command: format!("docker {}", args.join(" ")),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

const T: Duration = Duration::from_secs(60);

/// How long a new container's sshd may take to listen.
const STARTUP: Duration = Duration::from_secs(60);

/// Wait until the container's sshd says it listens (its log), within `STARTUP`; a container
/// that exits or never says so is an error carrying the log's tail.
fn wait_listening(name: &str) -> Result<()> {
    let deadline = Instant::now() + STARTUP;
    loop {
        // sshd -e logs to stderr; `docker logs` replays the container's stderr on its own.
        let out = crate::hosts::child::output_within(
            Command::new("docker").args(["logs", name]),
            None,
            T,
        )
        .context("running docker logs")?;
        let log = String::from_utf8_lossy(&out.stderr);
        if log.contains("Server listening") {
            return Ok(());
        }
        let state = docker(&["inspect", "-f", "{{.State.Status}}", name], T)?;
        let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        if state != "running" {
            bail!("container {name} is {state} before its sshd listened (log: {tail})");
        }
        if Instant::now() > deadline {
            bail!("container {name}: its sshd did not listen within {STARTUP:?} (log: {tail})");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl ContainerHosts {
    /// Start `count` hosts; each folder of `shares` (absolute) is bind-mounted read-only at
    /// the same path in every one (the torch releases a run uses, so a venv's paths hold there).
    pub fn start(
        count: u32,
        image: &str,
        run_id: &str,
        shares: &[PathBuf],
    ) -> Result<ContainerHosts> {
        if docker(&["image", "inspect", image], T).is_err() {
            bail!("the image {image} is not built here: run `just setup-containers` (there is no registry to pull from)");
        }
        let key_dir = std::env::temp_dir().join(format!("wringer-keys-{run_id}"));
        std::fs::create_dir_all(&key_dir)?;
        let key = key_dir.join("id_ed25519");
        let out = Command::new("ssh-keygen")
            .args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "wringer-test-host",
                "-f",
            ])
            .arg(&key)
            .stdin(Stdio::null())
            .output()
            .context("running ssh-keygen (install openssh-client)")?;
        if !out.status.success() {
            bail!(
                "ssh-keygen failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let public = std::fs::read_to_string(key.with_extension("pub"))?
            .trim()
            .to_string();
        let owner = format!("wringer.pid={}", std::process::id());
        let (ctl_net, data_net) = (
            format!("wringer-ctl-{run_id}"),
            format!("wringer-data-{run_id}"),
        );
        let mut hosts = ContainerHosts {
            hosts: vec![],
            ctl_net: ctl_net.clone(),
            data_net: data_net.clone(),
            gateway: IpAddr::from([0, 0, 0, 0]),
            key,
            key_dir,
        };
        let ctl = create_network(&ctl_net, &owner)?;
        let data = create_network(&data_net, &owner)?;
        hosts.gateway = IpAddr::from([ctl[0], ctl[1], ctl[2], 1]);
        for i in 0..count {
            let name = format!("wringer-{run_id}-h{i}");
            // Fixed addresses on our two networks (kept across a restart). The container
            // starts on the control network, never on Docker's default bridge, so the host
            // can reach nothing else.
            let (ctl_ip, data_ip) = (
                IpAddr::from([ctl[0], ctl[1], ctl[2], 10 + i as u8]),
                IpAddr::from([data[0], data[1], data[2], 10 + i as u8]),
            );
            let (hostname, key_env, ip) = (
                format!("h{i}"),
                format!("WRINGER_AUTHORIZED_KEY={public}"),
                ctl_ip.to_string(),
            );
            let mounts: Vec<String> = shares
                .iter()
                .map(|s| format!("{0}:{0}:ro", s.display()))
                .collect();
            let mut args = vec!["run", "--detach"];
            let options = [
                ("--name", name.as_str()),
                ("--hostname", &hostname),
                ("--env", &key_env),
                ("--label", &owner),
                ("--cap-add", "NET_ADMIN"),
                ("--network", &ctl_net),
                ("--ip", &ip),
            ];
            for (option, value) in options {
                args.extend([option, value]);
            }
            for m in &mounts {
                args.extend(["--volume", m]);
            }
            args.push(image);
            let started = docker(&args, T);
            // Dropping the hosts removes it, even when it failed to come up.
            hosts.hosts.push(ContainerHost {
                name: name.clone(),
                ctl_ip,
                data_ip,
            });
            started.with_context(|| format!("starting container {name}"))?;
            wait_listening(&name)?;
            docker(
                &[
                    "network",
                    "connect",
                    "--ip",
                    &data_ip.to_string(),
                    &data_net,
                    &name,
                ],
                T,
            )?;
        }
        Ok(hosts)
    }

    pub fn target(&self, i: usize) -> SshTarget {
        let h = &self.hosts[i];
        SshTarget {
            name: h.name.clone(),
            host: h.ctl_ip.to_string(),
            user: Some("root".into()),
            port: None,
            identity: Some(self.key.clone()),
            trust_new_host_keys: true,
            control: None,
        }
    }

    /// Kill the host (its processes die with it).
    pub fn kill(&self, i: usize) -> Result<()> {
        docker(&["kill", &self.hosts[i].name], T).map(|_| ())
    }

    /// Freeze every process of the host.
    pub fn freeze(&self, i: usize) -> Result<()> {
        docker(&["pause", &self.hosts[i].name], T).map(|_| ())
    }

    /// Cut the data link: no FIN, no RST, the peer just goes silent.
    pub fn cut_link(&self, i: usize) -> Result<()> {
        docker(
            &[
                "network",
                "disconnect",
                "--force",
                &self.data_net,
                &self.hosts[i].name,
            ],
            T,
        )
        .map(|_| ())
    }

    /// Rate-limit the host's data interface with a token bucket (there is no netem here).
    pub fn rate_limit(&self, i: usize, rate: &str) -> Result<()> {
        let h = &self.hosts[i];
        let dev = self.data_device(i)?;
        docker(
            &[
                "exec", &h.name, "tc", "qdisc", "replace", "dev", &dev, "root", "tbf", "rate",
                rate, "burst", "32kbit", "latency", "400ms",
            ],
            T,
        )
        .map(|_| ())
    }

    fn data_device(&self, i: usize) -> Result<String> {
        let h = &self.hosts[i];
        let addrs = docker(&["exec", &h.name, "ip", "-o", "-4", "addr", "show"], T)?;
        addrs
            .lines()
            .find(|l| l.contains(&format!("inet {}/", h.data_ip)))
            .and_then(|l| l.split_whitespace().nth(1))
            .map(str::to_string)
            .with_context(|| format!("{}: no interface holds {}", h.name, h.data_ip))
    }

    /// Undo every fault, so the next scenario finds healthy hosts at the same addresses.
    pub fn heal(&self) -> Result<()> {
        for h in &self.hosts {
            let state = docker(&["inspect", "-f", "{{.State.Status}}", &h.name], T)?;
            match state.as_str() {
                "paused" => {
                    docker(&["unpause", &h.name], T)?;
                }
                "exited" | "dead" => {
                    docker(&["start", &h.name], T)?;
                }
                _ => {}
            }
            let nets = docker(
                &[
                    "inspect",
                    "-f",
                    "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
                    &h.name,
                ],
                T,
            )?;
            if !nets.split_whitespace().any(|n| n == self.data_net) {
                let ip = h.data_ip.to_string();
                docker(
                    &["network", "connect", "--ip", &ip, &self.data_net, &h.name],
                    T,
                )?;
            }
            // A tbf qdisc is the only one we add; deleting the root restores the default.
            if let Ok(dev) = self.data_device_of(h) {
                let _ = docker(
                    &["exec", &h.name, "tc", "qdisc", "del", "dev", &dev, "root"],
                    T,
                );
            }
        }
        self.wait_ssh(Duration::from_secs(30))
    }

    fn data_device_of(&self, h: &ContainerHost) -> Result<String> {
        let i = self
            .hosts
            .iter()
            .position(|x| x.name == h.name)
            .expect("one of ours");
        self.data_device(i)
    }

    /// Wait (bounded) until every host answers over SSH.
    pub fn wait_ssh(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        for i in 0..self.hosts.len() {
            loop {
                let ok = self
                    .target(i)
                    .run(&["true"], None, Duration::from_secs(10))
                    .map(|o| o.status.success())
                    .unwrap_or(false);
                if ok {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("{} does not answer over SSH", self.hosts[i].name);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }
}

impl Drop for ContainerHosts {
    fn drop(&mut self) {
        // Containers first, then our networks.
        for h in self.hosts.drain(..) {
            let _ = docker(&["rm", "-f", &h.name], T);
        }
        for net in [&self.ctl_net, &self.data_net] {
            let _ = docker(&["network", "rm", net], T);
        }
        let _ = std::fs::remove_dir_all(&self.key_dir);
    }
}

/// Remove containers and networks that a coordinator which no longer exists left behind (a
/// crash or SIGKILL skips `Drop`). Each carries its coordinator's PID as a label.
pub fn sweep_leftovers() {
    sweep(&["ps", "-a"], &["rm", "-f"]);
    sweep(&["network", "ls"], &["network", "rm"]);
}

/// List objects labelled with a coordinator PID (`list` + filter + format) and remove (`remove`
/// + id) those whose coordinator is gone.
fn sweep(list: &[&str], remove: &[&str]) {
    let dead = |pid: &str| {
        pid.parse::<u32>()
            .is_ok_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
    };
    let mut args = list.to_vec();
    args.extend([
        "--filter",
        "label=wringer.pid",
        "--format",
        "{{.ID}} {{.Label \"wringer.pid\"}}",
    ]);
    let Ok(rows) = docker(&args, T) else { return };
    for (id, pid) in rows.lines().filter_map(|r| r.split_once(' ')) {
        if dead(pid) {
            let mut rm = remove.to_vec();
            rm.push(id);
            let _ = docker(&rm, T);
        }
    }
}

/// Create a bridge network with a /24 of its own from 10.213.0.0/16, skipping subnets that
/// other networks on this machine already use. Returns the subnet's first three octets.
fn create_network(name: &str, owner: &str) -> Result<[u8; 3]> {
    let start = (std::process::id() as usize * 7 + name.len()) % 250;
    let mut last = None;
    for k in 0..250 {
        let third = ((start + k) % 250) as u8;
        let subnet = format!("10.213.{third}.0/24");
        match docker(
            &[
                "network", "create", "--driver", "bridge", "--subnet", &subnet, "--label", owner,
                name,
            ],
            T,
        ) {
            Ok(_) => return Ok([10, 213, third]),
            Err(e) if crate::hosts::child::ToolFailed::says(&e, "overlap") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last
        .unwrap_or_else(|| anyhow::anyhow!("no free subnet"))
        .context(format!("creating network {name}")))
}
