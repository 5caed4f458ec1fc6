//! Lazy connects and connect deadlines (seed 003, Gloo): both sides of a connect are bounded,
//! every wait fires exactly once, and sockets for stale generations never reach later waiters.

mod common;

use std::net::TcpListener;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use wringer_transport::{
    connect, ConnectOptions, Connection, Error, Hello, Listener, ListenerOptions, RejectReason,
    Result,
};

const TOKEN: u128 = 0xfeed_beef;

fn listener() -> Arc<Listener> {
    Arc::new(Listener::bind(local(0), ListenerOptions::new(TOKEN)).unwrap())
}

fn hello(sequence: u64, generation: u64) -> Hello {
    Hello {
        rank: 7,
        sequence,
        generation,
        token: TOKEN,
    }
}

fn connect_in_background(l: &Listener, hello: Hello) -> JoinHandle<Result<Connection>> {
    let addr = l.local_addr();
    std::thread::spawn(move || connect(addr, &hello, &ConnectOptions::default()))
}

/// Bounded wait for the listener to show `n` pending waits.
fn wait_pending(l: &Listener, n: usize) {
    let deadline = Instant::now() + GENEROUS;
    while l.stats().pending != n {
        assert!(
            Instant::now() < deadline,
            "never saw {n} pending waits: {:?}",
            l.stats()
        );
        std::thread::yield_now();
    }
}

fn round_trip(a: &Connection, b: &Connection) {
    a.send(b"ping", GENEROUS).unwrap();
    assert_eq!(b.recv(GENEROUS).unwrap().payload, b"ping");
    b.send(b"pong", GENEROUS).unwrap();
    assert_eq!(a.recv(GENEROUS).unwrap().payload, b"pong");
}

#[test]
fn listener_timeout() {
    let l = listener();
    let started = Instant::now();
    let result = l.wait_for(1, Duration::from_millis(100));
    let took = started.elapsed();
    assert!(
        matches!(result, Err(Error::Timeout { .. })),
        "got {result:?}"
    );
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(5),
        "took {took:?}"
    );
    assert_eq!(l.stats().timed_out, 1);
    assert_eq!(l.stats().pending, 0);
}

#[test]
fn listener_no_spurious_timeout() {
    let l = listener();
    let initiator = connect_in_background(&l, hello(1, 0));
    let timeout = Duration::from_millis(300);
    let accepted = l.wait_for(1, timeout).unwrap();
    let initiated = initiator.join().unwrap().unwrap();
    // Outlive the wait's deadline: nothing may fire afterwards.
    std::thread::sleep(timeout * 2);
    assert_eq!(l.stats().timed_out, 0);
    assert_eq!(l.stats().matched, 1);
    round_trip(&initiated, &accepted);
}

#[test]
fn listener_late_socket_after_timeout() {
    let l = listener();
    assert!(matches!(
        l.wait_for(5, Duration::from_millis(50)),
        Err(Error::Timeout { .. })
    ));
    // The initiator of the timed-out generation shows up late: refused and counted.
    let late = connect(l.local_addr(), &hello(5, 0), &ConnectOptions::default());
    assert!(
        matches!(late, Err(Error::Rejected(RejectReason::StaleGeneration))),
        "got {late:?}"
    );
    assert_eq!(l.stats().stale_dropped, 1);
    // The next generation of the same sequence still works.
    let initiator = connect_in_background(&l, hello(5, 1));
    let accepted = l.wait_for(5, GENEROUS).unwrap();
    round_trip(&initiator.join().unwrap().unwrap(), &accepted);
}

#[test]
fn sequence_reuse_across_two_groups() {
    let l = listener();
    // Group A uses sequence 3 (generation 0); group B reuses it (generation 1), and B's peer
    // arrives before B's wait starts, so it is parked and then matched.
    let a_init = connect_in_background(&l, hello(3, 0));
    let a = l.wait_for(3, GENEROUS).unwrap();
    let a_peer = a_init.join().unwrap().unwrap();
    let b_peer = connect(l.local_addr(), &hello(3, 1), &ConnectOptions::default()).unwrap();
    assert_eq!(l.stats().parked, 1);
    let b = l.wait_for(3, GENEROUS).unwrap();
    assert_eq!(l.stats().parked, 0);
    round_trip(&a_peer, &a);
    round_trip(&b_peer, &b);
    // Each peer really is on its own group's connection.
    a_peer.send(b"A", GENEROUS).unwrap();
    b_peer.send(b"B", GENEROUS).unwrap();
    assert_eq!(a.recv(GENEROUS).unwrap().payload, b"A");
    assert_eq!(b.recv(GENEROUS).unwrap().payload, b"B");
}

#[test]
fn duplicate_pending_wait_is_an_error() {
    let l = listener();
    let first = {
        let l = Arc::clone(&l);
        std::thread::spawn(move || l.wait_for(9, GENEROUS))
    };
    wait_pending(&l, 1);
    assert!(matches!(
        l.wait_for(9, GENEROUS),
        Err(Error::DuplicateWait { sequence: 9 })
    ));
    // The first wait is untouched by the refused duplicate and still completes.
    let peer = connect(l.local_addr(), &hello(9, 0), &ConnectOptions::default()).unwrap();
    round_trip(&peer, &first.join().unwrap().unwrap());
}

#[test]
fn shutdown_fails_every_pending_waiter() {
    let l = listener();
    let waiters: Vec<_> = (0..3)
        .map(|seq| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let started = Instant::now();
                (l.wait_for(seq, Duration::from_secs(60)), started.elapsed())
            })
        })
        .collect();
    wait_pending(&l, 3);
    l.shutdown();
    for w in waiters {
        let (result, took) = w.join().unwrap();
        assert!(
            matches!(result, Err(Error::ListenerClosed)),
            "got {result:?}"
        );
        assert!(
            took < Duration::from_secs(10),
            "waiter released after {took:?}"
        );
    }
    assert!(matches!(
        l.wait_for(0, GENEROUS),
        Err(Error::ListenerClosed)
    ));
}

#[test]
fn pending_map_is_bounded() {
    let mut opts = ListenerOptions::new(TOKEN);
    opts.max_pending = 2;
    let l = Arc::new(Listener::bind(local(0), opts).unwrap());
    let waiters: Vec<_> = (0..2)
        .map(|seq| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || l.wait_for(seq, Duration::from_secs(60)))
        })
        .collect();
    wait_pending(&l, 2);
    assert!(matches!(
        l.wait_for(2, GENEROUS),
        Err(Error::PendingLimit { max: 2 })
    ));
    l.shutdown();
    for w in waiters {
        assert!(matches!(w.join().unwrap(), Err(Error::ListenerClosed)));
    }
}

#[test]
fn zero_timeout_is_rejected() {
    let l = listener();
    assert!(matches!(
        l.wait_for(1, Duration::ZERO),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(l.stats().pending, 0);
}

#[test]
fn wrong_token_is_rejected_and_counted() {
    let l = listener();
    let intruder = Hello {
        token: TOKEN + 1,
        ..hello(1, 0)
    };
    let result = connect(l.local_addr(), &intruder, &ConnectOptions::default());
    assert!(
        matches!(result, Err(Error::Rejected(RejectReason::BadToken))),
        "got {result:?}"
    );
    assert_eq!(l.stats().bad_token, 1);
}

/// The backstop the Gloo review insisted on: a peer that accepts and never answers the hello.
#[test]
fn initiator_backstop_against_a_listener_that_never_answers() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let opts = ConnectOptions {
        hello_timeout: Duration::from_millis(200),
        ..ConnectOptions::default()
    };
    let started = Instant::now();
    let result = connect(addr, &hello(1, 0), &opts);
    assert!(
        matches!(
            result,
            Err(Error::Timeout {
                during: "handshake",
                ..
            })
        ),
        "got {result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    drop(silent);
}

#[test]
fn initiator_fails_fast_when_the_listener_accepts_and_dies() {
    let dying = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dying.local_addr().unwrap();
    let killer = std::thread::spawn(move || drop(dying.accept().unwrap()));
    let started = Instant::now();
    let result = connect(addr, &hello(1, 0), &ConnectOptions::default());
    killer.join().unwrap();
    assert!(
        matches!(result, Err(Error::Handshake { .. })),
        "got {result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn connect_to_a_closed_port_ends_in_a_timeout_error() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let opts = ConnectOptions {
        deadline: Duration::from_millis(300),
        ..ConnectOptions::default()
    };
    let started = Instant::now();
    let result = connect(local(port), &hello(1, 0), &opts);
    let took = started.elapsed();
    match result {
        Err(Error::ConnectTimeout { attempts, .. }) => {
            assert!(attempts > 1, "no retries");
            // Backoff doubles from 1 ms: about nine attempts fit in 300 ms, not hundreds.
            assert!(
                attempts <= 30,
                "{attempts} attempts: the backoff does not grow"
            );
        }
        other => panic!("expected ConnectTimeout, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_secs(5),
        "took {took:?}"
    );
}

#[test]
fn a_stalled_hello_does_not_block_other_peers() {
    let l = listener();
    let _stalled = std::net::TcpStream::connect(l.local_addr()).unwrap();
    let initiator = connect_in_background(&l, hello(4, 0));
    let accepted = l.wait_for(4, GENEROUS).unwrap();
    round_trip(&initiator.join().unwrap().unwrap(), &accepted);
}

#[test]
fn connect_refuses_a_zero_deadline_or_hello_timeout() {
    let l = listener();
    for opts in [
        ConnectOptions {
            deadline: Duration::ZERO,
            ..ConnectOptions::default()
        },
        ConnectOptions {
            hello_timeout: Duration::ZERO,
            ..ConnectOptions::default()
        },
    ] {
        assert!(matches!(
            connect(l.local_addr(), &hello(1, 0), &opts),
            Err(Error::InvalidArgument(_))
        ));
    }
}

#[test]
fn a_hello_that_comes_late_but_in_time_is_accepted() {
    use std::io::{Read, Write};
    use wringer_transport::frame::{Frame, Kind};
    let l = listener();
    let addr = l.local_addr();
    let initiator = std::thread::spawn(move || {
        let mut raw = std::net::TcpStream::connect(addr).unwrap();
        // Well inside the listener's 5 s hello timeout, but not at once.
        std::thread::sleep(Duration::from_millis(150));
        let h = Frame::new(Kind::Hello, 0, hello(5, 0).encode().to_vec()).unwrap();
        raw.write_all(&h.encode()).unwrap();
        let mut ack = [0u8; 20];
        raw.set_read_timeout(Some(GENEROUS)).unwrap();
        raw.read_exact(&mut ack).unwrap();
        raw
    });
    let accepted = l.wait_for(5, GENEROUS).unwrap();
    let _raw = initiator.join().unwrap();
    assert_eq!(accepted.peer_addr().ip(), addr.ip());
}

#[test]
fn dropping_the_listener_closes_its_port() {
    let l = Listener::bind(local(0), ListenerOptions::new(TOKEN)).unwrap();
    let addr = l.local_addr();
    drop(l);
    let refused = std::net::TcpStream::connect_timeout(&addr, GENEROUS);
    assert!(refused.is_err(), "the port still accepts after the drop");
}

/// CPU time of this whole process.
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn out_of_descriptors_the_listener_backs_off_then_serves() {
    // Runs in a process of its own (nextest), whose descriptor limit it lowers.
    let l = listener();
    let initiator_socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .unwrap();
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0);
    let low = libc::rlimit {
        rlim_cur: (open_fds() + 8) as libc::rlim_t,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: `low` is a valid rlimit for the call to read.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
    let mut hog = vec![];
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hog.push(f);
    }
    // The connection waits in the backlog; every accept fails with EMFILE.
    initiator_socket.connect(&l.local_addr().into()).unwrap();
    let (cpu, wall) = (process_cpu(), Instant::now());
    std::thread::sleep(Duration::from_millis(300));
    let spent = process_cpu() - cpu;
    assert!(
        spent < wall.elapsed() / 3,
        "{spent:?} of CPU in {:?}: the accept loop spins on EMFILE",
        wall.elapsed()
    );
    drop(hog);
    // SAFETY: `limit` is the valid rlimit getrlimit filled in above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    // With descriptors back, the waiting connection is accepted (it never says hello, so the
    // listener counts it as accepted and drops it at its hello timeout).
    let deadline = Instant::now() + GENEROUS;
    while l.stats().accepted == 0 {
        assert!(Instant::now() < deadline, "never accepted: {:?}", l.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_listener_refuses_zero_limits() {
    let base = ListenerOptions::new(TOKEN);
    for opts in [
        ListenerOptions {
            hello_timeout: Duration::ZERO,
            ..base
        },
        ListenerOptions {
            max_pending: 0,
            ..base
        },
        ListenerOptions {
            max_handshakes: 0,
            ..base
        },
    ] {
        assert!(matches!(
            Listener::bind(local(0), opts),
            Err(Error::InvalidArgument(_))
        ));
    }
}

#[test]
fn early_connections_of_two_generations_meet_their_waits_in_order() {
    let l = listener();
    let first = connect_in_background(&l, hello(9, 0));
    let second = connect_in_background(&l, hello(9, 1));
    let deadline = Instant::now() + GENEROUS;
    while l.stats().parked != 2 {
        assert!(
            Instant::now() < deadline,
            "never parked both: {:?}",
            l.stats()
        );
        std::thread::yield_now();
    }
    // Both arrived before any wait: the waits take generation 0, then generation 1.
    let a = l.wait_for(9, GENEROUS).unwrap();
    let b = l.wait_for(9, Duration::from_secs(2)).unwrap();
    round_trip(&first.join().unwrap().unwrap(), &a);
    round_trip(&second.join().unwrap().unwrap(), &b);
    assert_eq!(l.stats().matched, 2);
}
