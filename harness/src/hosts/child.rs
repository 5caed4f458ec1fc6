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
pub fn spawn(cmd: &[&str]) -> anyhow::Result<Reaped> {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(Reaped)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow::anyhow!("{} is not installed", cmd[0]),
            _ => anyhow::anyhow!("{}: {e}", cmd[0]),
        })
}

/// Run `cmd` to completion within `limit`: its exit status (`None` when it ran out of time and
/// was killed) and its stdout followed by its stderr.
pub fn run_bounded(cmd: &[&str], limit: Duration) -> anyhow::Result<(Option<ExitStatus>, String)> {
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
        match child.0.try_wait().map_err(anyhow::Error::from)? {
            Some(s) => break Some(s),
            None if Instant::now() > deadline => break None,
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    // Killing (a no-op after an exit) closes the pipes, so the reader finishes.
    drop(child);
    Ok((status, reader.join().unwrap_or_default()))
}

/// Run a prepared command to completion within `limit` (fed `input`, or with stdin closed; in
/// a process group of its own, which is killed when time runs out): its exit status, stdout
/// and stderr.
pub fn output_within(
    cmd: &mut Command,
    input: Option<&std::path::Path>,
    limit: Duration,
) -> std::io::Result<std::process::Output> {
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let feeder = match (input, child.stdin.take()) {
        (Some(path), Some(mut stdin)) => {
            let mut file = std::fs::File::open(path)?;
            Some(std::thread::spawn(move || {
                let _ = std::io::copy(&mut file, &mut stdin);
            }))
        }
        _ => None,
    };
    // One reader per pipe: a child that fills one pipe while we wait on the other would stall.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = vec![];
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            // SAFETY: signals the process group made for this child alone.
            unsafe { libc::killpg(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("did not finish within {limit:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if let Some(f) = feeder {
        let _ = f.join();
    }
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}

/// A program that ran and exited unsuccessfully, with what it wrote to stderr: callers that
/// must tell one refusal from another (a subnet taken, a job already gone) read `stderr`, the
/// program's own words, instead of the text of a wrapped error.
#[derive(Debug, thiserror::Error)]
#[error("`{command}` exited {status}: {stderr}")]
pub struct ToolFailed {
    pub command: String,
    pub status: String,
    pub stderr: String,
}

impl ToolFailed {
    /// Whether `e` is a program's failure whose stderr says `what`.
    pub fn says(e: &anyhow::Error, what: &str) -> bool {
        e.downcast_ref::<ToolFailed>()
            .is_some_and(|f| f.stderr.contains(what))
    }
}
