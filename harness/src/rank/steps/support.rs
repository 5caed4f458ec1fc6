//! Helpers the step kinds share: connections between ranks, payload patterns, percentiles,
//! and the process-level checks (descriptors, threads).

use crate::model::invalid::Invalid;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use wringer_transport::{connect, ConnectOptions, Connection, Hello};

use crate::rank::context::RankContext;

crate::declare_metrics! {
    pub CYCLES = "cycles", Count, Neither;
    pub SHUTDOWN_P99_MS = "shutdown_p99_ms", Milliseconds, Lower;
    pub FD_DELTA = "fd_delta", Count, Lower;
    pub THREAD_DELTA = "thread_delta", Count, Lower;
    pub FRAMES_INTACT = "frames_intact", Count, Neither;
    pub SURVIVOR_DETECTED = "survivor_detected", Flag, Neither;
    pub DETECT_MS = "detect_ms", Milliseconds, Lower;
    pub LISTENER_TIMEOUT_FIRED = "listener_timeout_fired", Flag, Neither;
    pub LISTENER_TIMEOUT_MS = "listener_timeout_ms", Milliseconds, Lower;
    pub DATA_MISMATCHES = "data_mismatches", Count, Lower;
    pub CASES = "cases", Count, Neither;
    pub CASES_LATE = "cases_late", Count, Lower;
    pub SLOWEST_CASE_MS = "slowest_case_ms", Milliseconds, Lower;
}

/// The largest message a step may size: a buffer this big is allocated per message.
pub const MAX_MESSAGE: u32 = 16 << 20;
/// The most round trips, messages or cycles one step may ask for: each is real work, and a
/// count beyond this would outlast any deadline while sizing loops and buffers.
pub const MAX_COUNT: u32 = 1_000_000;
/// The most sizes one step may sweep.
pub const MAX_SIZES: usize = 32;

/// Sizes of a ping-pong: 1..=32 sizes, each in 1..=16 MiB, and 1..=1,000,000 iterations.
pub fn check_sizes(sizes: &[u32], iterations: u32) -> Result<(), Invalid> {
    if sizes.is_empty()
        || sizes.len() > MAX_SIZES
        || sizes.iter().any(|&b| b == 0 || b > MAX_MESSAGE)
    {
        return Err(
            format!("needs 1..={MAX_SIZES} sizes, each in 1..=16MiB (16777216 bytes)").into(),
        );
    }
    in_range("iterations", iterations, 1, MAX_COUNT)
}

/// `value` must lie in `min..=max`; the message names the parameter and the range.
pub fn in_range(name: &str, value: u32, min: u32, max: u32) -> Result<(), Invalid> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(format!("{name} must be {min}..={max}, got {value}").into())
    }
}

/// Sequence numbers for lazy connects, unique per step so steps never collide.
pub fn seq(step: usize, n: u64) -> u64 {
    (step as u64) << 32 | n
}

/// Deterministic payload: the receiver can verify every byte without being told them. All
/// eight bytes of each xorshift step are used: the 8-rank ping-pong makes about 400 MB of
/// pattern per repeat, and a step per byte cost a third of its time.
pub fn pattern(seed: u64, tag: u64, len: usize) -> Vec<u8> {
    let mut x = seed ^ tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    let mut out = Vec::with_capacity(len.next_multiple_of(8));
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Seeded choices (splitmix64): every rank that starts from the same seed and tag makes the
/// same schedule, and a run's `--seed` makes it again.
pub struct Seeded(u64);

impl Seeded {
    pub fn new(seed: u64, tag: u64) -> Seeded {
        Seeded(seed ^ tag.wrapping_mul(0xd1b5_4a32_d192_ed03))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo)
    }
}

pub fn connect_to(
    ctx: &RankContext,
    peer: u32,
    sequence: u64,
    deadline: Duration,
) -> Result<Connection> {
    let hello = Hello {
        rank: ctx.rank,
        sequence,
        generation: 0,
        token: ctx.token,
    };
    let opts = ConnectOptions {
        deadline,
        ..ConnectOptions::default()
    };
    Ok(connect(ctx.peers[peer as usize].transport, &hello, &opts)?)
}

pub fn raw_connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Connect to `addr` as this rank with `sequence`, the connect and the hello both bounded by
/// `limit`; the transport's error is kept whole, for steps that judge its kind.
pub fn connect_within(
    ctx: &RankContext,
    addr: SocketAddr,
    sequence: u64,
    limit: Duration,
) -> wringer_transport::Result<Connection> {
    let hello = Hello {
        rank: ctx.rank,
        sequence,
        generation: 0,
        token: ctx.token,
    };
    let opts = ConnectOptions {
        deadline: limit,
        hello_timeout: limit,
        ..ConnectOptions::default()
    };
    connect(addr, &hello, &opts)
}

/// Accept one raw connection, waiting at most `timeout`.
pub fn accept_within(listener: &TcpListener, timeout: Duration) -> Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    bail!("no peer connected within {timeout:?}");
                }
                let mut pfd = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call; the listener keeps
                // the fd open.
                unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Percentile (0..=100) of unsorted samples, or 0 for none.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let idx = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[idx.min(v.len() - 1)]
}

/// Wait (bounded) for this process's descriptor and thread counts to return to a baseline;
/// returns the remaining deltas. Threads that just finished need a moment to leave /proc.
pub fn settle(fds: usize, threads: usize, limit: Duration) -> (f64, f64) {
    let deadline = Instant::now() + limit;
    loop {
        let (f, t) = (
            crate::hosts::procfs::open_fds(),
            crate::hosts::procfs::threads(),
        );
        if (f == fds && t == threads) || Instant::now() >= deadline {
            return (f as f64 - fds as f64, t as f64 - threads as f64);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether this process has no descriptor `fd`. Asked of /proc by path, not of the fd itself:
/// a call on a closed fd is exactly what the lifecycle audit flags.
pub fn fd_is_closed(fd: i32) -> bool {
    std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_err()
}

#[cfg(test)]
mod tests {
    use super::pattern;

    #[test]
    fn a_pattern_is_repeatable_exact_in_length_and_distinct_per_tag() {
        for len in [0, 1, 7, 8, 9, 4096, 65537] {
            let p = pattern(42, 7, len);
            assert_eq!(p.len(), len);
            assert_eq!(p, pattern(42, 7, len));
            // A shorter message of the same tag is a prefix: sizes share their bytes.
            assert_eq!(&pattern(42, 7, len + 5)[..len], &p[..]);
        }
        assert_ne!(pattern(42, 7, 64), pattern(42, 8, 64));
        assert_ne!(pattern(42, 7, 64), pattern(43, 7, 64));
        // Every byte position varies, not only the low byte of each step.
        let p = pattern(1, 2, 4096);
        for lane in 0..8 {
            let distinct: std::collections::BTreeSet<u8> =
                p.iter().skip(lane).step_by(8).copied().collect();
            assert!(distinct.len() > 200, "lane {lane}: {}", distinct.len());
        }
    }
}
