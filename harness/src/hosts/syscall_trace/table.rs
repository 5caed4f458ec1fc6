//! The syscalls the eBPF backend records, by this architecture's numbers (the same set as
//! strace's `-e trace=` in the audit), with how many arguments each is printed with and the
//! user memory its event carries.

/// A read of user memory that goes with a syscall's event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Capture {
    /// At entry (arguments the call reads) or at return (results it writes, e.g. pipe fds).
    pub at_exit: bool,
    /// The argument holding the pointer.
    pub arg: u8,
    /// Bytes to read (at most 128).
    pub len: u16,
    /// When set, at most `args[n] * mul` bytes: a write's length, a poll's count of entries.
    pub len_from: Option<(u8, u8)>,
    pub string: bool,
}

const fn bytes(arg: u8, len: u16) -> Capture {
    Capture {
        at_exit: false,
        arg,
        len,
        len_from: None,
        string: false,
    }
}

const fn string(arg: u8, len: u16) -> Capture {
    Capture {
        string: true,
        ..bytes(arg, len)
    }
}

const fn counted(arg: u8, len: u16, count: u8, mul: u8) -> Capture {
    Capture {
        len_from: Some((count, mul)),
        ..bytes(arg, len)
    }
}

/// A write's bytes, read at return: the kernel has read them by then, so their pages are in
/// (a BPF program cannot fault a page in, and a string constant's page may not be yet).
const fn written(arg: u8, len: u16, count: u8) -> Capture {
    Capture {
        at_exit: true,
        ..counted(arg, len, count, 1)
    }
}

const fn returned(arg: u8, len: u16) -> Capture {
    Capture {
        at_exit: true,
        ..bytes(arg, len)
    }
}

/// Bytes of a write shown, as strace's `-s 96`.
pub const SHOWN: u16 = 96;

/// What the backend knows about one syscall.
#[derive(Clone, Copy, Debug)]
pub struct Syscall {
    pub name: &'static str,
    pub nr: i64,
    /// Arguments printed.
    pub arity: u8,
    pub captures: [Option<Capture>; 2],
}

macro_rules! syscalls {
    ($($name:ident / $arity:literal $(: $c0:expr $(, $c1:expr)?)?;)*) => {
        &[$(Syscall {
            name: stringify!($name),
            nr: paste_nr!($name),
            arity: $arity,
            captures: captures!($($c0 $(, $c1)?)?),
        }),*]
    };
}

macro_rules! paste_nr {
    ($name:ident) => {
        nr::$name
    };
}

macro_rules! captures {
    () => {
        [None, None]
    };
    ($c0:expr) => {
        [Some($c0), None]
    };
    ($c0:expr, $c1:expr) => {
        [Some($c0), Some($c1)]
    };
}

/// The numbers, under the syscalls' own names (libc's `SYS_` constants).
#[allow(non_upper_case_globals)]
mod nr {
    macro_rules! numbers {
        ($($name:ident),*) => { $(pub const $name: i64 = paste::$name;)* };
    }
    mod paste {
        #[cfg(not(target_arch = "x86_64"))]
        pub use libc::SYS_sendfile as sendfile;
        pub use libc::{
            SYS_accept as accept, SYS_accept4 as accept4, SYS_bind as bind, SYS_clone as clone,
            SYS_clone3 as clone3, SYS_close as close, SYS_close_range as close_range,
            SYS_connect as connect, SYS_copy_file_range as copy_file_range, SYS_dup as dup,
            SYS_dup3 as dup3, SYS_epoll_create1 as epoll_create1, SYS_epoll_ctl as epoll_ctl,
            SYS_epoll_pwait as epoll_pwait, SYS_epoll_pwait2 as epoll_pwait2,
            SYS_eventfd2 as eventfd2, SYS_execve as execve, SYS_execveat as execveat,
            SYS_exit as exit, SYS_exit_group as exit_group, SYS_fanotify_init as fanotify_init,
            SYS_fcntl as fcntl, SYS_futex as futex, SYS_getpeername as getpeername,
            SYS_getsockname as getsockname, SYS_getsockopt as getsockopt,
            SYS_inotify_init1 as inotify_init1, SYS_io_uring_setup as io_uring_setup,
            SYS_ioctl as ioctl, SYS_kill as kill, SYS_listen as listen,
            SYS_memfd_create as memfd_create, SYS_open_by_handle_at as open_by_handle_at,
            SYS_openat as openat, SYS_openat2 as openat2, SYS_perf_event_open as perf_event_open,
            SYS_pidfd_getfd as pidfd_getfd, SYS_pidfd_open as pidfd_open, SYS_pipe2 as pipe2,
            SYS_ppoll as ppoll, SYS_prctl as prctl, SYS_pread64 as pread64, SYS_preadv as preadv,
            SYS_preadv2 as preadv2, SYS_pselect6 as pselect6, SYS_pwrite64 as pwrite64,
            SYS_pwritev as pwritev, SYS_pwritev2 as pwritev2, SYS_read as read, SYS_readv as readv,
            SYS_recvfrom as recvfrom, SYS_recvmmsg as recvmmsg, SYS_recvmsg as recvmsg,
            SYS_sendmmsg as sendmmsg, SYS_sendmsg as sendmsg, SYS_sendto as sendto,
            SYS_setsockopt as setsockopt, SYS_shutdown as shutdown, SYS_signalfd4 as signalfd4,
            SYS_socket as socket, SYS_socketpair as socketpair, SYS_splice as splice,
            SYS_tee as tee, SYS_tgkill as tgkill, SYS_timerfd_create as timerfd_create,
            SYS_tkill as tkill, SYS_userfaultfd as userfaultfd, SYS_wait4 as wait4,
            SYS_waitid as waitid, SYS_write as write, SYS_writev as writev,
        };
        #[cfg(target_arch = "x86_64")]
        pub use libc::{
            SYS_creat as creat, SYS_dup2 as dup2, SYS_epoll_create as epoll_create,
            SYS_epoll_wait as epoll_wait, SYS_eventfd as eventfd, SYS_fork as fork,
            SYS_inotify_init as inotify_init, SYS_open as open, SYS_pipe as pipe, SYS_poll as poll,
            SYS_select as select, SYS_sendfile as sendfile, SYS_signalfd as signalfd,
            SYS_vfork as vfork,
        };
    }
    numbers!(
        accept,
        accept4,
        bind,
        clone,
        clone3,
        close,
        close_range,
        connect,
        copy_file_range,
        dup,
        dup3,
        epoll_create1,
        epoll_ctl,
        epoll_pwait,
        epoll_pwait2,
        eventfd2,
        execve,
        execveat,
        exit,
        exit_group,
        fanotify_init,
        fcntl,
        futex,
        getpeername,
        getsockname,
        getsockopt,
        inotify_init1,
        io_uring_setup,
        ioctl,
        kill,
        listen,
        memfd_create,
        open_by_handle_at,
        openat,
        openat2,
        perf_event_open,
        pidfd_getfd,
        pidfd_open,
        pipe2,
        ppoll,
        prctl,
        pread64,
        preadv,
        preadv2,
        pselect6,
        pwrite64,
        pwritev,
        pwritev2,
        read,
        readv,
        recvfrom,
        recvmmsg,
        recvmsg,
        sendmmsg,
        sendmsg,
        sendto,
        setsockopt,
        shutdown,
        signalfd4,
        socket,
        socketpair,
        splice,
        tee,
        tgkill,
        timerfd_create,
        tkill,
        userfaultfd,
        wait4,
        waitid,
        write,
        writev,
        sendfile
    );
    #[cfg(target_arch = "x86_64")]
    numbers!(
        creat,
        dup2,
        epoll_create,
        epoll_wait,
        eventfd,
        fork,
        inotify_init,
        open,
        pipe,
        poll,
        select,
        signalfd,
        vfork
    );
}

/// Every architecture's recorded syscalls.
const COMMON: &[Syscall] = syscalls! {
    read/3; readv/3; pread64/4; preadv/4; preadv2/5;
    write/3: written(1, SHOWN, 2); writev/3; pwrite64/4; pwritev/4; pwritev2/5;
    close/1; close_range/3; dup/1; dup3/3; fcntl/3; ioctl/3;
    socket/3; socketpair/4: returned(3, 8); bind/3; listen/2; accept/3; accept4/4; connect/3;
    getsockname/3; getpeername/3; getsockopt/5; setsockopt/5; shutdown/2;
    sendto/6: written(1, SHOWN, 2); recvfrom/6; sendmsg/3; recvmsg/3; sendmmsg/4; recvmmsg/5;
    epoll_create1/1; epoll_ctl/4; epoll_pwait/6; epoll_pwait2/6;
    ppoll/5: counted(0, 128, 1, 8); pselect6/6: bytes(1, 128), bytes(2, 128);
    sendfile/4; splice/6; tee/4; copy_file_range/6;
    openat/4: string(1, 96); openat2/4: string(1, 96); open_by_handle_at/3;
    eventfd2/2; timerfd_create/2; signalfd4/4; memfd_create/2; inotify_init1/1;
    fanotify_init/2; userfaultfd/1; pidfd_open/2; pidfd_getfd/3; perf_event_open/5;
    io_uring_setup/2; pipe2/2: returned(0, 8);
    clone/5; clone3/2: bytes(0, 8); execve/3: string(0, 96); execveat/5: string(1, 96);
    exit/1; exit_group/1; wait4/4; waitid/5; kill/2; tkill/2; tgkill/3;
    prctl/5: string(1, 16);
};

#[cfg(target_arch = "x86_64")]
const ARCH: &[Syscall] = syscalls! {
    open/3: string(0, 96); creat/2: string(0, 96); dup2/2; eventfd/1; signalfd/3;
    epoll_create/1; epoll_wait/4; poll/3: counted(0, 128, 1, 8);
    select/5: bytes(1, 128), bytes(2, 128); inotify_init/0; pipe/1: returned(0, 8);
    fork/0; vfork/0;
};
#[cfg(not(target_arch = "x86_64"))]
const ARCH: &[Syscall] = &[];

/// `futex`, recorded only for the check of waits without a bound (threads wait in it often).
pub const FUTEX: Syscall = Syscall {
    name: "futex",
    nr: nr::futex,
    arity: 6,
    captures: [None, None],
};

/// Every syscall recorded on this architecture (`futex` with `with_futex`).
pub fn recorded(with_futex: bool) -> impl Iterator<Item = &'static Syscall> {
    COMMON
        .iter()
        .chain(ARCH)
        .chain(with_futex.then_some(&FUTEX))
}

/// A recorded syscall by number (looked up once per event: a table, not a search).
pub fn by_nr(nr: i64) -> Option<&'static Syscall> {
    static BY_NR: std::sync::OnceLock<Vec<Option<&'static Syscall>>> = std::sync::OnceLock::new();
    let table = BY_NR.get_or_init(|| {
        let mut t = vec![None; 512];
        for s in recorded(true) {
            t[s.nr as usize] = Some(s);
        }
        t
    });
    table.get(usize::try_from(nr).ok()?).copied().flatten()
}

/// The 16-byte entry the kernel side reads for one syscall (`struct capture` in
/// `audit.bpf.c`).
pub fn capture_entry(s: &Syscall) -> [u8; 16] {
    let mut e = [0u8; 16];
    for (i, c) in s.captures.iter().enumerate() {
        let Some(c) = c else { continue };
        e[i] = if c.at_exit { 2 } else { 1 };
        e[2 + i] = c.arg;
        e[4 + 2 * i..6 + 2 * i].copy_from_slice(&c.len.to_ne_bytes());
        let (from, mul) = c.len_from.unwrap_or((255, 0));
        e[8 + i] = from;
        e[10 + i] = mul;
        e[12 + i] = c.string as u8;
    }
    e[14] = 1;
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recorded_name_is_one_the_checker_knows_and_numbers_are_unique() {
        let all: Vec<&Syscall> = recorded(true).collect();
        let mut nrs: Vec<i64> = all.iter().map(|s| s.nr).collect();
        nrs.sort_unstable();
        nrs.dedup();
        assert_eq!(nrs.len(), all.len(), "a number appears twice");
        assert!(all.iter().all(|s| (0..512).contains(&s.nr)));
        for name in [
            "close",
            "read",
            "epoll_wait",
            "poll",
            "select",
            "pipe2",
            "clone3",
        ] {
            if cfg!(not(target_arch = "x86_64")) && ["poll", "select", "epoll_wait"].contains(&name)
            {
                continue;
            }
            assert!(all.iter().any(|s| s.name == name), "{name} is not recorded");
        }
    }

    #[test]
    fn a_capture_entry_has_the_kernel_sides_layout() {
        let write = recorded(false).find(|s| s.name == "write").unwrap();
        let e = capture_entry(write);
        assert_eq!(e[0], 2, "read at return");
        assert_eq!(e[2], 1, "from the buffer argument");
        assert_eq!(u16::from_ne_bytes([e[4], e[5]]), SHOWN);
        assert_eq!((e[8], e[10]), (2, 1), "at most args[2] bytes");
        assert_eq!(e[14], 1, "wanted");
        let pipe2 = recorded(false).find(|s| s.name == "pipe2").unwrap();
        assert_eq!(capture_entry(pipe2)[0], 2, "pipe2's fds are read at return");
    }
}
