//! Reaching hosts with the system `ssh` (so the user's ~/.ssh/config keeps working): command
//! lines without a local shell, every remote argument quoted, BatchMode and connect timeouts so
//! an unreachable host is a clear failure and never a hang.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{bail, Result};

#[derive(Clone, Debug)]
pub struct SshTarget {
    /// A name for messages.
    pub name: String,
    pub host: String,
    pub user: Option<String>,
    pub port: Option<u16>,
    pub identity: Option<PathBuf>,
    /// Options for throwaway test hosts (their host keys are new every run).
    pub trust_new_host_keys: bool,
    /// A master connection's socket to share (`ControlPath`), where the harness holds one
    /// open: each command then starts in milliseconds instead of a handshake (seconds in a
    /// TCG VM). Without the master, ssh connects on its own.
    pub control: Option<PathBuf>,
}

/// Quote one word for a POSIX shell: the remote side of ssh always runs a shell.
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

impl SshTarget {
    /// `ssh [options] destination -- <quoted remote words>`. The local side spawns `ssh`
    /// directly (no local shell); the remote words are quoted one by one.
    pub fn command(&self, remote: &[&str]) -> Command {
        let mut c = self.base(false);
        c.arg(
            remote
                .iter()
                .map(|w| quote(w))
                .collect::<Vec<_>>()
                .join(" "),
        );
        c
    }

    /// The master connection behind `control` (`ssh -M -N`: it runs nothing and holds the
    /// socket the other commands share); `None` without a `control` socket.
    pub fn master(&self) -> Option<Command> {
        self.control.as_ref().map(|_| self.base(true))
    }

    /// `ssh [options] -- destination`, as a master of `control` when `master` is set.
    fn base(&self, master: bool) -> Command {
        let mut c = Command::new("ssh");
        c.args([
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "ServerAliveInterval=2",
            "-o",
            "ServerAliveCountMax=3",
        ]);
        c.args(["-o", "LogLevel=ERROR"]);
        if self.trust_new_host_keys {
            c.args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
            ]);
        }
        if let Some(port) = self.port {
            c.args(["-p", &port.to_string()]);
        }
        if let Some(path) = &self.control {
            c.arg("-o").arg(format!("ControlPath={}", path.display()));
            if master {
                c.args(["-M", "-N"]);
            } else {
                c.args(["-o", "ControlMaster=no"]);
            }
        }
        if let Some(id) = &self.identity {
            c.arg("-i").arg(id).args(["-o", "IdentitiesOnly=yes"]);
        }
        if let Some(user) = &self.user {
            c.args(["-l", user]);
        }
        // `--` ends ssh's options: nothing after it can be read as one.
        c.arg("--").arg(&self.host);
        c
    }

    /// Run a remote command to completion within `limit`, feeding it `input`.
    pub fn run(&self, remote: &[&str], input: Option<&Path>, limit: Duration) -> Result<Output> {
        crate::hosts::child::output_within(&mut self.command(remote), input, limit).map_err(|e| {
            match e.kind() {
                std::io::ErrorKind::NotFound => {
                    anyhow::anyhow!("starting ssh (is OpenSSH's client installed?): {e}")
                }
                _ => anyhow::anyhow!("{}: `{}`: {e}", self.name, remote.join(" ")),
            }
        })
    }

    /// Like [`run`](Self::run), but a non-zero exit is an error that quotes ssh's stderr.
    pub fn check(&self, remote: &[&str], limit: Duration) -> Result<String> {
        let out = self.run(remote, None, limit)?;
        if !out.status.success() {
            let code = out.status.code().unwrap_or(-1);
            let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
            let hint = if code == 255 {
                " (ssh could not connect or authenticate: check the inventory's ssh fields)"
            } else {
                ""
            };
            bail!(
                "{}: `{}` exited {code}{hint}: {why}",
                self.name,
                remote.join(" ")
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Make sure this exact wringer build is on the host; returns its remote path. The path
/// carries a hash of the binary, so two builds never share one; a present copy is reused only
/// if it reports the same version.
pub fn deploy(target: &SshTarget, remote_dir: &str) -> Result<String> {
    let exe = std::env::current_exe()?;
    let bytes = std::fs::read(&exe)?;
    let hash = fnv1a(&bytes);
    let dir = remote_dir.trim_end_matches('/');
    // `~` is expanded by the remote shell only unquoted; keep the home-relative form explicit.
    let dir = dir
        .strip_prefix("~/")
        .map(|d| format!("$HOME/{d}"))
        .unwrap_or_else(|| dir.to_string());
    let path = format!("{dir}/wringer-{}-{hash:016x}", env!("CARGO_PKG_VERSION"));
    let want = format!("wringer {}", env!("CARGO_PKG_VERSION"));
    let resolved = target
        .check(
            // shell: the path is "$1"; eval expands only $HOME: a profile's remote_dir holds letters, digits and . _ - / ~ only (hosts::values).
            &["sh", "-c", "eval echo \"$1\"", "sh", &path],
            Duration::from_secs(60),
        )?
        .trim()
        .to_string();
    let has = target.run(&[&resolved, "--version"], None, Duration::from_secs(60))?;
    if has.status.success() && String::from_utf8_lossy(&has.stdout).trim() == want {
        return Ok(resolved);
    }
    let tmp = format!("{resolved}.tmp");
    let parent = Path::new(&resolved)
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| ".".into());
    let copy = target.run(
        // shell: a constant script; the folders and files are "$1" to "$3".
        &[
            "sh",
            "-c",
            "mkdir -p \"$1\" && cat > \"$2\" && chmod 755 \"$2\" && mv \"$2\" \"$3\"",
            "sh",
            &parent,
            &tmp,
            &resolved,
        ],
        Some(&exe),
        Duration::from_secs(120),
    )?;
    if !copy.status.success() {
        bail!(
            "{}: copying wringer to {resolved} failed: {}",
            target.name,
            String::from_utf8_lossy(&copy.stderr).trim()
        );
    }
    let got = target.check(&[&resolved, "--version"], Duration::from_secs(60))?;
    if got.trim() != want {
        bail!(
            "{}: {resolved} reports `{}`, expected `{want}`",
            target.name,
            got.trim()
        );
    }
    Ok(resolved)
}

/// Copy the programs shipped with this build (see `programs`) beside the deployed binary at
/// `remote_exe`, so exec steps find them on the host. Returns how many were copied.
pub fn deploy_shipped(target: &SshTarget, remote_exe: &str) -> Result<usize> {
    let Some(local) = crate::hosts::programs::shipped_folders().into_iter().next() else {
        return Ok(0);
    };
    let folder = crate::hosts::programs::remote_folder(remote_exe);
    let mut copied = 0;
    for entry in std::fs::read_dir(&local)?.flatten() {
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let dest = format!("{folder}/{name}");
        let copy = target.run(
            // shell: a constant script; the folder and file are "$1" and "$2".
            &[
                "sh",
                "-c",
                "mkdir -p \"$1\" && cat > \"$2.tmp\" && chmod 755 \"$2.tmp\" && mv \"$2.tmp\" \"$2\"",
                "sh",
                &folder,
                &dest,
            ],
            Some(&path),
            Duration::from_secs(120),
        )?;
        if !copy.status.success() {
            bail!(
                "{}: copying {} to {dest} failed: {}",
                target.name,
                path.display(),
                String::from_utf8_lossy(&copy.stderr).trim()
            );
        }
        copied += 1;
    }
    Ok(copied)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_hostile_words() {
        for hostile in [
            "$(touch /tmp/pwned)",
            "a'b",
            "`id`",
            "x; rm -rf /",
            "'",
            "\n",
            "--",
            "-oProxyCommand=x",
        ] {
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", quote(hostile)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), hostile);
        }
    }

    #[test]
    fn commands_share_the_master_connection_that_master_opens() {
        let t = SshTarget {
            name: "vm".into(),
            host: "127.0.0.1".into(),
            user: Some("root".into()),
            port: Some(2222),
            identity: None,
            trust_new_host_keys: true,
            control: Some(PathBuf::from("/tmp/s.sock")),
        };
        let args = |c: Command| -> Vec<String> {
            c.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let m = args(t.master().unwrap());
        assert!(
            m.contains(&"-M".into()) && m.contains(&"-N".into()),
            "{m:?}"
        );
        assert!(m.contains(&"ControlPath=/tmp/s.sock".into()), "{m:?}");
        assert!(!m.contains(&"ControlMaster=no".into()), "{m:?}");
        assert_eq!(&m[m.len() - 2..], ["--", "127.0.0.1"]);
        let c = args(t.command(&["true"]));
        assert!(
            c.contains(&"ControlMaster=no".into()) && !c.contains(&"-M".into()),
            "{c:?}"
        );
        assert!(SshTarget { control: None, ..t }.master().is_none());
    }

    #[test]
    fn the_destination_follows_the_end_of_options_marker() {
        let t = SshTarget {
            name: "h".into(),
            host: "example".into(),
            user: Some("u".into()),
            port: Some(2222),
            identity: None,
            control: None,
            trust_new_host_keys: false,
        };
        let args: Vec<String> = t
            .command(&["echo", "$HOME"])
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let dd = args.iter().position(|a| a == "--").unwrap();
        assert_eq!(args[dd + 1], "example");
        assert_eq!(args[dd + 2], "'echo' '$HOME'");
        assert!(
            args.contains(&"BatchMode=yes".to_string())
                && args.contains(&"ConnectTimeout=5".to_string())
        );
    }
}
