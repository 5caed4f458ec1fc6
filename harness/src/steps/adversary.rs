//! Steps where rank 1 is an adversarial raw peer (plain TCP, hand-made bytes) and rank 0 runs
//! the transport: exact reads, the four end-of-stream outcomes, and receiver failures.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use anyhow::{bail, Result};
use transport::frame::{Frame, FrameError, Kind, Section, HEADER_LEN};
use transport::{Connection, ConnectionOptions, Error, ReceiverError, Terminal};

use super::{accept_within, pattern, raw_connect};
use crate::procfs::wait_until;
use crate::protocol::StepReport;
use crate::rank::Ctx;

fn data(seed: u64, seq: u64, len: usize) -> Vec<u8> {
    Frame::new(Kind::Data, seq, pattern(seed, seq, len))
        .expect("small frame")
        .encode()
}

fn accept_conn(ctx: &Ctx, timeout: Duration) -> Result<Connection> {
    let s = accept_within(&ctx.raw, timeout)?;
    Ok(Connection::from_stream(s, ConnectionOptions::default())?)
}

pub fn exact_reads(
    ctx: &Ctx,
    dribbled: u32,
    split_len: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let split_len = split_len as usize;
    let splits = HEADER_LEN + split_len - 1;
    let expected = dribbled as usize + splits;
    match ctx.rank {
        1 => {
            let mut s = raw_connect(ctx.peers[0].raw, deadline)?;
            let mut seq = 0u64;
            for _ in 0..dribbled {
                for byte in data(ctx.seed, seq, 100 + seq as usize) {
                    s.write_all(&[byte])?;
                }
                seq += 1;
            }
            for split in 1..=splits {
                let bytes = data(ctx.seed, seq, split_len);
                s.write_all(&bytes[..split])?;
                s.write_all(&bytes[split..])?;
                seq += 1;
            }
            s.shutdown(Shutdown::Write)?;
            ctx.control.barrier("exact-reads-checked", 2, deadline)?;
        }
        0 => {
            let conn = accept_conn(ctx, deadline)?;
            let (mut intact, mut corrupt) = (0u32, 0u32);
            for seq in 0..expected as u64 {
                let len = if seq < dribbled as u64 {
                    100 + seq as usize
                } else {
                    split_len
                };
                match conn.recv(deadline) {
                    Ok(f)
                        if f.payload == pattern(ctx.seed, seq, len) && f.header.sequence == seq =>
                    {
                        intact += 1
                    }
                    Ok(f) => {
                        corrupt += 1;
                        report.notes.push(format!(
                            "frame {seq}: {} bytes differ from the pattern",
                            f.payload.len()
                        ));
                    }
                    Err(e) => {
                        report.notes.push(format!("after {intact} frames: {e}"));
                        break;
                    }
                }
            }
            let m = &mut report.metrics;
            m.insert("frames_intact".into(), intact as f64);
            m.insert("frames_corrupt".into(), corrupt as f64);
            m.insert(
                "frames_missing".into(),
                (expected as u32 - intact - corrupt) as f64,
            );
            report.notes.push(format!("{expected} frames expected: {dribbled} dribbled byte by byte, {splits} split at every offset"));
            ctx.control.barrier("exact-reads-checked", 2, deadline)?;
        }
        _ => {}
    }
    Ok(())
}

/// The cases, in the order rank 1 plays them, each with the outcome rank 0 must observe.
const CASES: [&str; 5] = [
    "clean-eof",
    "truncated-header",
    "truncated-payload",
    "garbage-header",
    "local-shutdown",
];

pub fn eof_truncation(
    ctx: &Ctx,
    step: usize,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let barrier = format!("eof-{step}-local-shutdown-done");
    match ctx.rank {
        1 => {
            let frame = data(ctx.seed, 0, 10);
            let cut = data(ctx.seed, 1, 100);
            for case in CASES {
                let mut s = raw_connect(ctx.peers[0].raw, deadline)?;
                match case {
                    "clean-eof" => s.write_all(&frame)?,
                    "truncated-header" => s.write_all(&cut[..7])?,
                    "truncated-payload" => s.write_all(&cut[..HEADER_LEN + 33])?,
                    "garbage-header" => s.write_all(b"GARBAGE!GARBAGE!GARBAGE!")?,
                    _ => {
                        // Half a frame, then hold the connection open: rank 0 stops its side.
                        s.write_all(&cut[..30])?;
                        ctx.control.barrier(&barrier, 2, deadline)?;
                    }
                }
                s.shutdown(Shutdown::Both).ok();
            }
        }
        0 => {
            let mut misclassified = 0;
            for case in CASES {
                let conn = accept_conn(ctx, deadline)?;
                let observed = observe(&conn, case, deadline)?;
                let expected = match case {
                    "clean-eof" => "frame, then clean EOF".to_string(),
                    "truncated-header" => truncated(Section::Header, HEADER_LEN, 7),
                    "truncated-payload" => truncated(Section::Payload, 100, 33),
                    "garbage-header" => format!(
                        "{}",
                        ReceiverError::Frame(FrameError::BadMagic { found: *b"GARB" })
                    ),
                    _ => "local shutdown".to_string(),
                };
                if observed != expected {
                    misclassified += 1;
                }
                report.notes.push(format!(
                    "{case}: expected `{expected}`, observed `{observed}`"
                ));
                if case == "local-shutdown" {
                    ctx.control.barrier(&barrier, 2, deadline)?;
                }
            }
            report
                .metrics
                .insert("eof_cases".into(), CASES.len() as f64);
            report
                .metrics
                .insert("eof_misclassified".into(), misclassified as f64);
        }
        _ => {}
    }
    Ok(())
}

fn truncated(section: Section, expected: usize, got: usize) -> String {
    ReceiverError::Truncated {
        section,
        expected,
        got,
    }
    .to_string()
}

/// What rank 0 sees on one adversarial connection, in words comparable to the expectation.
fn observe(conn: &Connection, case: &str, timeout: Duration) -> Result<String> {
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

fn unread(fd: i32) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through a pointer to `n`; `fd` is a live socket.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    if rc == 0 {
        n
    } else {
        0
    }
}

pub fn receiver_error(
    ctx: &Ctx,
    step: usize,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let barrier = format!("receiver-error-{step}-checked");
    match ctx.rank {
        1 => {
            let mut s: TcpStream = raw_connect(ctx.peers[0].raw, deadline)?;
            s.write_all(b"this is not a wringer frame")?;
            ctx.control.barrier(&barrier, 2, deadline)?;
        }
        0 => {
            let conn = accept_conn(ctx, deadline)?;
            if !wait_until(|| conn.terminal().is_some(), deadline) {
                bail!("the receiver never failed on the garbage");
            }
            let send = conn.send(b"after the failure", deadline);
            let flush = conn.flush(deadline);
            let saw = |r: &transport::Result<()>| matches!(r, Err(Error::Receiver(_))) as u8 as f64;
            report
                .metrics
                .insert("send_saw_receiver_error".into(), saw(&send));
            report
                .metrics
                .insert("flush_saw_receiver_error".into(), saw(&flush));
            report
                .notes
                .push(format!("receiver ended: {:?}", conn.terminal()));
            report
                .notes
                .push(format!("send: {send:?}; flush: {flush:?}"));
            ctx.control.barrier(&barrier, 2, deadline)?;
        }
        _ => {}
    }
    Ok(())
}
