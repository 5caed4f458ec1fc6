//! Facts about processes read from /proc: descriptor and thread counts, whether a thread is
//! blocked in a receive, and thread stacks for hang evidence.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Poll `cond` (for states the kernel offers no event for) until it holds, at most `limit`.
pub fn wait_until(cond: impl Fn() -> bool, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut spins = 0u32;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        spins += 1;
        if spins < 200 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    false
}

// The transport reads its own threads the same way; one copy, the transport's.
pub use wringer_transport::procfs::{thread_sleeps_in, POLL_CALLS};

/// This thread's kernel id.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// `pid` and every process under it, parents first (from /proc's `children` lists).
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() && out.len() < 256 {
        let p = out[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let children =
                    std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                out.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
        i += 1;
    }
    out
}

/// Live (not zombie) processes in process group `pgid`, with their command lines.
pub fn group_members(pgid: u32) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid pgrp ...`; comm may hold spaces, so split after its `)`.
            let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
            let (state, pgrp) = (*rest.first()?, rest.get(2)?.parse::<u32>().ok()?);
            if pgrp != pgid || state == "Z" || state == "X" {
                return None;
            }
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            Some((pid, cmd.trim().to_string()))
        })
        .collect()
}

/// A thread's state letter from its `stat` line ("?" when unreadable).
fn state_of(stat: &str) -> &str {
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .unwrap_or("?")
}

/// Whether every thread of `pid` has stopped (or the process is gone). A stop signal is taken
/// by each thread when it next runs, so one that was waiting for a CPU when `kill` returned
/// still shows `R` for a moment after it.
pub fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // "?": the thread ended between the listing and the read.
        matches!(state_of(&stat), "T" | "t" | "Z" | "X" | "?")
    })
}

/// Kernel stacks of every thread of `pid`, and (with a `gdb_limit`, when gdb is installed)
/// user-space stacks too.
pub fn capture_stacks(pid: u32, gdb_limit: Option<Duration>) -> String {
    let mut out = String::new();
    let task_dir = format!("/proc/{pid}/task");
    if let Ok(tasks) = std::fs::read_dir(&task_dir) {
        let mut tids: Vec<String> = tasks
            .flatten()
            .map(|t| t.file_name().to_string_lossy().into_owned())
            .collect();
        tids.sort();
        for tid in tids {
            let base = Path::new(&task_dir).join(&tid);
            let name = std::fs::read_to_string(base.join("comm")).unwrap_or_default();
            let wchan = std::fs::read_to_string(base.join("wchan")).unwrap_or_default();
            let syscall = std::fs::read_to_string(base.join("syscall")).unwrap_or_default();
            let stack = std::fs::read_to_string(base.join("stack"))
                .unwrap_or_else(|e| format!("(unreadable: {e})\n"));
            // The state when read (T: stopped, as the watchdog freezes a hung rank first).
            let stat = std::fs::read_to_string(base.join("stat")).unwrap_or_default();
            let state = state_of(&stat);
            out.push_str(&format!(
                "--- thread {tid} ({}) state={state} wchan={} syscall={}\n{stack}",
                name.trim(),
                wchan.trim(),
                syscall.split_whitespace().next().unwrap_or("?")
            ));
        }
    } else {
        out.push_str(&format!("(process {pid} is gone; no stacks)\n"));
    }
    if let Some(limit) = gdb_limit.filter(|_| crate::hosts::probe::on_path("gdb")) {
        out.push_str(&gdb_backtrace(pid, limit));
    }
    out
}

/// Tell the audit's recorder that the next process this thread starts is the harness's own
/// tool (gdb, taking a hung program's stacks inside an audited rank), not the program's: the
/// checker leaves it and its children out (`prctl(SYNC_MARKER, TOOL)`, as the sync observer's
/// markers are). Outside an audit it is one refused prctl.
fn next_child_is_a_tool() {
    use crate::model::sync_marker::{SYNC_MARKER, TOOL};
    // SAFETY: errno is this thread's own; it is read before and written back after.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: prctl with an option the kernel does not know touches no memory and fails with
    // EINVAL; its arguments are plain numbers.
    unsafe {
        libc::syscall(
            libc::SYS_prctl,
            SYNC_MARKER as libc::c_long,
            TOOL as libc::c_long,
            0 as libc::c_long,
            0 as libc::c_long,
            0 as libc::c_long,
        );
        *libc::__errno_location() = saved;
    }
}

fn gdb_backtrace(pid: u32, limit: Duration) -> String {
    next_child_is_a_tool();
    // The audit's observers stay out of the tool (a delay or a marker there is no evidence).
    let child = Command::new("gdb")
        .env_remove("LD_PRELOAD")
        .args([
            "-batch",
            "-nx",
            "-p",
            &pid.to_string(),
            "-ex",
            "thread apply all bt",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    let Ok(mut child) = child else {
        return "(gdb could not start)\n".into();
    };
    // Drain stdout on a thread so a long backtrace cannot fill the pipe and stall gdb.
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(s) = stdout.as_mut() {
            use std::io::Read;
            let _ = s.read_to_string(&mut text);
        }
        text
    });
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return format!("(gdb did not finish within {limit:?})\n");
            }
        }
    }
    let text = reader.join().unwrap_or_default();
    format!("--- gdb: thread apply all bt\n{text}")
}

use std::os::unix::process::CommandExt;

/// This process's peak resident memory (VmHWM), KiB.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
