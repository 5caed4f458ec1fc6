//! What the adversarial raw-peer steps share: hand-made frames and a transport connection over an accepted raw socket.

use std::time::Duration;

use anyhow::{bail, Result};
use wringer_transport::frame::{Frame, Kind, Section};
use wringer_transport::{Connection, ConnectionOptions, Error, ReceiverError, Terminal};

use super::{accept_within, pattern};
use crate::hosts::procfs::wait_until;
use crate::rank::context::RankContext;

pub(super) fn data(seed: u64, seq: u64, len: usize) -> Vec<u8> {
    Frame::new(Kind::Data, seq, pattern(seed, seq, len))
        .expect("small frame")
        .encode()
}

pub(super) fn accept_conn(ctx: &RankContext, timeout: Duration) -> Result<Connection> {
    let s = accept_within(&ctx.raw, timeout)?;
    Ok(Connection::from_stream(s, ConnectionOptions::default())?)
}

pub(super) fn truncated(section: Section, expected: usize, got: usize) -> String {
    ReceiverError::Truncated {
        section,
        expected,
        got,
    }
    .to_string()
}

/// What rank 0 sees on one adversarial connection, in words comparable to the expectation.
pub(super) fn observe(conn: &Connection, case: &str, timeout: Duration) -> Result<String> {
    if case == "local-shutdown" {
        // Stop only once the partial frame is consumed and the receiver blocks for the rest.
        let consumed = || unread(conn.raw_fd()) == 0 && conn.receiver_blocked_in_recv();
        if !wait_until(consumed, timeout) {
            bail!("the receiver never read the partial frame and blocked for the rest");
        }
        conn.close()?;
        return Ok(match conn.terminal() {
            Some(Terminal::LocalShutdown) => "local shutdown".into(),
            other => format!("{other:?}"),
        });
    }
    let mut frames = 0;
    loop {
        match conn.recv(timeout) {
            Ok(_) => frames += 1,
            Err(Error::PeerClosed) if frames == 1 => return Ok("frame, then clean EOF".into()),
            Err(Error::PeerClosed) => return Ok(format!("{frames} frames, then clean EOF")),
            Err(Error::Receiver(e)) => return Ok(e.to_string()),
            Err(e) => return Ok(format!("error: {e}")),
        }
    }
}

pub(super) fn unread(fd: i32) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through a pointer to `n`; `fd` is a live socket.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    if rc == 0 {
        n
    } else {
        0
    }
}
