//! What Linux's /proc says of this process's own threads: whether one sleeps inside a given
//! syscall. For tests and harnesses that must act while a thread is really blocked, not merely
//! about to be (the connection's receiver, a caller in `poll`).

/// The calls a thread waiting in `poll(2)` shows (glibc makes `poll` or `ppoll`).
pub const POLL_CALLS: &[i64] = &[
    libc::SYS_ppoll,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_poll,
];

/// Whether thread `tid` of this process sleeps (state S) inside one of `syscalls` (numbers, from
/// `/proc/self/task/TID/syscall`): really blocked in the call, not about to make it.
///
/// Harnesses ask this in a loop while a cycle waits for its receiver, so it makes few syscalls:
/// each file in one read, and the state only for a thread inside one of the calls.
pub fn thread_sleeps_in(tid: i32, syscalls: &[i64]) -> bool {
    let task = format!("/proc/self/task/{tid}");
    let Some(syscall) = read_small(&format!("{task}/syscall")) else {
        return false;
    };
    let nr: i64 = syscall
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1);
    if !syscalls.contains(&nr) {
        return false;
    }
    let stat = read_small(&format!("{task}/stat")).unwrap_or_default();
    // The state is the first field after the parenthesised thread name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("");
    state == "S"
}

/// A /proc file of a few hundred bytes, in one `read` where it fits (a /proc file has no size
/// to size a buffer by: `read_to_string` grows from 32 bytes, one call per doubling).
fn read_small(path: &str) -> Option<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut buf = vec![0u8; 1024];
    let mut len = 0;
    loop {
        len += file.read(&mut buf[len..]).ok()?;
        // A read that did not fill the buffer returned the rest of a /proc file (its end
        // included: a /proc file is made whole for its first read).
        if len < buf.len() {
            break;
        }
        buf.resize(buf.len() * 2, 0);
    }
    buf.truncate(len);
    String::from_utf8(buf).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_longer_than_the_first_buffer_is_read_whole() {
        let path = std::env::temp_dir().join(format!("wringer-procfs-{}", std::process::id()));
        let text: String = (0..700).map(|i| format!("{i} ")).collect();
        assert!(text.len() > 2048);
        std::fs::write(&path, &text).unwrap();
        let read = read_small(path.to_str().unwrap());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read.as_deref(), Some(text.as_str()));
    }

    #[test]
    fn a_thread_asleep_in_a_receive_is_seen_there_and_a_running_one_is_not() {
        use std::io::{Read, Write};
        let (mut ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            let mut byte = [0u8; 1];
            theirs.read(&mut byte).unwrap()
        });
        let tid = tid_rx.recv().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !thread_sleeps_in(tid, &[libc::SYS_recvfrom]) {
            assert!(
                std::time::Instant::now() < deadline,
                "never seen asleep in its receive"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!thread_sleeps_in(tid, &[libc::SYS_write]));
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        assert!(!thread_sleeps_in(me, &[libc::SYS_recvfrom]));
        ours.write_all(b"x").unwrap();
        assert_eq!(sleeper.join().unwrap(), 1);
    }
}
