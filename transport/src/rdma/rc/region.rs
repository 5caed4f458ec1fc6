//! What a receive delivers (a copy or a lent slot of the ring) and registered regions,
//! local and advertised by the peer.

use super::*;

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
pub(super) enum Arrival {
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
    pub(super) conn: &'c mut RcConnection,
    pub(super) slot: usize,
    pub(super) len: usize,
    pub(super) returned: bool,
}

impl LentSlot<'_> {
    pub(super) fn range(&self) -> std::ops::Range<usize> {
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
pub(super) const REGION_WRITE: u32 = 1 << 31;

/// Memory the caller owns and registered with one connection: host memory, or GPU memory
/// through dmabuf. The caller keeps the memory alive and in place while the region lives.
pub struct Region {
    pub(super) mr: Arc<MemoryRegion>,
    /// The address work requests use for the first byte (the iova, for dmabuf).
    pub(super) addr: u64,
    pub(super) len: usize,
    /// Host memory, which the CPU may read (small sends from it go inline); not GPU memory.
    pub(super) host: bool,
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
    pub(super) fn holds(&self, offset: usize, len: usize) -> Result<(), RdmaError> {
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
