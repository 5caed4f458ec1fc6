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

mod cm;
mod completion;
mod data_path;
mod error;
mod region;
mod teardown;

pub use self::cm::*;
pub use self::completion::*;
use self::data_path::*;
pub use self::error::*;
pub use self::region::*;

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
}

impl RcConnection {
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
