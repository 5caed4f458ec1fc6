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
    GenericQueuePair, PostSendGuard, QueuePair, QueuePairState, SetScatterGatherEntry,
    WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;
use sideway::rdmacm::communication_manager::{
    ConnectionParameter, Event, EventChannel, EventType, Identifier, PortSpace,
};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RdmaError {
    #[error("rdma_cm: {0}")]
    Cm(String),
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
    Completion { status: String, wr_id: u64 },
    #[error("message of {len} bytes exceeds the {max}-byte slots")]
    TooLong { len: usize, max: usize },
    #[error("the peer has not advertised a write target")]
    NoWriteTarget,
}

fn cm(e: impl std::fmt::Display) -> RdmaError {
    RdmaError::Cm(e.to_string())
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

/// Completion outcomes by status name (`SUCCESS`, `RETRY_EXC_ERR`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompletionCounts(pub BTreeMap<&'static str, u64>);

impl CompletionCounts {
    pub fn get(&self, status: &str) -> u64 {
        self.0.get(status).copied().unwrap_or(0)
    }

    pub fn errors(&self) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| **k != "SUCCESS")
            .map(|(_, v)| v)
            .sum()
    }
}

pub fn status_name(status: u32) -> &'static str {
    use WorkCompletionStatus::*;
    match WorkCompletionStatus::from(status) {
        Success => "SUCCESS",
        LocalLengthError => "LOC_LEN_ERR",
        LocalQueuePairOperationError => "LOC_QP_OP_ERR",
        LocalProtectionError => "LOC_PROT_ERR",
        WorkRequestFlushedError => "WR_FLUSH_ERR",
        BadResponseError => "BAD_RESP_ERR",
        LocalAccessError => "LOC_ACCESS_ERR",
        RemoteInvalidRequestError => "REM_INV_REQ_ERR",
        RemoteAccessError => "REM_ACCESS_ERR",
        RemoteOperationError => "REM_OP_ERR",
        RetryCounterExceededError => "RETRY_EXC_ERR",
        ResponderNotReadyRetryCounterExceededError => "RNR_RETRY_EXC_ERR",
        RemoteAbortedError => "REM_ABORT_ERR",
        FatalError => "FATAL_ERR",
        ResponseTimeoutError => "RESP_TIMEOUT_ERR",
        GeneralError => "GENERAL_ERR",
        _ => "OTHER_ERR",
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
}

const SEND_WR: u64 = u64::MAX;
const WRITE_WR: u64 = u64::MAX - 1;
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
    id.ok_or_else(|| cm("event without an identifier"))
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
        let mut conn = RcConnection::create(id, Arc::clone(&self.channel), self.opts)?;
        conn.ready_to_send()?;
        conn.post_ring()?;
        let mut param = ConnectionParameter::default();
        param.setup_qp_number(conn.qp.qp_number());
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
    let mut conn = RcConnection::create(id, Arc::clone(&channel), opts)?;
    conn.post_ring()?;
    let mut param = ConnectionParameter::default();
    param.setup_qp_number(conn.qp.qp_number());
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

/// One RC connection. Field order is drop order: the QP and memory regions go before the
/// protection domain and the buffers they cover.
pub struct RcConnection {
    qp: GenericQueuePair,
    send_mr: Arc<MemoryRegion>,
    recv_mr: Arc<MemoryRegion>,
    write_mr: Arc<MemoryRegion>,
    cq: GenericCompletionQueue,
    _pd: Arc<ProtectionDomain>,
    send_buf: Box<[u8]>,
    recv_buf: Box<[u8]>,
    write_buf: Box<[u8]>,
    id: Arc<Identifier>,
    _channel: Arc<EventChannel>,
    opts: RcOptions,
    peer_target: Option<(u64, u32, u32)>,
    ready: VecDeque<Received>,
    counts: CompletionCounts,
    send_done: bool,
}

impl RcConnection {
    fn create(
        id: Arc<Identifier>,
        channel: Arc<EventChannel>,
        opts: RcOptions,
    ) -> Result<RcConnection, RdmaError> {
        let ctx = id
            .get_device_context()
            .ok_or_else(|| cm("the identifier has no device yet"))?;
        let pd = ctx.alloc_pd().map_err(verbs)?;
        // The basic CQ: the extended one (ibv_start_poll) kept returning the same completion on
        // rxe with Debian 12's rdma-core.
        let cq: GenericCompletionQueue = ctx
            .create_cq_builder()
            .setup_cqe((opts.recv_depth * 2 + 8) as u32)
            .build()
            .map_err(verbs)?
            .into();
        let mut builder = pd.create_qp_builder();
        builder
            .setup_max_send_wr(8)
            .setup_max_recv_wr(opts.recv_depth as u32)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(cq.clone())
            .setup_recv_cq(cq.clone());
        let mut qp: GenericQueuePair = builder.build_ex().map_err(verbs)?.into();
        let mut attr = id.get_qp_attr(QueuePairState::Init).map_err(cm)?;
        // rdma_cm leaves remote write off on the active side; both sides accept writes here.
        attr.setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteWrite);
        qp.modify(&attr).map_err(verbs)?;
        let send_buf = vec![0u8; opts.max_message].into_boxed_slice();
        let recv_buf = vec![0u8; opts.max_message * opts.recv_depth].into_boxed_slice();
        let write_buf = vec![0u8; opts.max_message].into_boxed_slice();
        let local = AccessFlags::LocalWrite;
        // SAFETY: each region covers a boxed slice owned by the connection. Boxed slices never
        // move or reallocate, and the fields are declared so the regions are deregistered
        // before the buffers are freed.
        let (send_mr, recv_mr, write_mr) = unsafe {
            (
                pd.reg_mr(send_buf.as_ptr() as usize, send_buf.len(), local)
                    .map_err(verbs)?,
                pd.reg_mr(recv_buf.as_ptr() as usize, recv_buf.len(), local)
                    .map_err(verbs)?,
                pd.reg_mr(
                    write_buf.as_ptr() as usize,
                    write_buf.len(),
                    local | AccessFlags::RemoteWrite,
                )
                .map_err(verbs)?,
            )
        };
        Ok(RcConnection {
            qp,
            send_mr,
            recv_mr,
            write_mr,
            cq,
            _pd: pd,
            send_buf,
            recv_buf,
            write_buf,
            id,
            _channel: channel,
            opts,
            peer_target: None,
            ready: VecDeque::new(),
            counts: CompletionCounts::default(),
            send_done: false,
        })
    }

    fn ready_to_send(&mut self) -> Result<(), RdmaError> {
        for state in [QueuePairState::ReadyToReceive, QueuePairState::ReadyToSend] {
            let attr = self.id.get_qp_attr(state).map_err(cm)?;
            self.qp.modify(&attr).map_err(verbs)?;
        }
        Ok(())
    }

    fn post_ring(&mut self) -> Result<(), RdmaError> {
        for slot in 0..self.opts.recv_depth {
            self.post_recv(slot)?;
        }
        Ok(())
    }

    fn post_recv(&mut self, slot: usize) -> Result<(), RdmaError> {
        let size = self.opts.max_message;
        let addr = self.recv_buf.as_ptr() as u64 + (slot * size) as u64;
        let mut guard = self.qp.start_post_recv();
        let wr = guard.construct_wr(slot as u64);
        // SAFETY: the slot lies inside `recv_buf`, registered as `recv_mr`, which outlives the
        // QP's use of it (see the field order).
        unsafe { wr.setup_sge(self.recv_mr.lkey(), addr, size as u32) };
        guard.post().map_err(verbs)
    }

    /// Send our write target and wait for the peer's.
    fn exchange_adverts(&mut self, deadline: Instant, after: Duration) -> Result<(), RdmaError> {
        let mut advert = [0u8; ADVERT_LEN];
        advert[0..8].copy_from_slice(&(self.write_buf.as_ptr() as u64).to_be_bytes());
        advert[8..12].copy_from_slice(&self.write_mr.rkey().to_be_bytes());
        advert[12..16].copy_from_slice(&(self.write_buf.len() as u32).to_be_bytes());
        self.send_until(&advert, deadline, after)?;
        match self.recv_until(deadline, after)? {
            Received::Message(m) if m.len() == ADVERT_LEN => {
                let addr = u64::from_be_bytes(m[0..8].try_into().expect("8 bytes"));
                let rkey = u32::from_be_bytes(m[8..12].try_into().expect("4 bytes"));
                let len = u32::from_be_bytes(m[12..16].try_into().expect("4 bytes"));
                self.peer_target = Some((addr, rkey, len));
                Ok(())
            }
            other => Err(cm(format!(
                "expected the peer's write target, got {other:?}"
            ))),
        }
    }

    /// SEND `data`; returns once its completion arrived (or failed), within `timeout`.
    pub fn send(&mut self, data: &[u8], timeout: Duration) -> Result<(), RdmaError> {
        self.send_until(data, Instant::now() + timeout, timeout)
    }

    fn send_until(
        &mut self,
        data: &[u8],
        deadline: Instant,
        after: Duration,
    ) -> Result<(), RdmaError> {
        if data.len() > self.send_buf.len() {
            return Err(RdmaError::TooLong {
                len: data.len(),
                max: self.send_buf.len(),
            });
        }
        self.send_buf[..data.len()].copy_from_slice(data);
        self.send_done = false;
        {
            let mut guard = self.qp.start_post_send();
            let wr = guard
                .construct_wr(SEND_WR, WorkRequestFlags::Signaled)
                .setup_send();
            // SAFETY: `send_buf` is registered as `send_mr`; it is not touched again until the
            // completion for this request has been reaped below.
            unsafe {
                wr.setup_sge(
                    self.send_mr.lkey(),
                    self.send_buf.as_ptr() as u64,
                    data.len() as u32,
                )
            };
            guard.post().map_err(verbs)?;
        }
        self.wait(deadline, after, "waiting for a send completion", |c| {
            c.send_done
        })
    }

    /// RDMA WRITE `data` into the peer's advertised buffer, with immediate data `imm`.
    pub fn write_imm(&mut self, data: &[u8], imm: u32, timeout: Duration) -> Result<(), RdmaError> {
        let (addr, rkey, len) = self.peer_target.ok_or(RdmaError::NoWriteTarget)?;
        if data.len() > len as usize || data.len() > self.send_buf.len() {
            return Err(RdmaError::TooLong {
                len: data.len(),
                max: (len as usize).min(self.send_buf.len()),
            });
        }
        let deadline = Instant::now() + timeout;
        self.send_buf[..data.len()].copy_from_slice(data);
        self.send_done = false;
        {
            let mut guard = self.qp.start_post_send();
            let wr = guard
                .construct_wr(WRITE_WR, WorkRequestFlags::Signaled)
                .setup_write_imm(rkey, addr, imm.to_be());
            // SAFETY: as for SEND; the remote range was advertised by the peer for this.
            unsafe {
                wr.setup_sge(
                    self.send_mr.lkey(),
                    self.send_buf.as_ptr() as u64,
                    data.len() as u32,
                )
            };
            guard.post().map_err(verbs)?;
        }
        self.wait(deadline, timeout, "waiting for a write completion", |c| {
            c.send_done
        })
    }

    /// The next message or write from the peer, within `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Result<Received, RdmaError> {
        self.recv_until(Instant::now() + timeout, timeout)
    }

    fn recv_until(&mut self, deadline: Instant, after: Duration) -> Result<Received, RdmaError> {
        self.wait(deadline, after, "waiting for a receive", |c| {
            !c.ready.is_empty()
        })?;
        Ok(self.ready.pop_front().expect("checked non-empty"))
    }

    /// Poll the CQ until `done` holds or the deadline passes. Error completions are counted and
    /// returned; a receive slot is reposted as soon as its data is copied out.
    fn wait(
        &mut self,
        deadline: Instant,
        after: Duration,
        during: &'static str,
        done: impl Fn(&Self) -> bool,
    ) -> Result<(), RdmaError> {
        let mut idle = 0u32;
        loop {
            if done(self) {
                return Ok(());
            }
            let mut got = vec![];
            if let Ok(poller) = self.cq.start_poll() {
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
                if Instant::now() >= deadline {
                    return Err(RdmaError::Timeout { during, after });
                }
                // Spin briefly, then yield the core: completions have no cheaper event here.
                idle += 1;
                if idle > 64 {
                    std::thread::sleep(Duration::from_micros(50));
                }
                continue;
            }
            idle = 0;
            for (wr_id, status, len, opcode, imm) in got {
                let name = status_name(status);
                *self.counts.0.entry(name).or_default() += 1;
                if name != "SUCCESS" {
                    return Err(RdmaError::Completion {
                        status: name.to_string(),
                        wr_id,
                    });
                }
                match wr_id {
                    SEND_WR | WRITE_WR => self.send_done = true,
                    slot => {
                        let slot = slot as usize;
                        // RECV_RDMA_WITH_IMM: the data landed in our write target.
                        let item = if opcode == sideway::ibverbs::completion::WorkCompletionOperationType::ReceiveWithImmediate as u32 {
                            Received::Written { imm: u32::from_be(imm), data: self.write_buf[..len].to_vec() }
                        } else {
                            let start = slot * self.opts.max_message;
                            Received::Message(self.recv_buf[start..start + len].to_vec())
                        };
                        self.ready.push_back(item);
                        self.post_recv(slot)?;
                    }
                }
            }
        }
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

impl Drop for RcConnection {
    fn drop(&mut self) {
        self.disconnect();
    }
}
