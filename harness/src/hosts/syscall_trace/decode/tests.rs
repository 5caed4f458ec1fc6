use super::*;
use crate::hosts::syscall_trace::render::Kind;
use crate::hosts::syscall_trace::table;
use crate::model::sync_marker::SyncKind;

fn ev(name: &str, args: [u64; 6], ret: i64) -> (&'static Syscall, Event) {
    let s = table::recorded(true).find(|s| s.name == name).unwrap();
    let e = Event {
        ts: 1,
        tid: 7,
        tgid: 7,
        kind: Kind::Enter,
        nr: s.nr,
        args,
        ret,
        captures: [vec![], vec![]],
        site: 0,
    };
    (s, e)
}

fn done(name: &str, args: [u64; 6], ret: i64) -> Call {
    let (s, e) = ev(name, args, 0);
    let mut exit = e.clone();
    exit.kind = Kind::Exit;
    exit.ret = ret;
    call(s, &e, Some(&exit))
}

#[test]
fn results_and_descriptors_come_from_the_numbers() {
    let c = done("close", [9, 0, 0, 0, 0, 0], -(libc::EBADF as i64));
    assert!(c.ret.is_error("EBADF"));
    assert_eq!(
        (c.fds.clone(), c.operand),
        (vec![9], Operand::Close { fd: 9 })
    );
    let c = done("socket", [2, 1 | libc::O_CLOEXEC as u64, 0, 0, 0, 0], 5);
    assert_eq!((c.made.clone(), c.cloexec), (vec![5], true));
    let c = done("socket", [2, 1, 0, 0, 0, 0], -(libc::EMFILE as i64));
    assert!(c.made.is_empty());
    let c = done("fcntl", [4, libc::F_DUPFD_CLOEXEC as u64, 10, 0, 0, 0], 10);
    assert_eq!((c.made.clone(), c.cloexec), (vec![10], true));
    // A probe names a number without using it.
    assert!(done("fcntl", [255, libc::F_GETFD as u64, 0, 0, 0, 0], -9)
        .fds
        .is_empty());
    let c = done("fcntl", [3, libc::F_SETFD as u64, 1, 0, 0, 0], 0);
    assert_eq!(c.operand, Operand::SetCloexec { fd: 3, on: true });
    let c = done("close_range", [3, u32::MAX as u64, 4, 0, 0, 0], 0);
    assert_eq!(
        c.operand,
        Operand::CloseRange {
            first: 3,
            last: u32::MAX as i64,
            cloexec: true
        }
    );
}

#[test]
fn what_a_call_reads_or_writes_in_memory_is_decoded() {
    let (s, mut e) = ev("poll", [0x10, 2, u64::MAX, 0, 0, 0], 0);
    let mut fds = vec![];
    for fd in [7i32, -1, 9] {
        fds.extend(fd.to_ne_bytes());
        fds.extend([1, 0, 0, 0]);
    }
    e.captures[0] = fds;
    let c = call(s, &e, None);
    assert_eq!(c.fds, vec![7, 9]);
    assert!(c.unbounded, "a negative timeout");
    assert_eq!(c.ret, Ret::Unknown);

    let (s, e) = ev("pipe2", [0x20, libc::O_CLOEXEC as u64, 0, 0, 0, 0], 0);
    let mut exit = e.clone();
    exit.captures[0] = [3i32.to_ne_bytes(), 4i32.to_ne_bytes()].concat();
    assert_eq!(call(s, &e, Some(&exit)).made, vec![3, 4]);

    let (s, mut e) = ev("pselect6", [6, 0x1, 0x2, 0, 0, 0], 0);
    e.captures = [vec![0b0010_1000], vec![0b0000_1000]];
    let c = call(s, &e, None);
    assert_eq!(c.fds, vec![3, 5]);
    assert!(c.unbounded);

    let (s, mut e) = ev("clone3", [0x30, 88, 0, 0, 0, 0], 0);
    e.captures[0] = (libc::CLONE_VM as u64 | libc::CLONE_THREAD as u64)
        .to_ne_bytes()
        .to_vec();
    let mut exit = e.clone();
    exit.ret = 4242;
    assert_eq!(call(s, &e, Some(&exit)).cloned(), Some((4242, true)));

    let (s, mut e) = ev("prctl", [libc::PR_SET_NAME as u64, 0x40, 0, 0, 0, 0], 0);
    e.captures[0] = b"wringer-rx-12\0\0\0".to_vec();
    assert_eq!(call(s, &e, None).operand, Operand::Receiver(12));

    let (s, e) = ev("prctl", [SYNC_MARKER, 2, 0x5000, 0x6000, 0x7, 0], 0);
    let m = *call(s, &e, None).marker().unwrap();
    assert_eq!(
        (m.kind, m.object, m.site, m.aux),
        (SyncKind::Acquire, 0x5000, 0x6000, 7)
    );

    let (s, e) = ev("write", [5, 0x50, 40, 0, 0, 0], 0);
    let mut exit = e.clone();
    exit.captures[0] = br#"{"kind":"step-result","step":1}"#.to_vec();
    assert_eq!(
        call(s, &e, Some(&exit)).operand,
        Operand::Step(StepMark::End)
    );
}

#[test]
fn timeouts_decide_what_is_unbounded() {
    let (s, e) = ev(
        "futex",
        [
            0x10,
            (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as u64,
            2,
            0,
            0,
            0,
        ],
        0,
    );
    let c = call(s, &e, None);
    assert!(c.unbounded);
    assert_eq!(
        c.operand,
        Operand::Futex {
            addr: 0x10,
            op: FutexOp::Wait
        }
    );
    let (s, e) = ev("futex", [0x10, libc::FUTEX_WAIT as u64, 2, 0x99, 0, 0], 0);
    assert!(!call(s, &e, None).unbounded);
    let (s, e) = ev("epoll_wait", [5, 0x1, 8, 500, 0, 0], 0);
    assert!(!call(s, &e, None).unbounded);
    let (s, e) = ev("epoll_wait", [5, 0x1, 8, u64::MAX, 0, 0], 0);
    assert!(call(s, &e, None).unbounded);
    let (s, e) = ev("wait4", [u64::MAX, 0, libc::WNOHANG as u64, 0, 0, 0], 0);
    assert!(!call(s, &e, None).unbounded);
    let (s, e) = ev("recvmmsg", [3, 0x1, 8, 0, 0, 0], 0);
    assert!(call(s, &e, None).unbounded, "no timeout given");
    let (s, e) = ev("recvmmsg", [3, 0x1, 8, 0, 0x77, 0], 0);
    assert!(!call(s, &e, None).unbounded);
}
