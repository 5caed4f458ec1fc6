//! The data path: the receive ring, SEND and RDMA WRITE with immediate data, and the
//! completion waits, each with a deadline.

use super::*;
pub(super) use crate::deadline::Deadline;

/// Send-queue work requests (SENDs and WRITEs) carry this bit and their sequence number in
/// their wr_id; receives carry their ring slot. RC completes a send queue in order, and the
/// sequence lets every wait check that it does.
pub(super) const SEND_QUEUE: u64 = 1 << 63;

/// Send work requests a connection may have in flight: region writes are pipelined up to this
/// (or to the receive ring's depth, whichever is smaller: each write with immediate consumes
/// one of the peer's posted receives, and both sides use the same options).
pub(super) const SEND_DEPTH: usize = 16;

/// Sends of up to this many bytes of host memory go inline (perftest's default for its latency
/// tests on RC).
pub(super) const INLINE_UP_TO: usize = 236;

/// How an idle completion poll waits: it spins this long, then yields the core until
/// [`YIELD_UNTIL`], then sleeps an eighth of the time it has been idle (at most
/// [`LONGEST_NAP`]). A completion that comes soon costs no sleep; a long wait costs few polls.
pub(super) const SPIN_FOR: Duration = Duration::from_micros(200);
pub(super) const YIELD_UNTIL: Duration = Duration::from_millis(5);
pub(super) const LONGEST_NAP: Duration = Duration::from_millis(1);
/// How long a teardown waits for the flushed completions of a QP in the error state (soft-RoCE
/// under TCG flushes a full ring in milliseconds; hardware in microseconds).
pub(super) const QUIESCE_WITHIN: Duration = Duration::from_secs(2);
/// Empty completion polls between two looks at the clock and the connection manager while a
/// wait spins (past [`SPIN_FOR`], every poll looks: it yields or naps anyway).
pub(super) const POLLS_PER_CHECK: u32 = 128;
/// The first message each side sends: where the peer may write (addr, rkey, len).
pub(super) const ADVERT_LEN: usize = 16;

impl RcConnection {
    pub(crate) fn post_ring(&mut self) -> Result<(), RdmaError> {
        for slot in 0..self.opts.recv_depth {
            self.post_recv(slot)?;
        }
        Ok(())
    }

    pub(super) fn post_recv(&mut self, slot: usize) -> Result<(), RdmaError> {
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

    pub(super) fn send_until(
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
    pub(super) fn post_from_send_buffer(
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
    pub(super) unsafe fn post(
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
    pub(super) fn wait_for_send_slot(&mut self, timeout: Duration) -> Result<(), RdmaError> {
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

    pub(super) fn recv_until(
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

    pub(super) fn next_arrival(
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

    /// Every slot of the receive ring is in it: posted, or holding a message that waits to be
    /// received. False while a slot is lent out, or an echo from one has not yet completed (and
    /// for ever, if a loan's end failed to post its slot again). Unlike
    /// [`posted_receives`](Self::posted_receives), it does not change when a message arrives,
    /// so it may be asked while the peer keeps sending.
    pub fn ring_whole(&self) -> bool {
        let waiting = self
            .ready
            .iter()
            .filter(|a| matches!(a, Arrival::Landed { .. }))
            .count();
        self.posted_recvs + waiting == self.opts.recv_depth
    }

    /// Poll the CQ until `done` holds or the deadline passes. Error completions are counted and
    /// returned; a receive slot is reposted as soon as its data is copied out.
    pub(super) fn wait(
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
    pub(super) fn retire(&mut self, wr_id: u64) {
        if wr_id & SEND_QUEUE != 0 {
            self.in_flight = self.in_flight.saturating_sub(1);
            self.sends_completed += 1;
        } else {
            self.posted_recvs = self.posted_recvs.saturating_sub(1);
        }
    }
}

/// One idle pause of a completion poll that has found nothing for `idle` (see [`SPIN_FOR`]).
pub(super) fn idle_wait(idle: Duration) {
    if idle < SPIN_FOR {
        std::hint::spin_loop();
    } else if idle < YIELD_UNTIL {
        std::thread::yield_now();
    } else {
        std::thread::sleep((idle / 8).min(LONGEST_NAP));
    }
}
