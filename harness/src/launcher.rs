//! The local launcher: rank processes in one process group per scenario run, each tied to the
//! coordinator's life, all killable at once by process group.

use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::protocol::TOKEN_ENV;

pub struct LocalGroup {
    pub children: Vec<Child>,
    /// The process group of every rank of this run (the first rank leads it).
    pub pgid: i32,
}

impl LocalGroup {
    /// Start `ranks` copies of `wringer rank`, logs in `log_dir/rank-N.log`.
    pub fn start(
        ranks: u32,
        rendezvous: SocketAddr,
        token: &str,
        log_dir: &Path,
    ) -> Result<LocalGroup> {
        let exe = std::env::current_exe().context("locating the wringer binary")?;
        std::fs::create_dir_all(log_dir)?;
        let mut group = LocalGroup {
            children: vec![],
            pgid: 0,
        };
        for rank in 0..ranks {
            let log = File::create(log_dir.join(format!("rank-{rank}.log")))?;
            let mut cmd = Command::new(&exe);
            cmd.args([
                "rank",
                "--rendezvous",
                &rendezvous.to_string(),
                "--rank",
                &rank.to_string(),
            ])
            .env(TOKEN_ENV, token)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(group.pgid);
            // SAFETY: prctl is async-signal-safe and touches no memory of the parent; it only
            // asks the kernel to SIGKILL this child when the spawning thread (the coordinator's
            // main thread) dies, so a killed coordinator cannot leave ranks behind.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    group.kill_all();
                    return Err(e).context("starting a rank");
                }
            };
            if group.pgid == 0 {
                group.pgid = child.id() as i32;
            }
            group.children.push(child);
        }
        Ok(group)
    }

    pub fn pid(&self, rank: u32) -> Option<u32> {
        self.children.get(rank as usize).map(|c| c.id())
    }

    /// SIGKILL the whole group, then reap every child (bounded: SIGKILL cannot be ignored).
    pub fn kill_all(&mut self) {
        if self.pgid > 0 {
            // Continue stopped ranks too, so nothing lingers frozen if the kill is delayed.
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGCONT);
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for LocalGroup {
    fn drop(&mut self) {
        self.kill_all();
    }
}
