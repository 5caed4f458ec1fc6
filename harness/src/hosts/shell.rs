//! One way to run a command on a host where ranks run: over SSH (an inventory or the container
//! hosts), or as a small Slurm step on the node (`srun --overlap`, inside the run's allocation).
//! Probes, pre-checks, signals, stacks and trace fetches all go through it.

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::hosts::slurm::Slurm;
use crate::hosts::ssh::SshTarget;

#[derive(Clone, Debug)]
pub struct HostShell {
    /// A name for messages.
    pub name: String,
    pub via: Via,
}

#[derive(Clone, Debug)]
pub enum Via {
    Ssh(SshTarget),
    Slurm { slurm: Arc<Slurm>, node: String },
}

impl HostShell {
    pub fn ssh(target: SshTarget) -> HostShell {
        HostShell {
            name: target.name.clone(),
            via: Via::Ssh(target),
        }
    }

    /// Run `words` on the host (no shell in between) within `limit`.
    pub fn run(&self, words: &[&str], limit: Duration) -> Result<Output> {
        match &self.via {
            Via::Ssh(t) => t.run(words, None, limit),
            Via::Slurm { slurm, node } => slurm.on_node(node, words, limit),
        }
    }

    /// Like [`run`](Self::run), but a non-zero exit is an error that quotes the stderr.
    pub fn check(&self, words: &[&str], limit: Duration) -> Result<String> {
        if let Via::Ssh(t) = &self.via {
            return t.check(words, limit);
        }
        let out = self.run(words, limit)?;
        if !out.status.success() {
            bail!(
                "{}: `{}` exited {}: {}",
                self.name,
                words.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
