//! Teardown: quiesce the queue pair, release the verbs objects in order, notice the peer gone.

use super::*;

impl RcConnection {
    /// Before the QP is destroyed: move it to the error state and poll until every posted work
    /// request has completed or been flushed, within [`QUIESCE_WITHIN`]. A QP destroyed with
    /// work requests outstanding leaves the hardware's view of its buffers undefined until the
    /// destroy returns, and hides completions nobody saw.
    pub(super) fn quiesce(&mut self) {
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
    pub(super) fn release_verbs(&mut self) {
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
    pub(super) fn peer_gone_now(&self) -> bool {
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
}
