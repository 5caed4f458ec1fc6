//! A rank started as a Slurm task (`wringer rank --slurm LAYOUT`). The task itself is a small
//! supervisor: it starts the rank as its child and prints the rank's exit status as a marker
//! line, which srun carries back labelled with the task, so the coordinator knows each rank's
//! end when it happens. The rank takes its identity from Slurm (`SLURM_PROCID`, checked
//! against `SLURM_NODEID` and the layout the coordinator expects) and its address from the
//! bind rule.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::os::unix::process::{CommandExt, ExitStatusExt};

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::hosts::slurm::{Layout, EXIT_MARKER};

/// Set in the supervised child, so it runs the rank instead of supervising again.
const SUPERVISED: &str = "WRINGER_SLURM_SUPERVISED";

pub struct Binding<'a> {
    pub per_node: &'a [IpAddr],
    pub interface: Option<&'a str>,
}

/// Run as a Slurm task: supervise, or (in the supervised child) be the rank. Returns the exit
/// code for this process.
pub fn run(rendezvous: SocketAddr, layout: &str, binding: Binding, trace: &[String]) -> Result<u8> {
    if std::env::var_os(SUPERVISED).is_none() {
        return supervise(trace);
    }
    let layout = Layout::parse(layout)
        .with_context(|| format!("--slurm `{layout}`: expected `cyclic` or `block:N`"))?;
    let (rank, node) = identity(layout, |k| std::env::var(k).ok())?;
    let bind = address(node, &binding)?;
    crate::rank::worker::run(rendezvous, rank, bind, true).map(|()| 0)
}

/// Where the recorder's words send its trace: strace's `-o PATH` or `trace-syscalls`'s
/// `--out=PATH`.
fn trace_output(words: &[String]) -> Option<&Path> {
    words
        .iter()
        .enumerate()
        .find_map(|(i, w)| match w.strip_prefix("--out=") {
            Some(p) => Some(Path::new(p)),
            None if w == "-o" => words.get(i + 1).map(Path::new),
            None => None,
        })
}

/// Start this same command as the rank (under `trace` when given), wait for it, print its
/// status, and end as it did.
fn supervise(trace: &[String]) -> Result<u8> {
    let exe = std::env::current_exe().context("locating wringer")?;
    let rank = std::env::var("SLURM_PROCID").unwrap_or_default();
    let mut child = match trace.split_first() {
        Some((program, words)) => {
            let words: Vec<String> = words.iter().map(|w| w.replace("{rank}", &rank)).collect();
            // The trace goes into the run's private folder on this node: made here (0700), or
            // refused when someone else made that name first.
            if let Some(dir) = trace_output(&words).and_then(|p| p.parent().map(Path::to_owned)) {
                crate::hosts::private::ensure_dir(&dir)?;
            }
            let mut c = std::process::Command::new(program);
            c.args(words).arg(exe);
            c
        }
        None => std::process::Command::new(exe),
    };
    child.args(std::env::args_os().skip(1)).env(SUPERVISED, "1");
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent: the rank dies
    // with its supervisor (a cancelled step kills the supervisor first).
    unsafe {
        child.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = child
        .spawn()
        .context("starting the rank")?
        .wait()
        .context("waiting for the rank")?;
    println!("{EXIT_MARKER}{}", status.into_raw());
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => 128u8.saturating_add(s as u8),
        _ => 1,
    })
}

/// This task's rank and node index, from Slurm's variables; the node must be the one the
/// layout puts the rank on, or the coordinator would fault the wrong host.
fn identity(layout: Layout, var: impl Fn(&str) -> Option<String>) -> Result<(u32, usize)> {
    let num = |k: &str| -> Result<usize> {
        var(k)
            .with_context(|| format!("{k} is not set: `--slurm` ranks are started by srun"))?
            .parse()
            .with_context(|| format!("{k} is not a number"))
    };
    let rank = num("SLURM_PROCID")? as u32;
    let node = num("SLURM_NODEID")?;
    let nodes = num("SLURM_STEP_NUM_NODES").or_else(|_| num("SLURM_NNODES"))?;
    let expected = layout.node_of(rank, nodes);
    if node != expected {
        bail!(
            "Slurm placed rank {rank} on node {node} of {nodes}, but the layout `{}` puts it on node {expected}: check the profile's tasks_per_node and srun_options",
            layout.arg()
        );
    }
    Ok((rank, node))
}

fn address(node: usize, binding: &Binding) -> Result<IpAddr> {
    if !binding.per_node.is_empty() {
        return binding
            .per_node
            .get(node)
            .copied()
            .with_context(|| format!("no bind address for node {node}"));
    }
    if let Some(name) = binding.interface {
        let addrs = nix::ifaddrs::getifaddrs().context("listing interfaces")?;
        for a in addrs.filter(|a| a.interface_name == name) {
            if let Some(v4) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
                return Ok(IpAddr::V4(v4.ip()));
            }
        }
        bail!("interface {name} has no IPv4 address on this node");
    }
    let host = std::env::var("SLURMD_NODENAME")
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname"))
        .context("naming this node")?;
    let host = host.trim();
    (host, 0)
        .to_socket_addrs()
        .with_context(|| format!("resolving this node's name `{host}`"))?
        .map(|a| a.ip())
        .find(|ip| !ip.is_loopback())
        .with_context(|| {
            format!("`{host}` resolves only to loopback here: set slurm.data_interface")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn identity_comes_from_slurm_and_must_match_the_layout() {
        let ok = [
            ("SLURM_PROCID", "4"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_NUM_NODES", "3"),
        ];
        assert_eq!(identity(Layout::Cyclic, env(&ok)).unwrap(), (4, 1));
        let block = [
            ("SLURM_PROCID", "4"),
            ("SLURM_NODEID", "2"),
            ("SLURM_NNODES", "3"),
        ];
        assert_eq!(identity(Layout::Block(2), env(&block)).unwrap(), (4, 2));
        let why = identity(Layout::Cyclic, env(&block))
            .unwrap_err()
            .to_string();
        assert!(why.contains("placed rank 4 on node 2"), "{why}");
        let why = identity(Layout::Cyclic, env(&[])).unwrap_err().to_string();
        assert!(why.contains("SLURM_PROCID is not set"), "{why}");
    }

    #[test]
    fn a_per_node_address_is_picked_by_node_index() {
        let addrs: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        let b = Binding {
            per_node: &addrs,
            interface: None,
        };
        assert_eq!(address(1, &b).unwrap(), addrs[1]);
        assert!(address(2, &b).is_err());
        let lo = Binding {
            per_node: &[],
            interface: Some("lo"),
        };
        assert_eq!(address(0, &lo).unwrap(), IpAddr::from([127, 0, 0, 1]));
    }
}
