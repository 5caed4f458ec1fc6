//! A program nobody here wrote, run as a rank's role: started in the rank's process group and
//! tied to the rank's life (PR_SET_PDEATHSIG), so every path that ends the rank ends it too.
//! Its stdout and stderr are read on threads into one stream of timestamped lines, so a chatty
//! program never blocks on a full pipe and every wait here is bounded.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError};

/// Longest line kept; a program printing megabytes without a newline is cut, not buffered.
const MAX_LINE: usize = 8 << 10;
/// Lines waiting for the rank to read them. When the queue is full the reader stops reading,
/// so the pipe fills and the program waits on its writes (back-pressure, no line lost): a
/// program's output flood costs the rank at most QUEUE x MAX_LINE (8 MiB) of memory.
const QUEUE: usize = 1024;

/// Which pipe a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pipe {
    Out,
    Err,
}

#[derive(Clone, Debug)]
pub struct Line {
    pub pipe: Pipe,
    pub at: Instant,
    pub text: String,
}

/// How a program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl From<ExitStatus> for Exit {
    fn from(s: ExitStatus) -> Exit {
        match (s.code(), s.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(sig)) => Exit::Signal(sig),
            (None, None) => Exit::Code(-1),
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit {c}"),
            Exit::Signal(s) => write!(f, "killed by {}", signal_name(*s)),
        }
    }
}

pub fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// Why a program could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("`{0}` is not installed (not found in PATH)")]
    Missing(String),
    #[error("starting `{program}`: {error}")]
    Failed {
        program: String,
        error: std::io::Error,
    },
}

pub struct External {
    child: Child,
    lines: Receiver<Line>,
    readers: Vec<JoinHandle<()>>,
    exit: Option<Exit>,
}

impl External {
    pub fn spawn(
        program: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<External, SpawnError> {
        // Descendants that leave their parent (a daemon that forks and calls setsid) are
        // reparented to this rank rather than to init, so `end_descendants` still finds them.
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER changes only this process's attribute.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent; it runs in
        // the forked child before exec. If the rank dies (even by SIGKILL), so does the program.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => SpawnError::Missing(program.to_string()),
            _ => SpawnError::Failed {
                program: program.to_string(),
                error,
            },
        })?;
        let (tx, lines) = crossbeam_channel::bounded(QUEUE);
        let mut readers = vec![];
        let pipes: [(Pipe, Option<Box<dyn Read + Send>>); 2] = [
            (Pipe::Out, child.stdout.take().map(|s| Box::new(s) as _)),
            (Pipe::Err, child.stderr.take().map(|s| Box::new(s) as _)),
        ];
        for (pipe, source) in pipes {
            let (Some(source), tx) = (source, tx.clone()) else {
                continue;
            };
            let reader = std::thread::Builder::new()
                .name("wringer-exec-out".into())
                .spawn(move || {
                    let mut r = BufReader::new(source);
                    let mut buf = Vec::new();
                    loop {
                        buf.clear();
                        match (&mut r).take(MAX_LINE as u64).read_until(b'\n', &mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {
                                let text = String::from_utf8_lossy(&buf)
                                    .trim_end_matches(['\n', '\r'])
                                    .to_string();
                                let line = Line {
                                    pipe,
                                    at: Instant::now(),
                                    text,
                                };
                                if tx.send(line).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            match reader {
                Ok(h) => readers.push(h),
                Err(error) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(SpawnError::Failed {
                        program: program.to_string(),
                        error,
                    });
                }
            }
        }
        Ok(External {
            child,
            lines,
            readers,
            exit: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next output line, waiting at most `timeout`. `None` when there is none yet, or
    /// none will come (both pipes closed).
    pub fn next_line(&self, timeout: Duration) -> Option<Line> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Some(l),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                // Both pipes closed: do not spin.
                std::thread::sleep(timeout);
                None
            }
        }
    }

    /// How the program ended, if it has.
    pub fn exited(&mut self) -> Option<Exit> {
        if self.exit.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exit = Some(s.into());
            }
        }
        self.exit
    }

    /// Send `sig` to the program (not to the rank's group).
    pub fn signal(&self, sig: nix::sys::signal::Signal) -> nix::Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, sig)
    }

    /// Kill and reap the program (a frozen one is woken so the kill lands), then collect the
    /// lines still in the pipes, waiting at most `drain` for them.
    pub fn finish(&mut self, drain: Duration) -> Vec<Line> {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.signal(nix::sys::signal::Signal::SIGCONT);
            if let Ok(s) = self.child.wait() {
                self.exit = Some(s.into());
            }
        }
        let deadline = Instant::now() + drain;
        let mut rest = vec![];
        while let Ok(l) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            rest.push(l);
        }
        // A descendant may still hold a pipe open; its reader then ends when the rank's group
        // is killed. Join only those that are done, never wait on the others.
        for h in std::mem::take(&mut self.readers) {
            if h.is_finished() {
                let _ = h.join();
            }
        }
        rest
    }
}

impl External {
    /// After [`end_descendants`]: wait (at most `within`) for the output readers to see the
    /// end of their pipes and join them, taking the lines still queued so no reader stays
    /// blocked on a full queue. The pipes and threads are the rank's own bookkeeping: left
    /// open, a leak check would blame them on the program.
    pub fn close_pipes(&mut self, within: Duration) -> Vec<Line> {
        let deadline = Instant::now() + within;
        let mut rest = vec![];
        loop {
            rest.extend(self.lines.try_iter());
            let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.readers)
                .into_iter()
                .partition(|h| h.is_finished());
            for h in done {
                let _ = h.join();
            }
            self.readers = running;
            if self.readers.is_empty() || Instant::now() >= deadline {
                rest.extend(self.lines.try_iter());
                return rest;
            }
            let _ = self
                .lines
                .recv_timeout(Duration::from_millis(5))
                .map(|l| rest.push(l));
        }
    }
}

impl Drop for External {
    fn drop(&mut self) {
        self.finish(Duration::ZERO);
    }
}

/// SIGKILL every process under this one (programs a step started, daemons they left behind),
/// and reap them. Returns how many there were.
///
/// In rounds, within a bound: a process may fork between the listing and the kill, and a
/// killed one leaves the table only once it has been reaped (this rank is their subreaper),
/// so one pass can leave thousands of children still holding the program's pipes.
pub fn end_descendants() -> usize {
    let me = std::process::id();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ended = std::collections::HashSet::new();
    loop {
        let others: Vec<u32> = crate::hosts::procfs::process_tree(me)
            .into_iter()
            .filter(|p| *p != me)
            .collect();
        for pid in &others {
            ended.insert(*pid);
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // Reap what is ours to reap (orphans adopted by this subreaper included).
        while let Ok(s) = nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG))
        {
            if s == nix::sys::wait::WaitStatus::StillAlive {
                break;
            }
        }
        if others.is_empty() || Instant::now() >= deadline {
            return ended.len();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Microseconds since the Unix epoch: the clock ranks on one host (or hosts kept in step by
/// NTP) share, so the coordinator can relate one rank's fault to another's detection.
pub fn wall_us(at: Instant) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let back = Instant::now().saturating_duration_since(at);
    now.saturating_sub(back).as_micros() as u64
}

/// Whether something on this host listens on TCP `port`, read from /proc/net/tcp{,6}: no
/// probe connection, which a program with a one-shot accept would take for its peer.
pub fn listening_on(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .any(|path| std::fs::read_to_string(path).is_ok_and(|table| listening_in(&table, port)))
}

/// `table` is /proc/net/tcp's text: `sl local_address rem_address st ...`, addresses as
/// `HEXIP:HEXPORT`, state 0A = LISTEN.
fn listening_in(table: &str, port: u16) -> bool {
    table.lines().skip(1).any(|l| {
        let mut f = l.split_whitespace();
        let (Some(_), Some(local), Some(_), Some(state)) = (f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        state == "0A"
            && local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
                == Some(port)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_state_and_port_are_read_from_the_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000\n   1: 0100007F:1F91 0100007F:1F90 01 00000000:00000000\n";
        assert!(listening_in(table, 0x1F90));
        // Established, not listening.
        assert!(!listening_in(table, 0x1F91));
        assert!(!listening_in(table, 80));
        assert!(!listening_in("garbage\nnot a table", 80));
    }

    #[test]
    fn a_real_listener_is_seen_without_connecting() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening_on(port));
        // (Not listening is the parser test's: once dropped, another test may take the port.)
        drop(l);
    }

    #[test]
    fn output_is_timestamped_per_pipe_and_the_exit_is_typed() {
        let args = ["-c", "echo out; echo err >&2; exit 7"].map(String::from);
        let mut p = External::spawn("sh", &args, &[]).unwrap();
        let mut seen = vec![];
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.exited().is_none() && Instant::now() < deadline {
            seen.extend(p.next_line(Duration::from_millis(10)));
        }
        seen.extend(p.finish(Duration::from_secs(1)));
        assert_eq!(p.exited(), Some(Exit::Code(7)));
        assert!(seen.iter().any(|l| l.pipe == Pipe::Out && l.text == "out"));
        assert!(seen.iter().any(|l| l.pipe == Pipe::Err && l.text == "err"));
    }

    #[test]
    fn the_process_tree_holds_the_program_and_its_children() {
        let args = ["-c", "sleep 30 & sleep 30 & wait"].map(String::from);
        let mut p = External::spawn("sh", &args, &[]).unwrap();
        let ok = crate::hosts::procfs::wait_until(
            || crate::hosts::procfs::process_tree(p.pid()).len() == 3,
            Duration::from_secs(10),
        );
        let tree = crate::hosts::procfs::process_tree(p.pid());
        assert!(ok, "{tree:?}");
        assert_eq!(tree[0], p.pid());
        p.finish(Duration::ZERO);
        // The sleeps are in the test's process group; end them by PID.
        for pid in &tree[1..] {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    #[test]
    fn a_missing_program_is_typed_and_a_killed_one_reports_its_signal() {
        assert!(matches!(
            External::spawn("wringer-no-such-program", &[], &[]),
            Err(SpawnError::Missing(_))
        ));
        let mut p = External::spawn("sleep", &["30".to_string()], &[]).unwrap();
        p.signal(nix::sys::signal::Signal::SIGKILL).unwrap();
        p.finish(Duration::from_secs(1));
        assert_eq!(p.exited(), Some(Exit::Signal(libc::SIGKILL)));
        assert_eq!(Exit::Signal(9).to_string(), "killed by SIGKILL");
    }
}
