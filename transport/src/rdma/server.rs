//! An RDMA server shaped like DAQIRI's, with its two fixes built in:
//!
//! - It listens on every configured interface. A CONNECT_REQUEST is mapped to the interface of
//!   the listener it arrived on, by the index saved when that listener was set up (never by
//!   the IB port number: DAQIRI #113).
//! - Each connection gets a worker thread with its own exit flag; a stats thread reads the
//!   connection registry on a period. Disconnect order: signal the worker, take its handle out
//!   of the registry under the lock, release the lock, join, and only then return its buffers
//!   to the pool. The buffers come back *from the joined thread*, so they cannot be returned
//!   earlier; and no lock is held while joining, so the stats thread can never deadlock with a
//!   disconnect.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sideway::rdmacm::communication_manager::{
    ConnectionParameter, EventChannel, EventType, Identifier, PortSpace,
};

use super::rc::{cm as cm_error, Buffers, RcConnection, RcOptions, RdmaError, Received};

#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The configured interface list, by address; a connection is served by the index here.
    pub interfaces: Vec<IpAddr>,
    pub port: u16,
    pub rc: RcOptions,
    /// Buffer sets in the pool: the most connections served at once.
    pub pool: usize,
    pub stats_period: Duration,
    /// How long a worker takes to leave once told to (draining its queue, as hardware does);
    /// zero returns at once. Makes a lock held across the join visible to the stats thread.
    pub worker_drain: Duration,
}

/// What a worker did, kept after it is joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// Index into the configured interface list.
    pub interface: usize,
    /// The first message the client sent (evidence independent of the server's own mapping:
    /// a client can say which address it connected to).
    pub first_message: Vec<u8>,
    pub messages: u64,
    /// The buffers came back to the pool after the worker was joined.
    pub buffers_returned_after_join: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub accepted: u64,
    pub rejected_no_buffers: u64,
    pub workers_joined: u64,
    pub stats_samples: u64,
    pub pool_free: usize,
    pub completion_errors: u64,
    /// The stats thread's longest wait for the registry lock.
    pub stats_max_lock_wait: Duration,
    /// The longest a disconnect waited for its worker to leave (signal to join).
    pub max_worker_exit: Duration,
    /// Samples the stats thread took while a worker was being joined: the window in which a
    /// join under the registry lock (DAQIRI's deadlock) would stall it.
    pub stats_samples_during_joins: u64,
}

struct Worker {
    exit: Arc<AtomicBool>,
    handle: JoinHandle<(RcConnection, u64, Vec<u8>)>,
    interface: usize,
}

struct Shared {
    registry: Mutex<HashMap<usize, Worker>>,
    pool: Mutex<Vec<Buffers>>,
    served: Mutex<Vec<Served>>,
    stop: AtomicBool,
    accepted: AtomicU64,
    rejected: AtomicU64,
    joined: AtomicU64,
    samples: AtomicU64,
    completion_errors: AtomicU64,
    /// Messages handled per worker, read by the stats thread.
    live_messages: Mutex<HashMap<usize, Arc<AtomicU64>>>,
    /// Longest registry-lock wait of the stats thread, and longest worker exit (nanoseconds).
    stats_max_lock_wait_ns: AtomicU64,
    max_worker_exit_ns: AtomicU64,
    /// Joins in progress, and the stats samples taken during one.
    joining: AtomicU64,
    samples_during_joins: AtomicU64,
    /// Test-only ([`crate::injected::Bug::BuffersToPoolBeforeJoin`]): a second owner of each
    /// connection's buffers, and the joins done off the CM thread.
    #[cfg(feature = "bug-injection")]
    early: Mutex<EarlyReturns>,
}

/// Test-only: per connection, the pool's second owner of its buffers; and the joins done
/// later, off the CM thread.
#[cfg(feature = "bug-injection")]
type EarlyReturns = (HashMap<usize, Buffers>, Vec<JoinHandle<()>>);

// Every lock and join here is told to the audit's sync observer when it is loaded: the
// wait-for audit sees a join under the registry lock (DAQIRI's bug) as a wait under a lock.
use crate::sync_marks::{join, lock};

pub struct RdmaServer {
    shared: Arc<Shared>,
    cm: Option<JoinHandle<()>>,
    stats: Option<JoinHandle<()>>,
}

impl RdmaServer {
    /// Listen on every configured interface (all on `opts.port`) and start serving: every
    /// message a client SENDs is echoed back.
    pub fn start(opts: ServerOptions) -> Result<RdmaServer, RdmaError> {
        let channel = EventChannel::new().map_err(cm_error)?;
        let mut listeners = vec![];
        for (index, ip) in opts.interfaces.iter().enumerate() {
            let id = channel.create_id(PortSpace::Tcp).map_err(cm_error)?;
            id.bind_addr(SocketAddr::new(*ip, opts.port)).map_err(|e| {
                let mut err = cm_error(e);
                if let RdmaError::Cm { context, .. } = &mut err {
                    *context = format!("binding {ip}: {}", context);
                }
                err
            })?;
            id.listen(64).map_err(cm_error)?;
            // The index into the configured list, saved with the listener.
            id.setup_context(index);
            listeners.push(id);
        }
        let shared = Arc::new(Shared {
            registry: Mutex::new(HashMap::new()),
            pool: Mutex::new((0..opts.pool).map(|_| Buffers::new(&opts.rc)).collect()),
            served: Mutex::new(vec![]),
            stop: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            joined: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            completion_errors: AtomicU64::new(0),
            live_messages: Mutex::new(HashMap::new()),
            stats_max_lock_wait_ns: AtomicU64::new(0),
            max_worker_exit_ns: AtomicU64::new(0),
            joining: AtomicU64::new(0),
            samples_during_joins: AtomicU64::new(0),
            #[cfg(feature = "bug-injection")]
            early: Mutex::default(),
        });
        let cm = {
            let shared = Arc::clone(&shared);
            let opts = opts.clone();
            std::thread::Builder::new()
                .name("wringer-rdma-cm".into())
                .spawn(move || cm_loop(&channel, &listeners, &shared, &opts))
                .map_err(cm_error)?
        };
        let stats = {
            let shared = Arc::clone(&shared);
            let period = opts.stats_period;
            std::thread::Builder::new()
                .name("wringer-rdma-stats".into())
                .spawn(move || stats_loop(&shared, period))
                .map_err(cm_error)?
        };
        Ok(RdmaServer {
            shared,
            cm: Some(cm),
            stats: Some(stats),
        })
    }

    pub fn stats(&self) -> ServerStats {
        let s = &self.shared;
        ServerStats {
            accepted: s.accepted.load(Ordering::Relaxed),
            rejected_no_buffers: s.rejected.load(Ordering::Relaxed),
            workers_joined: s.joined.load(Ordering::Relaxed),
            stats_samples: s.samples.load(Ordering::Relaxed),
            pool_free: lock(&s.pool).len(),
            completion_errors: s.completion_errors.load(Ordering::Relaxed),
            stats_max_lock_wait: Duration::from_nanos(
                s.stats_max_lock_wait_ns.load(Ordering::Relaxed),
            ),
            max_worker_exit: Duration::from_nanos(s.max_worker_exit_ns.load(Ordering::Relaxed)),
            stats_samples_during_joins: s.samples_during_joins.load(Ordering::Relaxed),
        }
    }

    pub fn served(&self) -> Vec<Served> {
        lock(&self.shared.served).clone()
    }

    pub fn live_connections(&self) -> usize {
        lock(&self.shared.registry).len()
    }

    /// Stop: no new connections, every worker disconnected in the safe order, all threads
    /// joined. Bounded: workers poll their exit flag, the CM loop its stop flag.
    pub fn shutdown(mut self) -> ServerStats {
        self.stop_all();
        self.stats()
    }

    /// [`shutdown`](Self::shutdown), and then every connection served, those the shutdown
    /// itself disconnected included.
    pub fn shutdown_and_served(mut self) -> (ServerStats, Vec<Served>) {
        self.stop_all();
        (self.stats(), self.served())
    }

    fn stop_all(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(cm) = self.cm.take() {
            let _ = cm.join();
        }
        let ids: Vec<usize> = lock(&self.shared.registry).keys().copied().collect();
        for id in ids {
            disconnect(&self.shared, id);
        }
        #[cfg(feature = "bug-injection")]
        {
            let joins = std::mem::take(&mut lock(&self.shared.early).1);
            for join in joins {
                let _ = join.join();
            }
            // Aliases of connections that never disconnected: their buffers were freed with
            // the connection, so these are forgotten (test-only memory, leaked on purpose).
            for (_, alias) in lock(&self.shared.early).0.drain() {
                std::mem::forget(alias);
            }
        }
        if let Some(stats) = self.stats.take() {
            let _ = stats.join();
        }
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// The DAQIRI order: signal, take out under the lock, release, join, then return buffers.
fn disconnect(shared: &Arc<Shared>, key: usize) {
    let signalled = Instant::now();
    let mut registry = lock(&shared.registry);
    let Some(worker) = registry.remove(&key) else {
        return;
    };
    worker.exit.store(true, Ordering::Release);
    #[cfg(feature = "bug-injection")]
    if crate::injected::bug() == Some(crate::injected::Bug::LockAcrossJoin) {
        // DAQIRI's deadlock half, test-only: the join happens with the lock still held.
        let joined = joining(shared, || join(worker.handle));
        drop(registry);
        return finish_disconnect(shared, key, worker.interface, joined, signalled);
    }
    drop(registry); // the registry lock is released here, before the join
    let Worker {
        handle, interface, ..
    } = worker;
    #[cfg(feature = "bug-injection")]
    if crate::injected::is(crate::injected::Bug::BuffersToPoolBeforeJoin) {
        // DAQIRI's pool half, test-only: the buffers go back first, the join happens later
        // (off the CM thread, which goes on accepting), and the joined connection's own copy
        // is forgotten.
        if let Some(alias) = lock(&shared.early).0.remove(&key) {
            lock(&shared.pool).push(alias);
        }
        let shared2 = Arc::clone(shared);
        let join = std::thread::spawn(move || {
            let joined = join(handle).map(|(conn, n, first)| {
                std::mem::forget(conn.into_buffers());
                (n, first)
            });
            account_for_worker(&shared2, key, interface, joined, signalled);
        });
        lock(&shared.early).1.push(join);
        return;
    }
    let joined = joining(shared, || join(handle));
    finish_disconnect(shared, key, interface, joined, signalled);
}

/// A join, counted as in progress while it runs (for the stats thread's samples).
fn joining<T>(shared: &Shared, join: impl FnOnce() -> T) -> T {
    shared.joining.fetch_add(1, Ordering::AcqRel);
    let out = join();
    shared.joining.fetch_sub(1, Ordering::AcqRel);
    out
}

/// After the join: return the worker's buffers to the pool, and account for it.
fn finish_disconnect(
    shared: &Shared,
    key: usize,
    interface: usize,
    joined: std::thread::Result<(RcConnection, u64, Vec<u8>)>,
    signalled: Instant,
) {
    let joined = joined.map(|(conn, messages, first_message)| {
        shared
            .completion_errors
            .fetch_add(conn.counts().errors(), Ordering::Relaxed);
        // Only the joined thread could hand the connection back; its buffers go back to the
        // pool after its QP and memory regions are gone.
        lock(&shared.pool).push(conn.into_buffers());
        (messages, first_message)
    });
    account_for_worker(shared, key, interface, joined, signalled);
}

fn account_for_worker(
    shared: &Shared,
    key: usize,
    interface: usize,
    joined: std::thread::Result<(u64, Vec<u8>)>,
    signalled: Instant,
) {
    let exit_ns = signalled.elapsed().as_nanos().min(u64::MAX as u128) as u64;
    shared
        .max_worker_exit_ns
        .fetch_max(exit_ns, Ordering::Relaxed);
    let Ok((messages, first_message)) = joined else {
        return;
    };
    shared.joined.fetch_add(1, Ordering::Relaxed);
    lock(&shared.live_messages).remove(&key);
    lock(&shared.served).push(Served {
        interface,
        first_message,
        messages,
        buffers_returned_after_join: true,
    });
}

fn cm_loop(
    channel: &Arc<EventChannel>,
    _listeners: &[Arc<Identifier>],
    shared: &Arc<Shared>,
    opts: &ServerOptions,
) {
    // Connections between CONNECT_REQUEST and ESTABLISHED, and the key each gets.
    let mut pending: HashMap<usize, (RcConnection, usize)> = HashMap::new();
    let mut peer_flags: HashMap<usize, Arc<AtomicBool>> = HashMap::new();
    while !shared.stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: channel.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the channel outlives the call. 50 ms bounds how long a stop
        // request waits.
        if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
            continue;
        }
        let Ok(event) = channel.get_cm_event() else {
            continue;
        };
        let kind = event.event_type();
        let id = event.cm_id();
        let listener = event.listener_id();
        let _ = event.ack();
        let Some(id) = id else { continue };
        let key = Arc::as_ptr(&id) as usize;
        match kind {
            EventType::ConnectRequest => {
                let interface = listener.and_then(|l| l.get_context::<usize>()).map(|i| *i);
                let Some(interface) = interface else { continue };
                let Some(buffers) = lock(&shared.pool).pop() else {
                    shared.rejected.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                #[cfg(feature = "bug-injection")]
                if crate::injected::is(crate::injected::Bug::BuffersToPoolBeforeJoin) {
                    // SAFETY: test-only and deliberately unsound (the bug): the pool gets this
                    // second owner at disconnect, and the connection's own copy is forgotten.
                    let alias = unsafe { buffers.alias() };
                    if let Some(old) = lock(&shared.early).0.insert(key, alias) {
                        std::mem::forget(old);
                    }
                }
                match accept(Arc::clone(&id), opts.rc, buffers) {
                    Ok(conn) => {
                        pending.insert(key, (conn, interface));
                    }
                    Err((_, Some(buffers))) => {
                        #[cfg(feature = "bug-injection")]
                        if let Some(alias) = lock(&shared.early).0.remove(&key) {
                            std::mem::forget(alias);
                        }
                        lock(&shared.pool).push(buffers)
                    }
                    Err((_, None)) => {}
                }
            }
            EventType::Established => {
                let Some((conn, interface)) = pending.remove(&key) else {
                    continue;
                };
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                peer_flags.insert(key, conn.peer_gone_flag());
                let exit = Arc::new(AtomicBool::new(false));
                let messages = Arc::new(AtomicU64::new(0));
                lock(&shared.live_messages).insert(key, Arc::clone(&messages));
                let handle = {
                    let exit = Arc::clone(&exit);
                    let drain = opts.worker_drain;
                    std::thread::spawn(move || serve(conn, &exit, &messages, drain))
                };
                lock(&shared.registry).insert(
                    key,
                    Worker {
                        exit,
                        handle,
                        interface,
                    },
                );
            }
            EventType::Disconnected | EventType::TimewaitExit => {
                if let Some(flag) = peer_flags.remove(&key) {
                    flag.store(true, Ordering::Release);
                }
                pending.remove(&key);
                disconnect(shared, key);
            }
            _ => {}
        }
    }
}

/// Accept on a fresh CONNECT_REQUEST: QP to RTS and receives posted before the accept. On
/// failure the buffers go back (if the connection got as far as owning them, it returns them).
fn accept(
    id: Arc<Identifier>,
    rc: RcOptions,
    buffers: Buffers,
) -> Result<RcConnection, (RdmaError, Option<Buffers>)> {
    let mut conn = RcConnection::create(id, None, rc, buffers).map_err(|e| (e, None))?;
    let ready = (|| {
        conn.ready_to_send()?;
        conn.post_ring()?;
        let mut param = ConnectionParameter::default();
        param.setup_qp_number(conn.qp_number());
        conn.identifier().accept(param).map_err(cm_error)
    })();
    match ready {
        Ok(()) => Ok(conn),
        Err(e) => Err((e, Some(conn.into_buffers()))),
    }
}

/// A connection's worker: echo every message until its exit flag is raised or the peer goes.
fn serve(
    mut conn: RcConnection,
    exit: &AtomicBool,
    messages: &AtomicU64,
    drain: Duration,
) -> (RcConnection, u64, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut first = vec![];
    // The peer's write target arrives first; without it the connection cannot be served.
    if conn
        .exchange_adverts(deadline, Duration::from_secs(30))
        .is_err()
    {
        return (conn, 0, first);
    }
    while !exit.load(Ordering::Acquire) {
        match conn.recv(Duration::from_millis(50)) {
            Ok(Received::Message(m)) => {
                if first.is_empty() {
                    first = m.clone();
                }
                if conn.send(&m, Duration::from_secs(5)).is_err() {
                    break;
                }
                messages.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Received::Written { .. } | Received::WrittenToRegion { .. }) => {
                messages.fetch_add(1, Ordering::Relaxed);
            }
            Err(RdmaError::Timeout { .. }) => {}
            Err(_) => break,
        }
    }
    // Leaving takes time on hardware (the queue drains); a bounded sleep stands for it.
    std::thread::sleep(drain);
    let n = messages.load(Ordering::Relaxed);
    (conn, n, first)
}

fn stats_loop(shared: &Shared, period: Duration) {
    while !shared.stop.load(Ordering::Acquire) {
        {
            // Reads the registry like DAQIRI's stats printer; never held across a join, so
            // its wait for the lock stays short however long a worker takes to leave.
            let asked = Instant::now();
            let registry = lock(&shared.registry);
            let waited = asked.elapsed().as_nanos().min(u64::MAX as u128) as u64;
            shared
                .stats_max_lock_wait_ns
                .fetch_max(waited, Ordering::Relaxed);
            if shared.joining.load(Ordering::Acquire) > 0 {
                shared.samples_during_joins.fetch_add(1, Ordering::Relaxed);
            }
            let live = lock(&shared.live_messages);
            let _total: u64 = registry
                .keys()
                .filter_map(|k| live.get(k))
                .map(|m| m.load(Ordering::Relaxed))
                .sum();
        }
        shared.samples.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(period);
    }
}
