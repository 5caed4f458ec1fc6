//! Reliable-connected QPs set up through rdma_cm (as DAQIRI does): SEND/RECV over a ring of
//! posted receives, and RDMA WRITE with immediate data into the buffer the peer advertised.
//! Every wait has a deadline; every error completion is counted by its status, never dropped.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::ibverbs::completion::{GenericCompletionQueue, WorkCompletionStatus};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    GenericQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairAttributeMask,
    QueuePairState, SetInlineData, SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;
use sideway::rdmacm::communication_manager::{
    ConnectionParameter, Event, EventChannel, EventType, Identifier, PortSpace,
};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RdmaError {
    /// An rdma_cm call or the out-of-band exchange failed; `errno` when the OS gave one.
    #[error("rdma_cm: {context}{}", errno.map(|e| format!(" (errno {e})")).unwrap_or_default())]
    Cm { context: String, errno: Option<i32> },
    #[error("verbs: {0}")]
    Verbs(String),
    #[error("timed out after {after:?} while {during}")]
    Timeout {
        during: &'static str,
        after: Duration,
    },
    #[error("expected the rdma_cm event {expected}, got {got} (status {status})")]
    UnexpectedEvent {
        expected: &'static str,
        got: String,
        status: i32,
    },
    #[error("the peer disconnected")]
    Disconnected,
    #[error("work completion failed: {status} (wr {wr_id})")]
    Completion { status: WcStatus, wr_id: u64 },
    #[error("message of {len} bytes exceeds the {max}-byte slots")]
    TooLong { len: usize, max: usize },
    #[error("the peer has not advertised a write target")]
    NoWriteTarget,
    #[error("immediate data {0:#x} uses bit 31, which marks writes into registered regions")]
    ImmReserved(u32),
    #[error(
        "send completion {got} arrived before {expected}: an RC send queue completes in order"
    )]
    OutOfOrder { expected: u64, got: u64 },
    #[error("{len} bytes at offset {offset} exceed the {capacity}-byte {which} region")]
    OutOfRegion {
        which: &'static str,
        offset: u64,
        len: usize,
        capacity: usize,
    },
}

/// An rdma_cm failure with the errno found in its cause chain.
pub(crate) fn cm<E: std::error::Error + 'static>(e: E) -> RdmaError {
    RdmaError::Cm {
        context: e.to_string(),
        errno: errno_of(&e),
    }
}

/// An rdma_cm failure described in words (no OS error behind it).
pub(crate) fn cm_msg(context: impl Into<String>) -> RdmaError {
    RdmaError::Cm {
        context: context.into(),
        errno: None,
    }
}

/// An out-of-band exchange failure on a socket, with its errno.
pub(crate) fn cm_io(context: String, e: &std::io::Error) -> RdmaError {
    RdmaError::Cm {
        context: format!("{context}: {e}"),
        errno: e.raw_os_error(),
    }
}

fn errno_of(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if let Some(io) = x.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        cur = x.source();
    }
    None
}

impl RdmaError {
    /// The OS error number behind an rdma_cm failure, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            RdmaError::Cm { errno, .. } => *errno,
            _ => None,
        }
    }

    pub fn is_timeout(&self) -> bool {
        matches!(self, RdmaError::Timeout { .. })
    }
}

fn verbs(e: impl std::fmt::Display) -> RdmaError {
    RdmaError::Verbs(e.to_string())
}

#[derive(Clone, Copy, Debug)]
pub struct RcOptions {
    /// Size of every receive slot, of the send buffer, and of the write target.
    pub max_message: usize,
    /// Receives kept posted (the ring).
    pub recv_depth: usize,
    pub timeout: Duration,
}

impl Default for RcOptions {
    fn default() -> Self {
        RcOptions {
            max_message: 64 * 1024,
            recv_depth: 16,
            timeout: Duration::from_secs(10),
        }
    }
}

/// A work completion's status, as rdma-core names it (`ibv_wc_status_str`'s short forms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WcStatus {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocProtErr,
    WrFlushErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    RemAbortErr,
    FatalErr,
    RespTimeoutErr,
    GeneralErr,
    Other(u32),
}

impl WcStatus {
    pub fn from_raw(status: u32) -> WcStatus {
        use WorkCompletionStatus::*;
        match WorkCompletionStatus::from(status) {
            Success => WcStatus::Success,
            LocalLengthError => WcStatus::LocLenErr,
            LocalQueuePairOperationError => WcStatus::LocQpOpErr,
            LocalProtectionError => WcStatus::LocProtErr,
            WorkRequestFlushedError => WcStatus::WrFlushErr,
            BadResponseError => WcStatus::BadRespErr,
            LocalAccessError => WcStatus::LocAccessErr,
            RemoteInvalidRequestError => WcStatus::RemInvReqErr,
            RemoteAccessError => WcStatus::RemAccessErr,
            RemoteOperationError => WcStatus::RemOpErr,
            RetryCounterExceededError => WcStatus::RetryExcErr,
            ResponderNotReadyRetryCounterExceededError => WcStatus::RnrRetryExcErr,
            RemoteAbortedError => WcStatus::RemAbortErr,
            FatalError => WcStatus::FatalErr,
            ResponseTimeoutError => WcStatus::RespTimeoutErr,
            GeneralError => WcStatus::GeneralErr,
            _ => WcStatus::Other(status),
        }
    }

    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            WcStatus::Success => "SUCCESS",
            WcStatus::LocLenErr => "LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "LOC_QP_OP_ERR",
            WcStatus::LocProtErr => "LOC_PROT_ERR",
            WcStatus::WrFlushErr => "WR_FLUSH_ERR",
            WcStatus::BadRespErr => "BAD_RESP_ERR",
            WcStatus::LocAccessErr => "LOC_ACCESS_ERR",
            WcStatus::RemInvReqErr => "REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "REM_ACCESS_ERR",
            WcStatus::RemOpErr => "REM_OP_ERR",
            WcStatus::RetryExcErr => "RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "RNR_RETRY_EXC_ERR",
            WcStatus::RemAbortErr => "REM_ABORT_ERR",
            WcStatus::FatalErr => "FATAL_ERR",
            WcStatus::RespTimeoutErr => "RESP_TIMEOUT_ERR",
            WcStatus::GeneralErr => "GENERAL_ERR",
            WcStatus::Other(n) => return write!(f, "status {n}"),
        };
        f.write_str(name)
    }
}

/// Completion outcomes by status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompletionCounts(pub BTreeMap<WcStatus, u64>);

impl CompletionCounts {
    pub fn get(&self, status: WcStatus) -> u64 {
        self.0.get(&status).copied().unwrap_or(0)
    }

    pub fn errors(&self) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| !k.is_success())
            .map(|(_, v)| v)
            .sum()
    }
}

/// What `recv` hands back.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    Message(Vec<u8>),
    /// The peer wrote `data` into our advertised buffer and sent `imm` with it.
    Written {
        imm: u32,
        data: Vec<u8>,
    },
    /// The peer wrote `len` bytes into one of our registered [`Region`]s (where, the two sides
    /// agreed on beforehand) and sent `imm` with them. Nothing was copied.
    WrittenToRegion {
        imm: u32,
        len: usize,
    },
}

/// What a wait found for `recv`: a SEND's bytes in a ring slot (not yet copied out or lent), or
/// a write, which is complete as it stands.
enum Arrival {
    Landed { slot: usize, len: usize },
    Done(Received),
}

/// What [`RcConnection::recv_in_place`] hands back.
pub enum InPlace<'c> {
    /// A message, where it landed.
    Message(LentSlot<'c>),
    /// A write, as [`RcConnection::recv`] returns it.
    Other(Received),
}

/// A message in the receive ring slot it landed in, lent to the caller. Reads as the message's
/// bytes. The slot is posted again when the loan ends: on drop, or by
/// [`give_back`](Self::give_back) (which returns a failure to post) or
/// [`echo`](Self::echo) (which first sends the bytes back from where they are).
pub struct LentSlot<'c> {
    conn: &'c mut RcConnection,
    slot: usize,
    len: usize,
    returned: bool,
}

impl LentSlot<'_> {
    fn range(&self) -> std::ops::Range<usize> {
        let start = self.slot * self.conn.opts.max_message;
        start..start + self.len
    }

    /// End the loan: post the slot again.
    pub fn give_back(mut self) -> Result<(), RdmaError> {
        self.returned = true;
        self.conn.post_recv(self.slot)
    }

    /// SEND the message back to the peer from the slot itself (no copy), and end the loan.
    /// Returns once the SEND is posted (waiting, within `timeout`, for room in the send queue);
    /// the slot goes back into the ring only when that send has completed, which a later wait
    /// (any receive, or [`finish_posted`](RcConnection::finish_posted)) reaps.
    pub fn echo(mut self, timeout: Duration) -> Result<(), RdmaError> {
        // From here on the slot is the echo's: never posted by the loan's end.
        self.returned = true;
        let conn = &mut *self.conn;
        let lkey = conn.v().recv_mr.lkey();
        let addr = conn.b().recv.as_ptr() as u64 + (self.slot * conn.opts.max_message) as u64;
        conn.wait_for_send_slot(timeout)?;
        let sequence = conn.sends_posted;
        // SAFETY: the slot lies inside the receive buffer, registered as `recv_mr`. No receive
        // is posted into it until this send's completion is reaped (`echoing`), and the buffer
        // outlives the QP.
        unsafe { conn.post(lkey, addr, self.len, None, true)? };
        conn.echoing.push_back((sequence, self.slot));
        Ok(())
    }
}

impl std::ops::Deref for LentSlot<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.conn.b().recv[self.range()]
    }
}

impl Drop for LentSlot<'_> {
    fn drop(&mut self) {
        if !self.returned {
            if let Err(e) = self.conn.post_recv(self.slot) {
                self.conn.repost_failed = Some(e);
            }
        }
    }
}

/// Set in the immediate data of writes into a registered region, so the receiver knows the
/// bytes are not in the connection's own write buffer.
const REGION_WRITE: u32 = 1 << 31;

/// Memory the caller owns and registered with one connection: host memory, or GPU memory
/// through dmabuf. The caller keeps the memory alive and in place while the region lives.
pub struct Region {
    mr: Arc<MemoryRegion>,
    /// The address work requests use for the first byte (the iova, for dmabuf).
    addr: u64,
    len: usize,
    /// Host memory, which the CPU may read (small sends from it go inline); not GPU memory.
    host: bool,
}

impl Region {
    /// What the peer needs to write here.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr,
            rkey: self.mr.rkey(),
            len: self.len as u32,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// `offset..offset + len` lies inside the region.
    fn holds(&self, offset: usize, len: usize) -> Result<(), RdmaError> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(RdmaError::OutOfRegion {
                which: "local",
                offset: offset as u64,
                len,
                capacity: self.len,
            });
        }
        Ok(())
    }
}

/// A peer's region as it advertised it: 16 bytes on the wire (addr, rkey, len; big-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
}

impl RemoteRegion {
    pub fn to_bytes(self) -> [u8; ADVERT_LEN] {
        let mut b = [0u8; ADVERT_LEN];
        b[0..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Option<RemoteRegion> {
        (b.len() == ADVERT_LEN).then(|| RemoteRegion {
            addr: u64::from_be_bytes(b[0..8].try_into().expect("8 bytes")),
            rkey: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            len: u32::from_be_bytes(b[12..16].try_into().expect("4 bytes")),
        })
    }
}

/// Send-queue work requests (SENDs and WRITEs) carry this bit and their sequence number in
/// their wr_id; receives carry their ring slot. RC completes a send queue in order, and the
/// sequence lets every wait check that it does.
const SEND_QUEUE: u64 = 1 << 63;

/// Send work requests a connection may have in flight: region writes are pipelined up to this
/// (or to the receive ring's depth, whichever is smaller: each write with immediate consumes
/// one of the peer's posted receives, and both sides use the same options).
const SEND_DEPTH: usize = 16;

/// Sends of up to this many bytes of host memory go inline (perftest's default for its latency
/// tests on RC).
const INLINE_UP_TO: usize = 236;

/// How an idle completion poll waits: it spins this long, then yields the core until
/// [`YIELD_UNTIL`], then sleeps an eighth of the time it has been idle (at most
/// [`LONGEST_NAP`]). A completion that comes soon costs no sleep; a long wait costs few polls.
const SPIN_FOR: Duration = Duration::from_micros(200);
const YIELD_UNTIL: Duration = Duration::from_millis(5);
const LONGEST_NAP: Duration = Duration::from_millis(1);
/// How long a teardown waits for the flushed completions of a QP in the error state (soft-RoCE
/// under TCG flushes a full ring in milliseconds; hardware in microseconds).
const QUIESCE_WITHIN: Duration = Duration::from_secs(2);
/// A wait's deadline that costs no reading of the clock until the wait turns out not to be
/// quick: in the rxe VM under TCG the clock is the emulated HPET, about 3 µs a reading, and a
/// ping-pong that read it on every call paid for it in latency.
#[derive(Clone, Copy, Debug)]
enum Deadline {
    At(Instant),
    /// This long from the first time the wait looks at the clock.
    After(Duration),
}

impl Deadline {
    /// The deadline, fixed from `now` on first use.
    fn fixed(&mut self, now: Instant) -> Instant {
        let at = match *self {
            Deadline::At(at) => at,
            Deadline::After(timeout) => now + timeout,
        };
        *self = Deadline::At(at);
        at
    }
}

/// Empty completion polls between two looks at the clock and the connection manager while a
/// wait spins (past [`SPIN_FOR`], every poll looks: it yields or naps anyway).
const POLLS_PER_CHECK: u32 = 128;
/// The first message each side sends: where the peer may write (addr, rkey, len).
const ADVERT_LEN: usize = 16;

/// Wait for the next rdma_cm event on `channel`, at most until `deadline`.
fn next_event(
    channel: &Arc<EventChannel>,
    deadline: Instant,
    during: &'static str,
    after: Duration,
) -> Result<Event, RdmaError> {
    // Wait for the channel's fd to be readable within the deadline; only then fetch the event,
    // which is ready, so the (blocking) fetch cannot hang.
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RdmaError::Timeout { during, after });
        }
        let mut pfd = libc::pollfd {
            fd: channel.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call; the channel (and its fd) outlives it.
        let rc = unsafe {
            libc::poll(
                &mut pfd,
                1,
                left.as_millis().clamp(1, i32::MAX as u128) as i32,
            )
        };
        if rc > 0 {
            return channel.get_cm_event().map_err(cm);
        }
    }
}

fn expect_event(
    channel: &Arc<EventChannel>,
    want: EventType,
    name: &'static str,
    deadline: Instant,
    after: Duration,
) -> Result<Arc<Identifier>, RdmaError> {
    let ev = next_event(channel, deadline, name, after)?;
    let (got, status, id) = (ev.event_type(), ev.status(), ev.cm_id());
    let _ = ev.ack();
    if got != want {
        return Err(RdmaError::UnexpectedEvent {
            expected: name,
            got: format!("{got:?}"),
            status,
        });
    }
    id.ok_or_else(|| cm_msg("event without an identifier"))
}

/// Passive side: listens on one address.
pub struct RcListener {
    id: Arc<Identifier>,
    channel: Arc<EventChannel>,
    opts: RcOptions,
}

impl RcListener {
    pub fn bind(addr: SocketAddr, opts: RcOptions) -> Result<RcListener, RdmaError> {
        let channel = EventChannel::new().map_err(cm)?;
        let id = channel.create_id(PortSpace::Tcp).map_err(cm)?;
        id.bind_addr(addr).map_err(cm)?;
        id.listen(64).map_err(cm)?;
        Ok(RcListener { id, channel, opts })
    }

    /// Accept one connection: the QP goes to RTS and the receive ring is posted *before* the
    /// accept, so the client can never send into an empty queue (the DAQIRI failure mode).
    pub fn accept(&self, timeout: Duration) -> Result<RcConnection, RdmaError> {
        let deadline = Instant::now() + timeout;
        let id = expect_event(
            &self.channel,
            EventType::ConnectRequest,
            "CONNECT_REQUEST",
            deadline,
            timeout,
        )?;
        // The listener's channel carries this connection's later events (DISCONNECTED); it is
        // read by the connection, so a listener serves one connection at a time (RdmaServer
        // is the many-connection server).
        let mut conn = RcConnection::create(
            id,
            Some(Arc::clone(&self.channel)),
            self.opts,
            Buffers::new(&self.opts),
        )?;
        conn.ready_to_send()?;
        conn.post_ring()?;
        let mut param = ConnectionParameter::default();
        param.setup_qp_number(conn.qp_number());
        conn.id.accept(param).map_err(cm)?;
        expect_event(
            &self.channel,
            EventType::Established,
            "ESTABLISHED",
            deadline,
            timeout,
        )?;
        conn.exchange_adverts(deadline, timeout)?;
        Ok(conn)
    }
}

impl Drop for RcListener {
    fn drop(&mut self) {
        // The identifier is destroyed by sideway when its last Arc goes.
        let _ = &self.id;
    }
}

/// Active side: resolve, connect, establish.
pub fn connect(addr: SocketAddr, opts: RcOptions) -> Result<RcConnection, RdmaError> {
    let deadline = Instant::now() + opts.timeout;
    let channel = EventChannel::new().map_err(cm)?;
    let id = channel.create_id(PortSpace::Tcp).map_err(cm)?;
    let step = opts.timeout.min(Duration::from_secs(5));
    id.resolve_addr(None, addr, step).map_err(cm)?;
    expect_event(
        &channel,
        EventType::AddressResolved,
        "ADDR_RESOLVED",
        deadline,
        opts.timeout,
    )?;
    id.resolve_route(step).map_err(cm)?;
    expect_event(
        &channel,
        EventType::RouteResolved,
        "ROUTE_RESOLVED",
        deadline,
        opts.timeout,
    )?;
    let mut conn = RcConnection::create(id, Some(Arc::clone(&channel)), opts, Buffers::new(&opts))?;
    conn.post_ring()?;
    let mut param = ConnectionParameter::default();
    param.setup_qp_number(conn.qp_number());
    conn.id.connect(param).map_err(cm)?;
    // The active side may leave INIT only once the response says who the peer is.
    expect_event(
        &channel,
        EventType::ConnectResponse,
        "CONNECT_RESPONSE",
        deadline,
        opts.timeout,
    )?;
    conn.ready_to_send()?;
    conn.id.establish().map_err(cm)?;
    conn.exchange_adverts(deadline, opts.timeout)?;
    Ok(conn)
}

/// The memory a connection sends from, receives into, and lets the peer write to. Owned by a
/// connection while it lives; handed back only by [`RcConnection::into_buffers`], after every
/// verbs object that points into it is gone.
pub struct Buffers {
    send: Box<[u8]>,
    recv: Box<[u8]>,
    write: Box<[u8]>,
}

impl Buffers {
    pub fn new(opts: &RcOptions) -> Buffers {
        Buffers {
            send: vec![0u8; opts.max_message].into_boxed_slice(),
            recv: vec![0u8; opts.max_message * opts.recv_depth].into_boxed_slice(),
            write: vec![0u8; opts.max_message].into_boxed_slice(),
        }
    }

    /// Test-only ([`crate::injected::Bug::BuffersToPoolBeforeJoin`]): a second owner of the
    /// same memory, for the pool, while the connection still owns and uses it.
    ///
    /// # Safety
    /// Deliberately unsound (that is the bug): exactly one of the two owners may be dropped;
    /// the other must be forgotten.
    #[cfg(feature = "bug-injection")]
    pub(crate) unsafe fn alias(&self) -> Buffers {
        let again = |b: &[u8]| {
            // SAFETY: the caller's contract: one of the two boxes is forgotten, never freed.
            unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    b.as_ptr() as *mut u8,
                    b.len(),
                ))
            }
        };
        Buffers {
            send: again(&self.send),
            recv: again(&self.recv),
            write: again(&self.write),
        }
    }

    fn fits(&self, opts: &RcOptions) -> bool {
        self.send.len() == opts.max_message
            && self.recv.len() == opts.max_message * opts.recv_depth
            && self.write.len() == opts.max_message
    }
}

/// The verbs objects of a connection. Field order is drop order: the QP and the memory
/// regions go before the protection domain.
struct Verbs {
    qp: GenericQueuePair,
    send_mr: Arc<MemoryRegion>,
    recv_mr: Arc<MemoryRegion>,
    write_mr: Arc<MemoryRegion>,
    cq: GenericCompletionQueue,
    _pd: Arc<ProtectionDomain>,
}

/// One RC connection.
pub struct RcConnection {
    /// Dropped before `buffers` (see `Drop`): the regions point into them.
    verbs: Option<Verbs>,
    buffers: Option<Buffers>,
    id: Arc<Identifier>,
    /// The connection's own event channel (active side); the passive side's events go to its
    /// listener or server, which raises `peer_gone` instead.
    own_channel: Option<Arc<EventChannel>>,
    opts: RcOptions,
    peer_target: Option<(u64, u32, u32)>,
    ready: VecDeque<Arrival>,
    counts: CompletionCounts,
    /// Send work requests posted and not yet completed.
    in_flight: usize,
    /// Sequence numbers of send work requests: the next to post, the next to complete.
    sends_posted: u64,
    sends_completed: u64,
    /// The largest send that goes inline (0 where the provider has no inline data).
    inline_up_to: usize,
    /// Receive slots being sent back from where they are ([`LentSlot::echo`]), by the sequence
    /// number of their SEND: each goes back into the ring when that send completes.
    echoing: VecDeque<(u64, usize)>,
    /// A receive slot that could not be posted again when its lender gave it back (in `Drop`,
    /// which cannot return it): the next wait returns it.
    repost_failed: Option<RdmaError>,
    /// Receive work requests posted and not yet completed.
    posted_recvs: usize,
    peer_gone: Arc<std::sync::atomic::AtomicBool>,
    /// What the QP was given at RTS for retransmission (queried back from the provider).
    ack: Option<AckTiming>,
}

/// Transport retries before a silent peer fails the request with `RETRY_EXC_ERR`. Not
/// rdma_cm's default of 7: soft-RoCE (rxe, every kernel so far) reads 7 as "retry forever", so
/// a send to a peer whose wire went dark would never complete there (`rdma-retry-exceeded`
/// found it). 6 is bounded on every provider.
pub const RETRY_CNT: u8 = 6;

/// A QP's retransmission settings: how long it waits for an acknowledgement, and how often it
/// resends before it completes the request with `RETRY_EXC_ERR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckTiming {
    /// The local ACK timeout exponent: 4.096 µs × 2^timeout (0: wait forever).
    pub timeout: u8,
    pub retry_cnt: u8,
}

impl AckTiming {
    /// One wait for an acknowledgement.
    pub fn ack_timeout(self) -> Option<Duration> {
        (self.timeout > 0).then(|| Duration::from_nanos(4096u64 << self.timeout.min(31)))
    }

    /// The longest a correct provider may take, once the wire goes silent, to complete the
    /// outstanding request with `RETRY_EXC_ERR`: the first wait and one per retry.
    pub fn retry_bound(self) -> Option<Duration> {
        Some(self.ack_timeout()? * (u32::from(self.retry_cnt) + 1))
    }
}

impl RcConnection {
    pub(crate) fn create(
        id: Arc<Identifier>,
        own_channel: Option<Arc<EventChannel>>,
        opts: RcOptions,
        buffers: Buffers,
    ) -> Result<RcConnection, RdmaError> {
        if !buffers.fits(&opts) {
            return Err(verbs("buffers of the wrong size for these options"));
        }
        let ctx = id
            .get_device_context()
            .ok_or_else(|| cm_msg("the identifier has no device yet"))?;
        let pd = ctx.alloc_pd().map_err(verbs)?;
        // The basic CQ: the extended one (ibv_start_poll) kept returning the same completion on
        // rxe with Debian 12's rdma-core.
        let cq: GenericCompletionQueue = ctx
            .create_cq_builder()
            .setup_cqe((opts.recv_depth * 2 + SEND_DEPTH + 8) as u32)
            .build()
            .map_err(verbs)?
            .into();
        let build = |inline: usize| {
            let mut builder = pd.create_qp_builder();
            builder
                .setup_max_send_wr(SEND_DEPTH as u32)
                .setup_max_recv_wr(opts.recv_depth as u32)
                .setup_max_send_sge(1)
                .setup_max_recv_sge(1)
                .setup_max_inline_data(inline as u32)
                .setup_send_cq(cq.clone())
                .setup_recv_cq(cq.clone());
            builder.build_ex().map(GenericQueuePair::from)
        };
        // A provider that cannot put data inline gets a QP without it.
        let (mut qp, inline_up_to) = match build(INLINE_UP_TO) {
            Ok(qp) => (qp, INLINE_UP_TO),
            Err(_) => (build(0).map_err(verbs)?, 0),
        };
        let mut attr = id.get_qp_attr(QueuePairState::Init).map_err(cm)?;
        // rdma_cm leaves remote write off on the active side; both sides accept writes here.
        attr.setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteWrite);
        qp.modify(&attr).map_err(verbs)?;
        let local = AccessFlags::LocalWrite;
        let b = &buffers;
        // SAFETY: each region covers a boxed slice the connection owns. Boxed slices never move
        // or reallocate, and `Drop`/`into_buffers` drop the regions before the buffers.
        let (send_mr, recv_mr, write_mr) = unsafe {
            (
                pd.reg_mr(b.send.as_ptr() as usize, b.send.len(), local)
                    .map_err(verbs)?,
                pd.reg_mr(b.recv.as_ptr() as usize, b.recv.len(), local)
                    .map_err(verbs)?,
                pd.reg_mr(
                    b.write.as_ptr() as usize,
                    b.write.len(),
                    local | AccessFlags::RemoteWrite,
                )
                .map_err(verbs)?,
            )
        };
        Ok(RcConnection {
            verbs: Some(Verbs {
                qp,
                send_mr,
                recv_mr,
                write_mr,
                cq,
                _pd: pd,
            }),
            buffers: Some(buffers),
            id,
            own_channel,
            opts,
            peer_target: None,
            ready: VecDeque::new(),
            counts: CompletionCounts::default(),
            in_flight: 0,
            sends_posted: 0,
            sends_completed: 0,
            repost_failed: None,
            echoing: VecDeque::new(),
            inline_up_to,
            posted_recvs: 0,
            peer_gone: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            ack: None,
        })
    }

    fn v(&mut self) -> &mut Verbs {
        self.verbs
            .as_mut()
            .expect("verbs live until into_buffers consumes the connection")
    }

    fn b(&self) -> &Buffers {
        self.buffers
            .as_ref()
            .expect("buffers live until into_buffers consumes the connection")
    }

    /// Raised when the peer disconnected (set by whoever reads this connection's CM events).
    pub fn peer_gone_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.peer_gone)
    }

    pub(crate) fn identifier(&self) -> &Arc<Identifier> {
        &self.id
    }

    /// Disconnect, destroy the QP and deregister the memory, then hand the buffers back.
    pub fn into_buffers(mut self) -> Buffers {
        self.disconnect();
        self.release_verbs();
        self.buffers.take().expect("buffers are taken only here")
    }

    pub(crate) fn ready_to_send(&mut self) -> Result<(), RdmaError> {
        for state in [QueuePairState::ReadyToReceive, QueuePairState::ReadyToSend] {
            let mut attr = self.id.get_qp_attr(state).map_err(cm)?;
            if state == QueuePairState::ReadyToSend {
                attr.setup_retry_cnt(RETRY_CNT);
            }
            self.v().qp.modify(&attr).map_err(verbs)?;
        }
        let mask = QueuePairAttributeMask::Timeout | QueuePairAttributeMask::RetryCount;
        self.ack = self.v().qp.query(mask).ok().map(|(a, _)| AckTiming {
            timeout: a.timeout(),
            retry_cnt: a.retry_cnt(),
        });
        Ok(())
    }

    /// The QP's retransmission settings, once it is ready to send.
    pub fn ack_timing(&self) -> Option<AckTiming> {
        self.ack
    }

    pub(crate) fn qp_number(&mut self) -> u32 {
        self.v().qp.qp_number()
    }

    pub(crate) fn post_ring(&mut self) -> Result<(), RdmaError> {
        for slot in 0..self.opts.recv_depth {
            self.post_recv(slot)?;
        }
        Ok(())
    }

    fn post_recv(&mut self, slot: usize) -> Result<(), RdmaError> {
        let size = self.opts.max_message;
        let addr = self.b().recv.as_ptr() as u64 + (slot * size) as u64;
        let v = self.v();
        let lkey = v.recv_mr.lkey();
        let mut guard = v.qp.start_post_recv();
        let wr = guard.construct_wr(slot as u64);
        // SAFETY: the slot lies inside the receive buffer, registered as `recv_mr`; the buffer
        // outlives the QP (see `Drop`).
        unsafe { wr.setup_sge(lkey, addr, size as u32) };
        guard.post().map_err(verbs)?;
        self.posted_recvs += 1;
        Ok(())
    }

    /// Send our write target and wait for the peer's.
    pub(crate) fn exchange_adverts(
        &mut self,
        deadline: Instant,
        after: Duration,
    ) -> Result<(), RdmaError> {
        let advert = RemoteRegion {
            addr: self.b().write.as_ptr() as u64,
            rkey: self.v().write_mr.rkey(),
            len: self.b().write.len() as u32,
        }
        .to_bytes();
        let deadline = &mut Deadline::At(deadline);
        self.send_until(&advert, deadline, after)?;
        match self.recv_until(deadline, after)? {
            Received::Message(m) if m.len() == ADVERT_LEN => {
                let r = RemoteRegion::from_bytes(&m).expect("length checked");
                self.peer_target = Some((r.addr, r.rkey, r.len));
                Ok(())
            }
            other => Err(cm_msg(format!(
                "expected the peer's write target, got {other:?}"
            ))),
        }
    }

    /// SEND `data`; returns once its completion arrived (or failed), within `timeout`.
    pub fn send(&mut self, data: &[u8], timeout: Duration) -> Result<(), RdmaError> {
        self.send_until(data, &mut Deadline::After(timeout), timeout)
    }

    fn send_until(
        &mut self,
        data: &[u8],
        deadline: &mut Deadline,
        after: Duration,
    ) -> Result<(), RdmaError> {
        self.post_from_send_buffer(data, None, deadline, after)?;
        self.wait(deadline, after, "waiting for a send completion", |c| {
            c.in_flight == 0
        })
    }

    /// RDMA WRITE `data` into the peer's advertised buffer, with immediate data `imm`.
    pub fn write_imm(&mut self, data: &[u8], imm: u32, timeout: Duration) -> Result<(), RdmaError> {
        if imm & REGION_WRITE != 0 {
            return Err(RdmaError::ImmReserved(imm));
        }
        let target = self.peer_target.ok_or(RdmaError::NoWriteTarget)?;
        let deadline = &mut Deadline::After(timeout);
        self.post_from_send_buffer(data, Some((target, imm)), deadline, timeout)?;
        self.wait(deadline, timeout, "waiting for a write completion", |c| {
            c.in_flight == 0
        })
    }

    /// Copy `data` into the send buffer and post a SEND, or a WRITE with immediate to `write`.
    fn post_from_send_buffer(
        &mut self,
        data: &[u8],
        write: Option<((u64, u32, u32), u32)>,
        deadline: &mut Deadline,
        after: Duration,
    ) -> Result<(), RdmaError> {
        let mut max = self.b().send.len();
        if let Some(((_, _, len), _)) = write {
            max = max.min(len as usize);
        }
        if data.len() > max {
            return Err(RdmaError::TooLong {
                len: data.len(),
                max,
            });
        }
        // The one send buffer may still be read by a pipelined request: let them all finish.
        self.wait(
            deadline,
            after,
            "waiting for earlier sends to complete",
            |c| c.in_flight == 0,
        )?;
        self.buffers.as_mut().expect("live until into_buffers").send[..data.len()]
            .copy_from_slice(data);
        let (lkey, local) = (self.v().send_mr.lkey(), self.b().send.as_ptr() as u64);
        let write = write.map(|((addr, rkey, _), imm)| (rkey, addr, imm));
        // SAFETY: the send buffer is registered as `send_mr` and is not touched again until
        // this request's completion has been reaped; a write's remote range was advertised by
        // the peer for exactly this.
        unsafe { self.post(lkey, local, data.len(), write, true) }
    }

    /// Post one signaled SEND, or WRITE with immediate when `write` = (rkey, remote address,
    /// imm), of `len` bytes at `addr` under `lkey`. Up to [`INLINE_UP_TO`] bytes of host memory
    /// go inline: copied into the work request as it is posted, as perftest's latency tests
    /// do, so that the provider need not fetch them from the region.
    ///
    /// # Safety
    /// `addr..addr + len` must be registered under `lkey` and stay valid and untouched until
    /// the completion is reaped (`in_flight` counts it down); with `host`, it must be host
    /// memory the CPU may read. The remote range must be one the peer advertised for writes.
    unsafe fn post(
        &mut self,
        lkey: u32,
        addr: u64,
        len: usize,
        write: Option<(u32, u64, u32)>,
        host: bool,
    ) -> Result<(), RdmaError> {
        let inline = host && len <= self.inline_up_to;
        let wr_id = SEND_QUEUE | self.sends_posted;
        let mut guard = self.v().qp.start_post_send();
        // The inline flag as well as the inline data: rxe reads the data as inline only then.
        let flags = if inline {
            WorkRequestFlags::Signaled | WorkRequestFlags::Inline
        } else {
            WorkRequestFlags::Signaled
        };
        let wr = match write {
            None => guard.construct_wr(wr_id, flags).setup_send(),
            Some((rkey, raddr, imm)) => {
                guard
                    .construct_wr(wr_id, flags)
                    .setup_write_imm(rkey, raddr, imm.to_be())
            }
        };
        if inline {
            // SAFETY: the caller's contract: `len` bytes of host memory at `addr`, valid now.
            wr.setup_inline_data(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
        } else {
            // SAFETY: the caller's contract.
            unsafe { wr.setup_sge(lkey, addr, len as u32) };
        }
        guard.post().map_err(verbs)?;
        self.sends_posted += 1;
        self.in_flight += 1;
        Ok(())
    }

    /// Register caller-owned host memory (for example a pinned staging buffer) with this
    /// connection's protection domain, for local and remote writes.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay allocated and in place until the returned region is
    /// dropped, and nothing may rely on its contents while the peer may write into it.
    pub unsafe fn register_host(&mut self, ptr: *mut u8, len: usize) -> Result<Region, RdmaError> {
        let pd = Arc::clone(&self.v()._pd);
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite;
        // SAFETY: the caller's contract.
        let mr = unsafe { pd.reg_mr(ptr as usize, len, access) }.map_err(verbs)?;
        Ok(Region {
            mr,
            addr: ptr as u64,
            len,
            host: true,
        })
    }

    /// Register memory exported as a dmabuf (GPU memory, `ibv_reg_dmabuf_mr`): `len` bytes at
    /// `offset` into the dmabuf, addressed in work requests as `iova`.
    ///
    /// # Safety
    /// `fd` must be a dmabuf whose memory at `offset..offset + len` stays allocated until the
    /// returned region is dropped.
    pub unsafe fn register_dmabuf(
        &mut self,
        fd: std::os::fd::RawFd,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> Result<Region, RdmaError> {
        let pd = Arc::clone(&self.v()._pd);
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite;
        // SAFETY: the caller's contract.
        let mr = unsafe { pd.reg_dmabuf_mr(offset, len, iova, fd, access) }.map_err(verbs)?;
        Ok(Region {
            mr,
            addr: iova,
            len,
            host: false,
        })
    }

    /// RDMA WRITE `len` bytes from `local` at `offset` into `remote` at `remote_offset`, with
    /// immediate data `imm` (below 2^31); the peer's `recv` returns
    /// [`Received::WrittenToRegion`]. Returns once the write completed. No byte is copied: the
    /// NIC reads the caller's registered memory.
    #[allow(clippy::too_many_arguments)]
    pub fn write_region_imm(
        &mut self,
        local: &Region,
        offset: usize,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
        imm: u32,
        timeout: Duration,
    ) -> Result<(), RdmaError> {
        self.post_region_write(local, offset, len, remote, remote_offset, imm, timeout)?;
        self.finish_posted(timeout)
    }

    /// Like [`write_region_imm`](Self::write_region_imm), but returns once the write is
    /// posted: writes are pipelined, up to the send queue's depth (waiting, within `timeout`,
    /// for a slot when it is full). The bytes at `local[offset..offset + len]` are read by the
    /// NIC until [`finish_posted`](Self::finish_posted) returns; changing them before that
    /// sends whatever they hold by then.
    #[allow(clippy::too_many_arguments)]
    pub fn post_region_write(
        &mut self,
        local: &Region,
        offset: usize,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
        imm: u32,
        timeout: Duration,
    ) -> Result<(), RdmaError> {
        if imm & REGION_WRITE != 0 {
            return Err(RdmaError::ImmReserved(imm));
        }
        local.holds(offset, len)?;
        if remote_offset
            .checked_add(len as u64)
            .is_none_or(|end| end > remote.len as u64)
        {
            return Err(RdmaError::OutOfRegion {
                which: "remote",
                offset: remote_offset,
                len,
                capacity: remote.len as usize,
            });
        }
        self.wait_for_send_slot(timeout)?;
        let write = (remote.rkey, remote.addr + remote_offset, imm | REGION_WRITE);
        // SAFETY: the range lies inside `local`, registered under its lkey, which the caller
        // keeps alive (it lends `&Region`, and a Region is dropped only by its owner); the
        // contents are the caller's to keep until finish_posted. The remote range lies inside
        // what the peer advertised.
        unsafe {
            self.post(
                local.mr.lkey(),
                local.addr + offset as u64,
                len,
                Some(write),
                local.host,
            )
        }
    }

    /// Wait until every posted write and send has completed, within `timeout`.
    pub fn finish_posted(&mut self, timeout: Duration) -> Result<(), RdmaError> {
        self.wait(
            &mut Deadline::After(timeout),
            timeout,
            "waiting for send and write completions",
            |c| c.in_flight == 0,
        )
    }

    /// Pipelined requests may have at most this many in flight: the send queue's depth, or the
    /// receive ring's, whichever is smaller (each SEND, and each write with immediate, consumes
    /// one of the peer's posted receives; both sides use the same options).
    fn wait_for_send_slot(&mut self, timeout: Duration) -> Result<(), RdmaError> {
        let depth = SEND_DEPTH.min(self.opts.recv_depth).max(1);
        self.wait(
            &mut Deadline::After(timeout),
            timeout,
            "waiting for a send queue slot",
            |c| c.in_flight < depth,
        )
    }

    /// SEND `len` bytes of `local` at `offset`, straight from the caller's registered memory
    /// (no copy); returns once the send completed, within `timeout`.
    pub fn send_region(
        &mut self,
        local: &Region,
        offset: usize,
        len: usize,
        timeout: Duration,
    ) -> Result<(), RdmaError> {
        self.post_send_region(local, offset, len, timeout)?;
        self.finish_posted(timeout)
    }

    /// Like [`send_region`](Self::send_region), but returns once the SEND is posted: sends are
    /// pipelined up to the queue's depth, and complete in the order they were posted (a wait
    /// that sees otherwise returns [`RdmaError::OutOfOrder`]). The NIC reads
    /// `local[offset..offset + len]` until [`finish_posted`](Self::finish_posted) returns.
    pub fn post_send_region(
        &mut self,
        local: &Region,
        offset: usize,
        len: usize,
        timeout: Duration,
    ) -> Result<(), RdmaError> {
        local.holds(offset, len)?;
        // The peer's ring slots are as large as ours (both sides use the same options).
        if len > self.opts.max_message {
            return Err(RdmaError::TooLong {
                len,
                max: self.opts.max_message,
            });
        }
        self.wait_for_send_slot(timeout)?;
        // SAFETY: the range lies inside `local`, registered under its lkey; the caller lends
        // `&Region` and keeps it (and the memory under it) until the completion is reaped.
        unsafe {
            self.post(
                local.mr.lkey(),
                local.addr + offset as u64,
                len,
                None,
                local.host,
            )
        }
    }

    /// The next message or write from the peer, within `timeout`. A message is copied out of
    /// its ring slot, which is posted again at once.
    pub fn recv(&mut self, timeout: Duration) -> Result<Received, RdmaError> {
        self.recv_until(&mut Deadline::After(timeout), timeout)
    }

    fn recv_until(
        &mut self,
        deadline: &mut Deadline,
        after: Duration,
    ) -> Result<Received, RdmaError> {
        match self.next_arrival(deadline, after)? {
            Arrival::Landed { slot, len } => {
                let start = slot * self.opts.max_message;
                let message = self.b().recv[start..start + len].to_vec();
                self.post_recv(slot)?;
                Ok(Received::Message(message))
            }
            Arrival::Done(received) => Ok(received),
        }
    }

    /// The next message or write from the peer, within `timeout`, with a message left where it
    /// landed: its ring slot is lent to the caller, and posted again only when the loan ends.
    /// The loan borrows the connection, so nothing can receive into the slot (or use the
    /// connection at all) while the caller reads it:
    ///
    /// ```compile_fail,E0499
    /// # fn lent_twice(c: &mut wringer_transport::rdma::rc::RcConnection) {
    /// # let t = std::time::Duration::from_secs(1);
    /// let first = c.recv_in_place(t).unwrap();
    /// let second = c.recv(t); // error: `*c` is still borrowed by `first`
    /// drop(first);
    /// # }
    /// ```
    pub fn recv_in_place(&mut self, timeout: Duration) -> Result<InPlace<'_>, RdmaError> {
        match self.next_arrival(&mut Deadline::After(timeout), timeout)? {
            Arrival::Landed { slot, len } => Ok(InPlace::Message(LentSlot {
                conn: self,
                slot,
                len,
                returned: false,
            })),
            Arrival::Done(received) => Ok(InPlace::Other(received)),
        }
    }

    fn next_arrival(
        &mut self,
        deadline: &mut Deadline,
        after: Duration,
    ) -> Result<Arrival, RdmaError> {
        self.wait(deadline, after, "waiting for a receive", |c| {
            !c.ready.is_empty()
        })?;
        Ok(self.ready.pop_front().expect("checked non-empty"))
    }

    /// Receive requests posted and not yet completed: the ring's depth, less the slots whose
    /// messages wait to be received or are lent out.
    pub fn posted_receives(&self) -> usize {
        self.posted_recvs
    }

    /// Poll the CQ until `done` holds or the deadline passes. Error completions are counted and
    /// returned; a receive slot is reposted as soon as its data is copied out.
    fn wait(
        &mut self,
        deadline: &mut Deadline,
        after: Duration,
        during: &'static str,
        done: impl Fn(&Self) -> bool,
    ) -> Result<(), RdmaError> {
        let mut idle_since: Option<Instant> = None;
        let mut empty_polls = 0u32;
        // How long the wait had found nothing at its last look at the clock.
        let mut idle_for = Duration::ZERO;
        if let Some(e) = self.repost_failed.take() {
            return Err(e);
        }
        loop {
            if done(self) {
                return Ok(());
            }
            let mut got = vec![];
            if let Ok(poller) = self.v().cq.start_poll() {
                for wc in poller {
                    got.push((
                        wc.wr_id(),
                        wc.status(),
                        wc.byte_len() as usize,
                        wc.opcode(),
                        wc.imm_data(),
                    ));
                }
            }
            if got.is_empty() {
                // The clock and the CM channel (a syscall) are looked at once per batch of
                // empty polls: under TCG each costs microseconds, and a poll loop that paid
                // them every time saw its completions late.
                empty_polls += 1;
                if idle_for < SPIN_FOR && empty_polls % POLLS_PER_CHECK != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                if self.peer_gone_now() {
                    return Err(RdmaError::Disconnected);
                }
                // One reading of the clock per check, for the deadline and the idle time both.
                let now = Instant::now();
                if now >= deadline.fixed(now) {
                    return Err(RdmaError::Timeout { during, after });
                }
                idle_for = now - *idle_since.get_or_insert(now);
                idle_wait(idle_for);
                continue;
            }
            idle_since = None;
            idle_for = Duration::ZERO;
            empty_polls = 0;
            for (wr_id, status, len, opcode, imm) in got {
                let status = WcStatus::from_raw(status);
                *self.counts.0.entry(status).or_default() += 1;
                let expected = self.sends_completed;
                self.retire(wr_id);
                if !status.is_success() {
                    return Err(RdmaError::Completion { status, wr_id });
                }
                match wr_id {
                    sent if sent & SEND_QUEUE != 0 => {
                        if sent & !SEND_QUEUE != expected {
                            return Err(RdmaError::OutOfOrder {
                                expected,
                                got: sent & !SEND_QUEUE,
                            });
                        }
                        if self.echoing.front().is_some_and(|&(s, _)| s == expected) {
                            let (_, slot) = self.echoing.pop_front().expect("checked");
                            self.post_recv(slot)?;
                        }
                    }
                    slot => {
                        let slot = slot as usize;
                        // RECV_RDMA_WITH_IMM: the data landed in our write target.
                        // RECV_RDMA_WITH_IMM: the data landed in our write target, and the
                        // slot holds nothing, so it is posted again at once. A SEND's bytes stay
                        // in the slot until they are received (copied out, or lent).
                        if opcode == sideway::ibverbs::completion::WorkCompletionOperationType::ReceiveWithImmediate as u32 {
                            let imm = u32::from_be(imm);
                            let item = if imm & REGION_WRITE != 0 {
                                Received::WrittenToRegion { imm: imm & !REGION_WRITE, len }
                            } else {
                                Received::Written { imm, data: self.b().write[..len].to_vec() }
                            };
                            self.ready.push_back(Arrival::Done(item));
                            self.post_recv(slot)?;
                        } else {
                            self.ready.push_back(Arrival::Landed { slot, len });
                        }
                    }
                }
            }
        }
    }

    /// A completion (of any status) retires its work request.
    fn retire(&mut self, wr_id: u64) {
        if wr_id & SEND_QUEUE != 0 {
            self.in_flight = self.in_flight.saturating_sub(1);
            self.sends_completed += 1;
        } else {
            self.posted_recvs = self.posted_recvs.saturating_sub(1);
        }
    }

    /// Before the QP is destroyed: move it to the error state and poll until every posted work
    /// request has completed or been flushed, within [`QUIESCE_WITHIN`]. A QP destroyed with
    /// work requests outstanding leaves the hardware's view of its buffers undefined until the
    /// destroy returns, and hides completions nobody saw.
    fn quiesce(&mut self) {
        if self.verbs.is_none() || self.in_flight + self.posted_recvs == 0 {
            return;
        }
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        if self.v().qp.modify(&attr).is_err() {
            return;
        }
        let until = Instant::now() + QUIESCE_WITHIN;
        while self.in_flight + self.posted_recvs > 0 && Instant::now() < until {
            let mut got = vec![];
            if let Ok(poller) = self.v().cq.start_poll() {
                got.extend(poller.map(|wc| wc.wr_id()));
            }
            if got.is_empty() {
                std::thread::sleep(LONGEST_NAP);
            }
            for wr_id in got {
                self.retire(wr_id);
            }
        }
    }

    /// Quiesce, then release the verbs objects: the QP, then the memory regions, the CQ and
    /// the PD (the field order of [`Verbs`]).
    fn release_verbs(&mut self) {
        #[cfg(feature = "bug-injection")]
        {
            use crate::injected::{is, Bug};
            if is(Bug::DeregUnderPostedReceive) {
                // Test-only: the receive buffer's region goes first, under its posted receives.
                if let Some(Verbs {
                    qp,
                    send_mr,
                    recv_mr,
                    write_mr,
                    cq,
                    _pd,
                }) = self.verbs.take()
                {
                    drop(recv_mr);
                    self.verbs = Some(Verbs {
                        qp,
                        send_mr,
                        recv_mr: Arc::clone(&write_mr),
                        write_mr,
                        cq,
                        _pd,
                    });
                }
            }
            if is(Bug::DestroyWithReceivesPosted) {
                // Test-only: no flush; the QP goes with its receives still posted.
                drop(self.verbs.take());
                return;
            }
        }
        self.quiesce();
        drop(self.verbs.take());
    }

    /// Has the peer disconnected? The active side reads its own CM channel (without blocking);
    /// the passive side's flag is raised by its listener or server.
    fn peer_gone_now(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.peer_gone.load(Ordering::Acquire) {
            return true;
        }
        if let Some(ch) = &self.own_channel {
            let mut pfd = libc::pollfd {
                fd: ch.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, zero timeout; the channel outlives the call.
            if unsafe { libc::poll(&mut pfd, 1, 0) } > 0 {
                if let Ok(ev) = ch.get_cm_event() {
                    let t = ev.event_type();
                    let _ = ev.ack();
                    if matches!(
                        t,
                        EventType::Disconnected
                            | EventType::DeviceRemoval
                            | EventType::TimewaitExit
                    ) {
                        self.peer_gone.store(true, Ordering::Release);
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Completion outcomes so far, by status.
    pub fn counts(&self) -> &CompletionCounts {
        &self.counts
    }

    /// Disconnect (best effort; the peer sees DISCONNECTED).
    pub fn disconnect(&self) {
        let _ = self.id.disconnect();
    }
}

/// One idle pause of a completion poll that has found nothing for `idle` (see [`SPIN_FOR`]).
fn idle_wait(idle: Duration) {
    if idle < SPIN_FOR {
        std::hint::spin_loop();
    } else if idle < YIELD_UNTIL {
        std::thread::yield_now();
    } else {
        std::thread::sleep((idle / 8).min(LONGEST_NAP));
    }
}

impl Drop for RcConnection {
    fn drop(&mut self) {
        self.disconnect();
        // The QP and regions before the memory they point into.
        self.release_verbs();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_bound_is_one_wait_per_try_and_none_without_a_timeout() {
        let rdma_cm_default = AckTiming {
            timeout: 17,
            retry_cnt: 7,
        };
        assert_eq!(
            rdma_cm_default.ack_timeout(),
            Some(Duration::from_nanos(536_870_912))
        );
        assert_eq!(
            rdma_cm_default.retry_bound(),
            Some(Duration::from_nanos(536_870_912 * 8))
        );
        let forever = AckTiming {
            timeout: 0,
            retry_cnt: 7,
        };
        assert_eq!(forever.retry_bound(), None);
    }
}
