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
pub fn thread_sleeps_in(tid: i32, syscalls: &[i64]) -> bool {
    let task = format!("/proc/self/task/{tid}");
    let Ok(syscall) = std::fs::read_to_string(format!("{task}/syscall")) else {
        return false;
    };
    let nr: i64 = syscall
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1);
    let stat = std::fs::read_to_string(format!("{task}/stat")).unwrap_or_default();
    // The state is the first field after the parenthesised thread name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("");
    state == "S" && syscalls.contains(&nr)
}
