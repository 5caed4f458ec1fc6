use super::recorder::trace_filter;
use super::strace_line::{polled_fds, selected_fds};
use super::*;
use crate::model::duration::HumanDuration;
use crate::model::scenario::Perturb;
use std::path::Path;

const LIFECYCLE: &[AuditCheck] = &[AuditCheck::FdLifecycle];

fn checks_of(trace: &str, checks: &[AuditCheck]) -> Vec<&'static str> {
    analyse(trace, checks).iter().map(|v| v.check).collect()
}

/// The correct teardown: shutdown wakes the receiver, it exits, then the fd is closed.
const CORRECT: &str = "\
100 1.000 socket(AF_INET, SOCK_STREAM|SOCK_CLOEXEC, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM, child_tid=0x1} => {parent_tid=[101]}, 88) = 101
101 1.002 recvfrom(7,  <unfinished ...>
100 1.003 shutdown(7, SHUT_RDWR) = 0
101 1.004 <... recvfrom resumed>\"\", 65536, 0, NULL, NULL) = 0
101 1.005 exit(0)                 = ?
101 1.006 +++ exited with 0 +++
100 1.007 close(7)                = 0
";

const M: &str = "prctl(0x57534e43 /* PR_??? */";

/// The sync observer's lines: attach, and (thread, kind, object).
fn observed(body: &str) -> String {
    format!("100 0.9 {M}, 0x1, 0x64, 0, 0) = -1 EINVAL (Invalid argument)\n{body}")
}

/// A reader that read once and ended, and a close with or without the join before it.
fn read_then(join_first: bool) -> String {
    let join = format!(
        "101 1.004 {M}, 0x3, 0x7f00, 0x1, 0) = -1 EINVAL\n101 1.005 +++ exited with 0 +++\n\
         100 1.006 {M}, 0x2, 0x7f00, 0x2, 0) = -1 EINVAL\n"
    );
    let close = "100 1.007 close(7) = 0\n";
    let head = "100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0\n\
                100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101\n\
                101 1.002 read(7, \"x\", 8) = 1\n";
    if join_first {
        observed(&format!("{head}{join}{close}"))
    } else {
        observed(&format!("{head}{close}{join}"))
    }
}

#[test]
fn a_release_is_judged_by_happens_before_where_the_observer_is_loaded() {
    assert_eq!(checks_of(&read_then(true), LIFECYCLE), Vec::<&str>::new());
    let v = analyse(&read_then(false), LIFECYCLE);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].check, "close before the receiver is done");
    assert!(
        v[0].detail.contains("nothing orders thread 101's read(7)"),
        "{}",
        v[0].detail
    );
}

#[test]
fn a_thread_whose_calls_come_before_its_clone_returns_is_still_of_its_process() {
    // strace printed the reader's read before the creator's clone3 returned.
    let trace = observed(&format!(
        "100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0\n\
         100 1.001 clone3({{flags=CLONE_VM|CLONE_THREAD}} <unfinished ...>\n\
         101 1.002 read(7, \"x\", 8) = 1\n\
         100 1.003 <... clone3 resumed> => {{parent_tid=[101]}}, 88) = 101\n\
         100 1.007 close(7) = 0\n\
         101 1.008 {M}, 0x7, 0x7f00, 0x1, 0) = -1 EINVAL\n"
    ));
    assert_eq!(
        checks_of(&trace, LIFECYCLE),
        vec!["close before the receiver is done"]
    );
}

#[test]
fn a_message_through_a_pipe_orders_its_sender_before_its_reader() {
    let trace = observed(
        "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7\n\
         100 1.001 pipe2([8, 9], 0) = 0\n\
         100 1.002 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101\n\
         101 1.003 recvfrom(7, \"\", 8, 0, NULL, NULL) = 0\n\
         101 1.004 write(9, \"d\", 1) = 1\n\
         100 1.005 read(8, \"d\", 1) = 1\n\
         100 1.006 close(7) = 0\n",
    );
    assert!(checks_of(&trace, LIFECYCLE).is_empty());
    // Without the message, the same close is not ordered after the receive.
    let racy = trace.replace("101 1.004 write(9, \"d\", 1) = 1\n", "");
    assert_eq!(
        checks_of(&racy, LIFECYCLE),
        vec!["close before the receiver is done"]
    );
}

#[test]
fn probes_and_a_new_image_are_not_uses_after_close() {
    let trace = "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5\n\
                 100 1.001 read(5, \"\", 8) = 0\n\
                 100 1.002 close(5) = 0\n\
                 100 1.003 fcntl(5, F_GETFD) = -1 EBADF (Bad file descriptor)\n\
                 100 1.004 fcntl(5, F_SETFD, FD_CLOEXEC) = -1 EBADF (Bad file descriptor)\n\
                 100 1.005 execve(\"/bin/sh\", [\"sh\"], 0x1) = 0\n\
                 100 1.006 read(5, \"\", 8) = -1 EBADF (Bad file descriptor)\n";
    assert!(
        checks_of(trace, LIFECYCLE).is_empty(),
        "{:#?}",
        analyse(trace, LIFECYCLE)
    );
}

/// The eBPF recorder's call-site markers (`CALL_SITE`, syscall number, site) before calls.
fn site_marker(tid: u32, call: &str, site: u64) -> String {
    let nr = crate::hosts::syscall_trace::table::recorded(true)
        .find(|s| s.name == call)
        .unwrap()
        .nr;
    format!("{tid} 1.0 {M}, 0xa, {nr}, {site:#x}, 0) = -1 EINVAL (Invalid argument)\n")
}

/// A process that synchronizes through futexes of its own (the observer's `OwnSync` marker,
/// anywhere in its trace) may order a hand-over with nothing in the trace: its release is not
/// judged by order (nor by timing), only by what is certain; a call still inside is.
#[test]
fn a_process_with_its_own_synchronization_is_judged_only_by_what_is_certain() {
    let own = format!("{M}, 0xc, 0, 0x5500, 0) = -1 EINVAL (Invalid argument)\n");
    let late = format!("{}101 1.008 {own}", read_then(false));
    assert_eq!(checks_of(&late, LIFECYCLE), Vec::<&str>::new());
    let inside = observed(&format!(
        "100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0\n\
         100 1.001 clone3({{flags=CLONE_VM|CLONE_THREAD}} => {{parent_tid=[101]}}, 88) = 101\n\
         100 1.002 {own}\
         101 1.003 read(7,  <unfinished ...>\n\
         100 1.004 close(7) = 0\n"
    ));
    assert_eq!(checks_of(&inside, LIFECYCLE), vec!["close while in use"]);
}

#[test]
fn a_finding_names_the_call_sites_the_recorder_told_and_only_for_their_syscall() {
    let trace = read_then(false)
        .replace(
            "101 1.002 read(",
            &format!("{}101 1.002 read(", site_marker(101, "read", 0x5500_1234)),
        )
        .replace(
            "100 1.007 close(",
            &format!(
                "{}{}100 1.007 close(",
                site_marker(100, "close", 0x5500_5678),
                site_marker(100, "write", 0x5500_9999)
            ),
        );
    let v = analyse(&trace, LIFECYCLE);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(
        v[0].detail.contains("closed fd 7 at 0x55005678, and nothing orders thread 101's read(7) (line 5 at 0x55001234)"),
        "{}",
        v[0].detail
    );
    assert!(!v[0].detail.contains("0x55009999"), "{}", v[0].detail);
    // A site of 0 says the calls from here on come from nowhere the observer saw.
    let cleared = trace.replace(
        "100 1.007 close(",
        &format!("{}100 1.007 close(", site_marker(100, "close", 0)),
    );
    let v = analyse(&cleared, LIFECYCLE);
    assert!(
        v[0].detail.contains("closed fd 7, and nothing orders")
            && !v[0].detail.contains("0x55005678"),
        "{}",
        v[0].detail
    );
    // The markers change no verdict: the joined twin stays clean.
    let joined = read_then(true).replace(
        "100 1.007 close(",
        &format!("{}100 1.007 close(", site_marker(100, "close", 0x5500_5678)),
    );
    assert_eq!(checks_of(&joined, LIFECYCLE), Vec::<&str>::new());
}

#[test]
fn a_second_close_by_the_holder_is_a_double_close_and_a_sweep_is_not() {
    let head = "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5\n\
                100 1.001 read(5, \"\", 8) = 0\n\
                100 1.002 close(5) = 0\n";
    let twice = format!("{head}100 1.003 close(5) = -1 EBADF (Bad file descriptor)\n");
    assert_eq!(checks_of(&twice, LIFECYCLE), vec!["double close"]);
    let sweep = format!(
        "{head}100 1.003 close(4) = -1 EBADF (Bad file descriptor)\n\
         100 1.004 close(5) = -1 EBADF (Bad file descriptor)\n\
         100 1.005 close(6) = -1 EBADF (Bad file descriptor)\n"
    );
    assert!(checks_of(&sweep, LIFECYCLE).is_empty());
    // strace splits a close when another thread's line comes between its start and end.
    let split = sweep.replace(
        "100 1.004 close(5) = -1 EBADF (Bad file descriptor)\n",
        "100 1.004 close(5 <unfinished ...>\n99 1.0045 wait4(100,  <unfinished ...>\n\
         100 1.0046 <... close resumed>) = -1 EBADF (Bad file descriptor)\n",
    );
    assert!(
        checks_of(&split, LIFECYCLE).is_empty(),
        "{:#?}",
        analyse(&split, LIFECYCLE)
    );
}

/// A socket a child carries across its execve without close-on-exec into a program that
/// never uses it, while the parent closes its own copy: a leak. With SOCK_CLOEXEC, or when
/// the program uses the number (it was told it), or once the child is gone: none.
#[test]
fn a_socket_inherited_across_exec_without_close_on_exec_is_a_leak() {
    let trace = |flags: &str, child_use: &str| {
        format!(
            "100 1.000 socketpair(AF_UNIX, {flags}, 0, [3, 4]) = 0\n\
             100 1.001 clone(child_stack=NULL, flags=SIGCHLD) = 200\n\
             200 1.002 execve(\"/bin/sleep\", [\"sleep\"], 0x1 /* 1 var */) = 0\n\
             {child_use}\
             100 1.003 close(3) = 0\n\
             200 1.004 nanosleep({{tv_sec=1, tv_nsec=0}}, NULL) = 0\n\
             200 1.005 exit_group(0) = ?\n\
             200 1.006 +++ exited with 0 +++\n"
        )
    };
    let leaky = trace("SOCK_STREAM", "");
    assert_eq!(checks_of(&leaky, LIFECYCLE), vec!["leak"], "{leaky}");
    assert!(checks_of(&trace("SOCK_STREAM|SOCK_CLOEXEC", ""), LIFECYCLE).is_empty());
    let told = trace("SOCK_STREAM", "200 1.0025 write(3, \"x\", 1) = 1\n");
    assert!(checks_of(&told, LIFECYCLE).is_empty());
    // Marked close-on-exec after it was made, before the fork.
    let marked = leaky.replace(
        "100 1.001 clone",
        "100 1.0005 fcntl(3, F_SETFD, FD_CLOEXEC) = 0\n100 1.001 clone",
    );
    assert!(checks_of(&marked, LIFECYCLE).is_empty());
    // The child ended before the parent's close (its end printed late by strace).
    let gone = "100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [3, 4]) = 0\n\
                100 1.001 clone(child_stack=NULL, flags=SIGCHLD) = 200\n\
                200 1.002 execve(\"/bin/true\", [\"true\"], 0x1 /* 1 var */) = 0\n\
                200 1.003 exit_group(0) = ?\n\
                100 1.004 close(3) = 0\n\
                200 1.005 +++ exited with 0 +++\n";
    assert!(checks_of(gone, LIFECYCLE).is_empty());
}

/// Where futex is recorded: a wake that woke someone orders the waker before the wait it
/// ended (Rust's std locks and condition variables, which skip pthreads).
#[test]
fn a_futex_wake_that_woke_orders_its_waiter() {
    let trace = |wake_ret: &str| {
        observed(&format!(
            "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5\n\
             100 1.001 clone(child_stack=NULL, flags=CLONE_VM|CLONE_THREAD) = 101\n\
             101 1.002 recvfrom(5, \"x\", 1, 0, NULL, NULL) = 1\n\
             100 1.003 futex(0x7f10, FUTEX_WAIT_PRIVATE, 0, NULL <unfinished ...>\n\
             101 1.004 futex(0x7f10, FUTEX_WAKE_PRIVATE, 1) = {wake_ret}\n\
             100 1.005 <... futex resumed>) = 0\n\
             100 1.006 close(5) = 0\n"
        ))
    };
    assert!(
        checks_of(&trace("1"), LIFECYCLE).is_empty(),
        "{:#?}",
        analyse(&trace("1"), LIFECYCLE)
    );
    assert_eq!(
        checks_of(&trace("0"), LIFECYCLE),
        vec!["close before the receiver is done"]
    );
}

/// An io_uring operation in flight on a descriptor is a use of it: its close before the
/// completion is a close while in use; after the completion it is not.
#[test]
fn a_close_under_an_io_uring_operation_in_flight_is_a_close_while_in_use() {
    let head = "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5\n\
                100 1.001 io_uring_op(5, IORING_OP_RECV, 0xffff8881) = 0\n";
    let done = "100 1.002 io_uring_done(0xffff8881) = -125\n";
    let close = "100 1.003 close(5) = 0\n";
    let early = format!("{head}{close}{done}");
    let found = analyse(&early, LIFECYCLE);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0]
        .detail
        .contains("io_uring RECV submitted by thread 100 (line 2)"));
    assert!(checks_of(&format!("{head}{done}{close}"), LIFECYCLE).is_empty());
}

/// `leaks` for a program without steps: what its image made and left open at its exit,
/// not standard streams, not what it inherited, not after a kill.
#[test]
fn what_a_program_leaves_open_at_its_exit_is_a_leak_when_asked() {
    let run = |end: &str| {
        format!(
            "100 1.000 execve(\"/bin/x\", [\"x\"], 0x1 /* 1 var */) = 0\n\
             100 1.001 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5\n\
             100 1.002 dup2(5, 1) = 1\n\
             100 1.003 read(7, \"\", 8) = 0\n\
             {end}"
        )
    };
    let exited = run("100 1.004 exit_group(0) = ?\n100 1.005 +++ exited with 0 +++\n");
    let found = analyse(&exited, &[AuditCheck::Leaks]);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!((found[0].check, found[0].fd), ("leak", Some(5)));
    assert!(checks_of(&exited, LIFECYCLE).is_empty());
    let killed = run("100 1.005 +++ killed by SIGKILL +++\n");
    assert!(checks_of(&killed, &[AuditCheck::Leaks]).is_empty());
}

#[test]
fn a_stale_handle_on_a_reused_number_is_a_use_after_close() {
    let trace = |handed: bool| {
        let hand = if handed {
            format!(
                "100 1.005 {M}, 0x3, 0x10, 0x1, 0) = -1 EINVAL\n101 1.006 {M}, 0x2, 0x10, 0x1, 0) = -1 EINVAL\n"
            )
        } else {
            String::new()
        };
        observed(&format!(
            "100 1.000 openat(AT_FDCWD, \"/a\", O_RDWR) = 3\n\
             100 1.001 clone3({{flags=CLONE_VM|CLONE_THREAD}} => {{parent_tid=[101]}}, 88) = 101\n\
             101 1.002 write(3, \"a\", 1) = 1\n\
             100 1.003 close(3) = 0\n\
             100 1.004 openat(AT_FDCWD, \"/b\", O_RDWR) = 3\n\
             {hand}\
             101 1.007 write(3, \"b\", 1) = 1\n"
        ))
    };
    let v = analyse(&trace(false), LIFECYCLE);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(v[0].detail.contains("stale handle"), "{}", v[0].detail);
    assert!(checks_of(&trace(true), LIFECYCLE).is_empty());
}

#[test]
fn the_correct_teardown_order_has_no_violation() {
    assert!(analyse(CORRECT, LIFECYCLE).is_empty());
}

#[test]
fn closing_before_the_receiver_exits_is_flagged() {
    let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 recvfrom(7,  <unfinished ...>
100 1.003 shutdown(7, SHUT_RDWR) = 0
101 1.004 <... recvfrom resumed>\"\", 65536, 0, NULL, NULL) = 0
100 1.005 close(7)                = 0
101 1.006 exit(0)                 = ?
";
    let v = analyse(t, LIFECYCLE);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].check, "close before the receiver is done");
    assert_eq!(v[0].fd, Some(7));
    assert_eq!(v[0].pid, 100);
    assert!(v[0]
        .context
        .iter()
        .any(|(n, l)| *n == 6 && l.contains("close(7)")));
}

/// A receiver closes its own descriptor; the close's return reaches the trace only after
/// another thread was handed the same number for a file (as a CI run showed).
const SPLIT_CLOSE_THEN_REUSE: &str = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 14
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[102]}, 88) = 102
101 1.002 recvfrom(14, \"x\", 4, 0, NULL, NULL) = 1
101 1.003 close(14 <unfinished ...>
102 1.004 openat(AT_FDCWD, \"/sys/devices/system/cpu/online\", O_RDONLY|O_CLOEXEC <unfinished ...>
102 1.005 <... openat resumed>) = 14
101 1.006 <... close resumed>) = 0
102 1.007 read(14, \"0-1\\n\", 1024) = 4
102 1.008 close(14) = 0
101 1.009 exit(0) = ?
";

#[test]
fn a_close_whose_return_comes_after_the_number_is_reused_is_no_violation() {
    let v = analyse(SPLIT_CLOSE_THEN_REUSE, LIFECYCLE);
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn a_close_split_across_lines_still_counts_as_a_close() {
    // Before, a close whose return came on a later line was never recorded, so a use of
    // the number after it went unseen.
    let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 recvfrom(7, \"x\", 4, 0, NULL, NULL) = 1
100 1.003 close(7 <unfinished ...>
101 1.004 write(1, \"tick\", 4) = 4
100 1.005 <... close resumed>) = 0
101 1.006 recvfrom(7, 0x1, 4, 0, NULL, NULL) = -1 EBADF (Bad file descriptor)
";
    let found = checks_of(t, LIFECYCLE);
    assert_eq!(found, vec!["use after close"]);
}

#[test]
fn closing_while_another_thread_waits_in_poll_on_the_fd_is_flagged() {
    // A caller waiting for its own frame sleeps in poll, not in recvfrom.
    let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone(child_stack=0x1, flags=CLONE_VM|CLONE_THREAD) = 101
101 1.002 poll([{fd=7, events=POLLIN}], 1, 10000 <unfinished ...>
100 1.003 close(7)                = 0
101 1.004 <... poll resumed>)     = 1 ([{fd=7, revents=POLLNVAL}])
101 1.005 exit(0)                 = ?
";
    let found = checks_of(t, LIFECYCLE);
    assert!(found.contains(&"close while in use"), "{found:?}");
    assert_eq!(polled_fds("[{fd=7, events=POLLIN}], 1, 10000"), vec![7]);
    assert_eq!(
        polled_fds("[{fd=7, events=POLLIN}, {fd=9, events=POLLIN}], 2, -1"),
        vec![7, 9]
    );
    assert!(polled_fds("NULL, 0, 10").is_empty());
    assert_eq!(
        selected_fds("8, [3 7], [], NULL, {tv_sec=1, tv_usec=0}"),
        vec![3, 7]
    );
}

/// Every shape of "a thread waits for the descriptor another thread releases".
#[test]
fn releasing_a_descriptor_any_waiting_thread_is_inside_is_flagged() {
    let head = "\
100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0
100 1.000 pipe2([5, 6], 0) = 0
100 1.000 epoll_create1(EPOLL_CLOEXEC) = 9
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
";
    let cases = [
        ("101 1.002 select(8, [5 7], NULL, NULL, NULL <unfinished ...>\n", "close(7) = 0", "select() on it"),
        ("101 1.002 poll([{fd=5, events=POLLIN}, {fd=7, events=POLLIN}], 2, -1 <unfinished ...>\n", "close(7) = 0", "poll() on it"),
        ("100 1.001 epoll_ctl(9, EPOLL_CTL_ADD, 7, {events=EPOLLIN, data={u32=7, u64=7}}) = 0\n101 1.002 epoll_wait(9,  <unfinished ...>\n", "close(7) = 0", "waiting for it in its epoll set"),
        ("101 1.002 read(7,  <unfinished ...>\n", "dup2(5, 7) = 7", "released (by dup2)"),
        ("101 1.002 recvmsg(7,  <unfinished ...>\n", "close_range(3, 4294967295, 0) = 0", "released (by close_range)"),
        ("101 1.002 splice(5, NULL, 7, NULL, 4096, 0 <unfinished ...>\n", "dup3(8, 7, O_CLOEXEC) = 7", "splice() on it"),
    ];
    for (wait, release, says) in cases {
        let t = format!("{head}{wait}100 1.003 {release}\n");
        let v = analyse(&t, LIFECYCLE);
        assert!(
            v.iter().any(|v| v.check == "close while in use"
                && v.fd == Some(7)
                && v.detail.contains(says)),
            "{release} under {wait}: {v:#?}"
        );
    }
}

/// Their correct twins: the set forgets what was removed, a dup2 onto a free number or
/// onto itself releases nothing, close_range with CLOEXEC closes nothing.
#[test]
fn releasing_what_no_thread_waits_for_is_not_flagged() {
    let t = "\
100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0
100 1.000 epoll_create1(EPOLL_CLOEXEC) = 9
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
100 1.001 epoll_ctl(9, EPOLL_CTL_ADD, 7, {events=EPOLLIN, data={u32=7, u64=7}}) = 0
101 1.002 epoll_wait(9,  <unfinished ...>
100 1.003 epoll_ctl(9, EPOLL_CTL_DEL, 7, NULL) = 0
100 1.003 close(7) = 0
100 1.004 dup2(8, 8) = 8
100 1.004 dup2(8, 12) = 12
100 1.005 close_range(3, 4294967295, CLOSE_RANGE_CLOEXEC) = 0
101 1.006 <... epoll_wait resumed>[], 64, -1) = 0
";
    assert!(
        analyse(t, LIFECYCLE).is_empty(),
        "{:#?}",
        analyse(t, LIFECYCLE)
    );
}

#[test]
fn a_select_on_a_closed_descriptor_is_a_use_after_close() {
    let t = "\
100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 select(8, [7], NULL, NULL, NULL) = 1 (in [7])
100 1.003 close(7) = 0
101 1.004 select(8, [7], NULL, NULL, NULL) = -1 EBADF (Bad file descriptor)
";
    let found = checks_of(t, LIFECYCLE);
    assert!(found.contains(&"use after close"), "{found:?}");
}

#[test]
fn closing_while_another_thread_is_inside_a_call_on_the_fd_is_flagged() {
    let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone(child_stack=0x1, flags=CLONE_VM|CLONE_THREAD) = 101
101 1.002 recvfrom(7,  <unfinished ...>
100 1.003 close(7)                = 0
101 1.004 <... recvfrom resumed>\"\", 65536, 0, NULL, NULL) = 0
101 1.005 exit(0)                 = ?
";
    let found = checks_of(t, LIFECYCLE);
    assert!(found.contains(&"close while in use"), "{found:?}");
}

#[test]
fn a_call_on_a_closed_fd_by_its_old_user_is_a_use_after_close() {
    let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 recvfrom(7, \"x\", 65536, 0, NULL, NULL) = 1
101 1.003 futex(0x1, FUTEX_WAKE_PRIVATE, 1) = 0
100 1.004 close(7)                = 0
101 1.005 recvfrom(7, 0x1, 65536, 0, NULL, NULL) = -1 EBADF (Bad file descriptor)
";
    assert_eq!(checks_of(t, LIFECYCLE), vec!["use after close"]);
}

#[test]
fn a_reused_number_is_a_new_descriptor_for_whoever_created_it() {
    let t = "\
100 1.000 openat(AT_FDCWD, \"/a\", O_RDONLY) = 3
100 1.001 read(3, \"a\", 10) = 1
100 1.002 close(3)                = 0
100 1.003 openat(AT_FDCWD, \"/b\", O_RDONLY) = 3
100 1.004 read(3, \"b\", 10) = 1
100 1.005 close(3)                = 0
";
    assert!(analyse(t, LIFECYCLE).is_empty());
}

#[test]
fn where_receivers_are_named_a_caller_that_saw_the_end_need_not_exit_first() {
    // wringer's transport: a caller of recv, woken by close's shutdown, reads the end and
    // lives on; the named receiver exits, and only then is the fd closed.
    let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 prctl(PR_SET_NAME, \"wringer-rx-7\") = 0
100 1.003 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[102]}, 88) = 102
101 1.004 poll([{fd=7, events=POLLIN}], 1, -1 <unfinished ...>
102 1.005 poll([{fd=7, events=POLLIN}], 1, 4000 <unfinished ...>
100 1.006 shutdown(7, SHUT_RDWR) = 0
101 1.007 <... poll resumed>)     = 1 ([{fd=7, revents=POLLIN|POLLHUP}])
102 1.008 <... poll resumed>)     = 1 ([{fd=7, revents=POLLIN|POLLHUP}])
102 1.009 recvfrom(7, \"\", 8192, MSG_DONTWAIT, NULL, NULL) = 0
101 1.010 exit(0 <unfinished ...>
101 1.010 <... exit resumed>)     = ?
100 1.011 close(7)                = 0
101 1.011 +++ exited with 0 +++
102 1.012 exit(0)                 = ?
";
    let v = analyse(t, LIFECYCLE);
    assert!(v.is_empty(), "{v:?}");
    // The same, but the fd closed before the named receiver exits: flagged.
    let early = t.replace(
        "101 1.010 exit(0 <unfinished ...>\n101 1.010 <... exit resumed>)     = ?\n100 1.011 close(7)                = 0\n",
        "100 1.011 close(7)                = 0\n101 1.010 exit(0 <unfinished ...>\n101 1.010 <... exit resumed>)     = ?\n",
    );
    let v = analyse(&early, LIFECYCLE);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].check, "close before the receiver is done");
    assert!(v[0].detail.contains("thread 101"), "{v:?}");
}

#[test]
fn a_thread_waiting_in_poll_for_one_fd_is_its_receiver() {
    let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 poll([{fd=7, events=POLLIN}], 1, -1 <unfinished ...>
100 1.003 shutdown(7, SHUT_RDWR) = 0
101 1.004 <... poll resumed>)     = 1 ([{fd=7, revents=POLLIN|POLLHUP}])
100 1.005 close(7)                = 0
101 1.006 exit(0)                 = ?
";
    let v = analyse(t, LIFECYCLE);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].check, "close before the receiver is done");
}

#[test]
fn a_thread_that_handed_its_socket_over_is_not_its_receiver() {
    // A handshake thread reads the hello, answers, starts the connection's receiver and
    // moves on; the connection is then torn down correctly while it still lives.
    let t = "\
100 1.000 accept4(3, {sa_family=AF_INET}, [16], SOCK_CLOEXEC) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[102]}, 88) = 102
102 1.002 recvfrom(7, \"hello\", 44, 0, NULL, NULL) = 44
102 1.003 sendto(7, \"ack\", 20, MSG_NOSIGNAL, NULL, 0) = 20
102 1.004 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[103]}, 88) = 103
103 1.005 recvfrom(7,  <unfinished ...>
100 1.006 shutdown(7, SHUT_RDWR) = 0
103 1.007 <... recvfrom resumed>\"\", 65536, 0, NULL, NULL) = 0
103 1.008 exit(0)                 = ?
100 1.009 close(7)                = 0
102 1.010 exit(0)                 = ?
";
    assert!(
        analyse(t, LIFECYCLE).is_empty(),
        "{:?}",
        analyse(t, LIFECYCLE)
    );
}

#[test]
fn separate_processes_never_share_descriptors() {
    let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|SIGCHLD) = 200
200 1.002 recvfrom(7,  <unfinished ...>
100 1.003 close(7)                = 0
";
    assert!(analyse(t, LIFECYCLE).is_empty());
}

#[test]
fn checks_that_were_not_asked_for_report_nothing() {
    let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 recvfrom(7,  <unfinished ...>
100 1.003 close(7)                = 0
";
    assert!(analyse(t, &[AuditCheck::Leaks]).is_empty());
}

#[test]
fn a_step_that_leaves_an_fd_and_a_thread_behind_leaks_both() {
    let t = "\
100 1.000 write(5, \"{\\\"type\\\":\\\"step-start\\\",\\\"step\\\":0}\\n\", 31) = 31
100 1.001 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.002 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 8
100 1.003 close(8)                = 0
100 1.004 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
100 1.005 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[102]}, 88) = 102
102 1.006 exit(0)                 = ?
100 1.007 write(5, \"{\\\"type\\\":\\\"step-result\\\",\\\"step\\\":0}\\n\", 32) = 32
";
    let v = analyse(t, &[AuditCheck::Leaks]);
    let details: Vec<&str> = v.iter().map(|v| v.detail.as_str()).collect();
    assert_eq!(v.len(), 2, "{details:?}");
    assert!(details[0].starts_with("fd 7 created in the step"));
    assert!(details[1].starts_with("thread 101 started in the step"));
}

#[test]
fn what_existed_before_the_step_is_not_its_leak() {
    let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
100 1.002 write(5, \"step-start\", 31) = 31
100 1.003 write(5, \"step-result\", 32) = 32
";
    assert!(analyse(t, &[AuditCheck::Leaks]).is_empty());
}

#[test]
fn a_blocking_call_without_a_timeout_at_the_end_is_an_unbounded_wait() {
    let t = "\
100 1.000 futex(0x7f, FUTEX_WAIT_PRIVATE, 2, NULL <unfinished ...>
101 1.001 futex(0x7e, FUTEX_WAIT_BITSET_PRIVATE|FUTEX_CLOCK_REALTIME, 0, {tv_sec=1, tv_nsec=0}, FUTEX_BITSET_MATCH_ANY <unfinished ...>
102 1.002 poll([{fd=3, events=POLLIN}], 1, -1 <unfinished ...>
103 1.003 poll([{fd=4, events=POLLIN}], 1, 500 <unfinished ...>
104 1.004 write(5, \"\\1\\1\\1\"..., 1048576 <unfinished ...>
105 1.005 wait4(106, 0x7ffd, 0, NULL <unfinished ...>
107 1.006 wait4(106, 0x7ffd, WNOHANG, NULL <unfinished ...>
108 1.007 select(4, [3], NULL, NULL, NULL <unfinished ...>
109 1.008 select(4, [3], NULL, NULL, {tv_sec=1, tv_usec=0} <unfinished ...>
";
    let v = analyse(t, &[AuditCheck::UnboundedWaits]);
    let threads: Vec<u32> = v.iter().map(|v| v.pid).collect();
    // A write to a full pipe, a wait for a child and a select with no timeout are unbounded
    // too; WNOHANG and a timeout are not.
    assert_eq!(threads, vec![100, 102, 104, 105, 108], "{v:?}");
}

/// The harness's tool (the watchdog's gdb, announced by its marker) is not judged, nor are the
/// rank's own waits for the program; the program's blocked write is, as it was when the tool
/// started, though the tool's attach ended it short afterwards.
#[test]
fn a_hang_is_judged_when_the_harness_takes_its_stacks_and_its_tool_is_not_judged() {
    let t = format!(
        "\
100 1.000 clone3({{flags=CLONE_VM|CLONE_THREAD}} => {{parent_tid=[101]}}, 88) = 101
100 1.001 clone(child_stack=NULL, flags=SIGCHLD) = 200
200 1.002 write(5, \"\\1\"..., 1048576 <unfinished ...>
101 1.003 read(7,  <unfinished ...>
100 1.004 {M}, 0xb, 0, 0, 0) = -1 EINVAL (Invalid argument)
100 1.005 clone(child_stack=NULL, flags=SIGCHLD) = 300
300 1.006 futex(0x1, FUTEX_WAIT_PRIVATE, 2, NULL <unfinished ...>
300 1.007 close(9) = -1 EBADF (Bad file descriptor)
200 1.008 <... write resumed>) = 65536
"
    );
    let v = analyse_after(
        &t,
        None,
        &[AuditCheck::UnboundedWaits, AuditCheck::FdLifecycle],
        false,
    );
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].pid, 200);
    assert!(
        v[0].detail
            .contains("inside write() with no timeout when the run was found hung"),
        "{}",
        v[0].detail
    );
}

#[test]
fn pipes_and_dups_make_descriptors_too() {
    let t = "\
100 1.000 pipe2([3, 4], O_CLOEXEC) = 0
100 1.001 dup(3)                  = 5
100 1.002 read(5, \"\", 1) = 0
100 1.003 close(5)                = 0
100 1.004 close(4)                = 0
100 1.005 close(3)                = 0
";
    assert!(analyse(t, LIFECYCLE).is_empty());
}

#[test]
fn a_number_reused_by_any_descriptor_maker_is_a_new_descriptor() {
    // Gloo closes a probe socket, then epoll_create (not epoll_create1) reuses its number.
    for maker in MAKES_ONE_FD {
        let t = format!(
            "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_TCP) = 3\n\
             100 1.000 bind(3, {{sa_family=AF_INET}}, 16) = 0\n\
             100 1.001 close(3)                = 0\n\
             100 1.002 {maker}(1)                = 3\n\
             100 1.003 epoll_ctl(3, EPOLL_CTL_ADD, 4, {{events=EPOLLIN}}) = 0\n"
        );
        assert!(
            analyse(&t, LIFECYCLE).is_empty(),
            "{maker}: {:?}",
            checks_of(&t, LIFECYCLE)
        );
    }
    // Without the maker, the same use is one after close.
    let t = "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_TCP) = 3\n\
             100 1.000 bind(3, {sa_family=AF_INET}, 16) = 0\n\
             100 1.001 close(3)                = 0\n\
             100 1.003 epoll_ctl(3, EPOLL_CTL_ADD, 4, {events=EPOLLIN}) = 0\n";
    assert_eq!(checks_of(t, LIFECYCLE), vec!["use after close"]);
}

#[test]
fn strace_traces_every_descriptor_maker_and_skips_those_an_architecture_lacks() {
    let filter = trace_filter();
    for maker in MAKES_ONE_FD.iter().chain(MAKES_TWO_FDS) {
        assert!(
            filter.contains(&format!(",?{maker}")),
            "{maker} is not traced"
        );
    }
}

#[test]
fn short_pids_padded_with_spaces_parse_the_same() {
    let padded = CORRECT.replace("100 ", "100  ").replace("101 ", "101   ");
    assert!(analyse(&padded, LIFECYCLE).is_empty());
    let broken = "\
7868  1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
7868  1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[7869]}, 88) = 7869
7869  1.002 recvfrom(7,  <unfinished ...>
7868  1.003 close(7)                = 0
";
    assert_eq!(checks_of(broken, LIFECYCLE)[0], "close while in use");
}

#[test]
fn lines_strace_did_not_write_as_calls_are_ignored() {
    let t = "\
garbage
100 1.000 --- SIGCHLD {si_signo=SIGCHLD} ---
100 1.001 +++ killed by SIGKILL +++
not-a-pid 1.0 close(3) = 0
";
    assert!(analyse(t, LIFECYCLE).is_empty());
}

#[test]
fn the_strace_command_carries_seeded_perturbations() {
    let p = Perturb {
        syscall: "recvfrom".into(),
        delay_enter: None,
        delay_exit: Some(HumanDuration(std::time::Duration::from_micros(200))),
        probability: Some(0.25),
        when: None,
    };
    let a = strace_command(&[], std::slice::from_ref(&p), 7, Path::new("/tmp/t"));
    let b = strace_command(&[], std::slice::from_ref(&p), 7, Path::new("/tmp/t"));
    assert_eq!(a, b, "the same seed gives the same perturbation");
    let inject = a.iter().find(|x| x.starts_with("--inject=")).unwrap();
    assert!(
        inject.starts_with("--inject=recvfrom:delay_exit=200:when="),
        "{inject}"
    );
    assert!(inject.ends_with("+4"), "every 4th call: {inject}");
    assert_eq!(&a[a.len() - 3..], ["-o", "/tmp/t", "--"]);
    let always = Perturb {
        probability: None,
        ..p.clone()
    };
    let c = strace_command(&[], &[always], 7, Path::new("/tmp/t"));
    assert!(
        c.contains(&"--inject=recvfrom:delay_exit=200".to_string()),
        "{c:?}"
    );
    // The exact form replays the same calls without the seed.
    let exact = exact_perturbations(std::slice::from_ref(&p), 7);
    assert_eq!(exact[0].probability, None);
    let d = strace_command(&[], &exact, 99, Path::new("/tmp/t"));
    assert_eq!(a, d, "exact perturbations replay without the seed");
}

#[test]
fn the_observer_is_told_the_calls_strace_would_be() {
    let p = Perturb {
        syscall: "recvfrom".into(),
        delay_enter: None,
        delay_exit: Some(HumanDuration(std::time::Duration::from_micros(200))),
        probability: Some(0.25),
        when: None,
    };
    let inject = strace_command(&[], std::slice::from_ref(&p), 7, Path::new("/tmp/t"))
        .into_iter()
        .find(|x| x.starts_with("--inject="))
        .unwrap();
    let when = inject.rsplit("when=").next().unwrap();
    let (first, last, step) = crate::model::scenario::parse_when(when).unwrap();
    let rules = preload_rules(std::slice::from_ref(&p), 7);
    assert_eq!(
        rules,
        format!(
            "recvfrom,0,200,{first},{},{}",
            last.unwrap_or(0),
            step.unwrap_or(0)
        )
    );
    let both = Perturb {
        syscall: "poll".into(),
        delay_enter: Some(HumanDuration(std::time::Duration::from_millis(1))),
        probability: None,
        when: Some("2..9".into()),
        ..p.clone()
    };
    let always = Perturb {
        probability: None,
        ..p
    };
    assert_eq!(
        preload_rules(&[both, always], 7),
        "poll,1000,200,2,9,0;recvfrom,0,200,0,0,0"
    );
}

#[test]
fn the_observer_delays_what_it_can_reach_and_strace_the_rest_with_why() {
    let poll = Perturb {
        syscall: "poll".into(),
        delay_enter: None,
        delay_exit: Some(HumanDuration(std::time::Duration::from_micros(100))),
        probability: None,
        when: None,
    };
    let (by, why) = perturb_mechanism(std::slice::from_ref(&poll), &[], false);
    if crate::rank::perturb_observer::available() {
        assert_eq!((by, why), (PerturbBy::Preload, None));
    }
    let futex = Perturb {
        syscall: "futex".into(),
        ..poll.clone()
    };
    let (by, why) = perturb_mechanism(&[poll.clone(), futex], &[], false);
    assert_eq!(by, PerturbBy::Strace);
    assert!(why.is_some_and(|w| w.contains("futex") || w.contains("built without")));
    let (by, why) = perturb_mechanism(std::slice::from_ref(&poll), &["busybox".into()], false);
    assert_eq!(by, PerturbBy::Strace);
    assert!(why.is_some_and(|w| w.contains("busybox") || w.contains("built without")));
    let (by, _) = perturb_mechanism(&[poll], &[], true);
    assert_eq!(
        by,
        PerturbBy::Strace,
        "a Slurm step's ranks start under strace"
    );
}

#[test]
fn a_program_with_an_interpreter_is_dynamic_and_anything_else_is_not_taken_for_static() {
    assert!(!statically_linked(Path::new("/bin/sh")));
    assert!(!statically_linked(Path::new("/nonexistent/program")));
    let script = std::env::temp_dir().join(format!("wringer-script-{}", std::process::id()));
    std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
    assert!(!statically_linked(&script));
    let _ = std::fs::remove_file(&script);
}
