//! The listener side of lazy connects, matched by (sequence, generation).
//!
//! `wait_for(sequence, timeout)` takes the next generation of `sequence` and waits for the
//! initiator that names it. Every waiter owns its deadline (`recv_timeout` on its own channel);
//! whether it succeeded or timed out is decided once, under the table lock, so it can neither
//! time out after success nor be handed a socket after it gave up. A socket for a generation
//! that already timed out (or was served) is refused and counted; it never reaches a later
//! waiter of the same sequence.

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::conn::{Connection, ConnectionOptions};
use crate::error::{Error, RejectReason, Result};
use crate::handshake::{self, Hello};
use crate::sockopt::SocketOptions;
use crate::waits::{self, Outcome, Placement, Waits};

#[derive(Clone, Copy, Debug)]
pub struct ListenerOptions {
    /// The run's secret; hellos without it are refused and counted.
    pub token: u128,
    /// How long an accepted peer has to send its hello.
    pub hello_timeout: Duration,
    /// Most waits that may be pending at once.
    pub max_pending: usize,
    /// Most early connections (arrived before their wait) held at once.
    pub max_parked: usize,
    /// Most handshakes in flight; beyond that new peers are refused.
    pub max_handshakes: usize,
    pub socket: SocketOptions,
    pub connection: ConnectionOptions,
}

impl ListenerOptions {
    pub fn new(token: u128) -> ListenerOptions {
        ListenerOptions {
            token,
            hello_timeout: Duration::from_secs(5),
            max_pending: 1024,
            max_parked: 1024,
            max_handshakes: 64,
            socket: SocketOptions::default(),
            connection: ConnectionOptions::default(),
        }
    }
}

/// Counters of what the listener refused or dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenerStats {
    pub accepted: u64,
    pub matched: u64,
    pub timed_out: u64,
    /// Sockets that arrived for a generation that had already timed out or been served.
    pub stale_dropped: u64,
    pub bad_token: u64,
    pub handshake_failed: u64,
    pub overloaded: u64,
    /// Waits pending right now.
    pub pending: usize,
    /// Early connections parked right now.
    pub parked: usize,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    matched: AtomicU64,
    timed_out: AtomicU64,
    stale_dropped: AtomicU64,
    bad_token: AtomicU64,
    handshake_failed: AtomicU64,
    overloaded: AtomicU64,
}

struct Handshake {
    /// Kept until the socket is handed on, so shutdown can cut a stalled hello short.
    socket: Option<Arc<Socket>>,
    thread: JoinHandle<()>,
}

#[derive(Default)]
struct Table {
    /// Who waits for which (sequence, generation), and acked connections whose wait has not
    /// started yet.
    waits: Waits<Arc<Socket>, Connection>,
    /// Handshake threads, joined once finished; none is ever detached.
    handshakes: HashMap<u64, Handshake>,
    next_handshake: u64,
}

struct Shared {
    table: Mutex<Table>,
    counters: Counters,
    opts: ListenerOptions,
}

pub struct Listener {
    shared: Arc<Shared>,
    socket: Arc<Socket>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
    addr: SocketAddr,
}

impl Listener {
    /// Bind and start accepting. Bind to port 0 for an ephemeral port.
    pub fn bind(addr: SocketAddr, opts: ListenerOptions) -> Result<Listener> {
        if opts.hello_timeout.is_zero() || opts.max_pending == 0 || opts.max_handshakes == 0 {
            return Err(Error::InvalidArgument(
                "hello_timeout, max_pending and max_handshakes must be above zero".into(),
            ));
        }
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        let addr = socket
            .local_addr()?
            .as_socket()
            .expect("bound to an inet address");
        let socket = Arc::new(socket);
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            counters: Counters::default(),
            opts,
        });
        let acceptor = {
            let (socket, shared) = (Arc::clone(&socket), Arc::clone(&shared));
            std::thread::Builder::new()
                .name("wringer-accept".into())
                .spawn(move || accept_loop(&socket, &shared))?
        };
        Ok(Listener {
            shared,
            socket,
            acceptor: Mutex::new(Some(acceptor)),
            addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Wait for the initiator of the next generation of `sequence`. Returns exactly once: the
    /// connection, `Timeout`, or `ListenerClosed`. A zero timeout is rejected: there is no
    /// "wait forever".
    pub fn wait_for(&self, sequence: u64, timeout: Duration) -> Result<Connection> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "wait_for timeout must be above zero (there is no 'wait forever')".into(),
            ));
        }
        let opts = self.shared.opts.connection;
        let (result, outcome) = waits::wait_for(
            &*self.shared,
            sequence,
            timeout,
            self.shared.opts.max_pending,
            |socket| Connection::from_shared(socket, opts),
        );
        let counter = match outcome {
            Outcome::Parked => &self.shared.counters.matched,
            Outcome::TimedOut => &self.shared.counters.timed_out,
            Outcome::Other => return result,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    pub fn stats(&self) -> ListenerStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (pending, parked) = self.shared.lock().waits.sizes();
        ListenerStats {
            pending,
            parked,
            accepted: get(&c.accepted),
            matched: get(&c.matched),
            timed_out: get(&c.timed_out),
            stale_dropped: get(&c.stale_dropped),
            bad_token: get(&c.bad_token),
            handshake_failed: get(&c.handshake_failed),
            overloaded: get(&c.overloaded),
        }
    }

    /// Stop accepting, fail every pending waiter with `ListenerClosed`, drop parked sockets,
    /// and join every thread. Idempotent.
    pub fn shutdown(&self) {
        let mut acceptor = self.acceptor.lock().unwrap_or_else(|p| p.into_inner());
        let Some(acceptor_handle) = acceptor.take() else {
            return;
        };
        let handshakes = {
            let mut t = self.shared.lock();
            t.waits.close();
            std::mem::take(&mut t.handshakes)
        };
        // Linux wakes a thread blocked in accept() when its listening socket is shut down.
        let _ = self.socket.shutdown(Shutdown::Both);
        let _ = acceptor_handle.join();
        for (_, h) in handshakes {
            if let Some(socket) = &h.socket {
                let _ = socket.shutdown(Shutdown::Both);
            }
            let _ = h.thread.join();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl waits::Table<Arc<Socket>, Connection> for Shared {
    fn with<R>(&self, f: impl FnOnce(&mut Waits<Arc<Socket>, Connection>) -> R) -> R {
        f(&mut self.lock().waits)
    }
}

fn accept_loop(listening: &Socket, shared: &Arc<Shared>) {
    loop {
        let accepted = listening.accept();
        let mut t = shared.lock();
        if t.waits.closed() {
            return;
        }
        reap_finished(&mut t);
        let socket = match accepted {
            Ok((socket, _)) => socket,
            Err(e)
                if e.raw_os_error() == Some(libc::EMFILE)
                    || e.raw_os_error() == Some(libc::ENFILE) =>
            {
                drop(t);
                // Out of descriptors: back off instead of spinning on the same error.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(_) => continue,
        };
        shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
        if t.handshakes.len() >= shared.opts.max_handshakes {
            shared.counters.overloaded.fetch_add(1, Ordering::Relaxed);
            handshake::reject(&socket, RejectReason::Overloaded, Duration::from_millis(10));
            continue;
        }
        let socket = Arc::new(socket);
        let id = t.next_handshake;
        t.next_handshake += 1;
        // The table lock is held until the entry exists, so the thread always finds it.
        let worker = {
            let (socket, shared) = (Arc::clone(&socket), Arc::clone(shared));
            std::thread::Builder::new()
                .name("wringer-hello".into())
                .spawn(move || serve_handshake(socket, id, &shared))
        };
        if let Ok(thread) = worker {
            t.handshakes.insert(
                id,
                Handshake {
                    socket: Some(socket),
                    thread,
                },
            );
        }
    }
}

/// Join handshake threads that are done (each leaves its entry for this, so none is detached).
fn reap_finished(t: &mut Table) {
    let done: Vec<u64> = t
        .handshakes
        .iter()
        .filter(|(_, h)| h.thread.is_finished())
        .map(|(id, _)| *id)
        .collect();
    for id in done {
        if let Some(h) = t.handshakes.remove(&id) {
            let _ = h.thread.join();
        }
    }
}

fn serve_handshake(socket: Arc<Socket>, id: u64, shared: &Shared) {
    let opts = &shared.opts;
    let counters = &shared.counters;
    let hello = match handshake::read_hello(&socket, opts.hello_timeout) {
        Ok(hello) => hello,
        Err(_) => {
            counters.handshake_failed.fetch_add(1, Ordering::Relaxed);
            handshake::reject(&socket, RejectReason::Malformed, Duration::from_millis(10));
            return;
        }
    };
    if hello.token != opts.token {
        counters.bad_token.fetch_add(1, Ordering::Relaxed);
        handshake::reject(&socket, RejectReason::BadToken, Duration::from_millis(10));
        return;
    }
    if opts.socket.apply(&socket).is_err() {
        counters.handshake_failed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    match place(socket, id, &hello, shared) {
        Placement::Deliver(waiter, socket) => {
            let result = Connection::from_shared(socket, opts.connection);
            if result.is_ok() {
                counters.matched.fetch_add(1, Ordering::Relaxed);
            }
            waiter.deliver(result);
        }
        Placement::Parked => {}
        Placement::Refused(socket, reason) => {
            handshake::reject(&socket, reason, Duration::from_millis(10))
        }
    }
}

/// Decide, under the table lock, where a greeted socket goes: to its waiter, parked for a wait
/// that has not started, or refused. The ack is sent under the lock too (a tiny non-blocking
/// write), so a delivered connection's data always follows its ack, and a parked socket is
/// visible to the next `wait_for` the moment the decision is made.
fn place(
    socket: Arc<Socket>,
    id: u64,
    hello: &Hello,
    shared: &Shared,
) -> Placement<Arc<Socket>, Connection> {
    let mut t = shared.lock();
    let placement = t.waits.place(
        hello.sequence,
        hello.generation,
        socket,
        shared.opts.max_parked,
        |s| handshake::accept(s, Duration::from_millis(100)).is_ok(),
    );
    let c = &shared.counters;
    match &placement {
        Placement::Refused(_, RejectReason::StaleGeneration) => {
            c.stale_dropped.fetch_add(1, Ordering::Relaxed);
        }
        Placement::Refused(_, RejectReason::Overloaded) => {
            c.overloaded.fetch_add(1, Ordering::Relaxed);
        }
        // The ack failed: the peer vanished between hello and ack.
        Placement::Refused(_, RejectReason::Malformed) => {
            c.handshake_failed.fetch_add(1, Ordering::Relaxed);
        }
        Placement::Refused(..) => {}
        Placement::Deliver(..) | Placement::Parked => {
            // From here the socket belongs to a connection: shutdown no longer needs our clone.
            if let Some(h) = t.handshakes.get_mut(&id) {
                h.socket = None;
            }
        }
    }
    placement
}
