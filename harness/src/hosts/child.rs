//! Other programs (reference tools, `ibv_rc_pingpong`) as child processes: every wait bounded,
//! output drained on a thread so a chatty child never blocks on a full pipe, and the child
//! killed and reaped on every path.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A child process, killed and reaped when dropped.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `cmd` with stdin closed and stdout/stderr piped.
pub fn spawn(cmd: &[&str]) -> Result<Reaped, String> {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(Reaped)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("{} is not installed", cmd[0]),
            _ => format!("{}: {e}", cmd[0]),
        })
}

/// Run `cmd` to completion within `limit`: its exit status (`None` when it ran out of time and
/// was killed) and its stdout followed by its stderr.
pub fn run_bounded(cmd: &[&str], limit: Duration) -> Result<(Option<ExitStatus>, String), String> {
    let mut child = spawn(cmd)?;
    let mut pipes = (child.0.stdout.take(), child.0.stderr.take());
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        if let Some(s) = pipes.0.as_mut() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(s) = pipes.1.as_mut() {
            let _ = s.read_to_string(&mut out);
        }
        out
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.0.try_wait().map_err(|e| e.to_string())? {
            Some(s) => break Some(s),
            None if Instant::now() > deadline => break None,
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    // Killing (a no-op after an exit) closes the pipes, so the reader finishes.
    drop(child);
    Ok((status, reader.join().unwrap_or_default()))
}
