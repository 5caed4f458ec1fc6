//! The rendezvous server: the coordinator's listener, which admits a rank only with the run's
//! token in a bounded hello, then turns each rank's line into [`Event`]s for the shell. A
//! stranger gets no more than a bounded read and a place among a bounded few.

use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use crossbeam_channel::Sender;

use crate::rank::protocol::{read_line, RankMsg};

/// What the rendezvous server tells the shell: a rank joined, sent a message, or left.
pub(super) enum Event {
    Joined {
        conn: u64,
        rank: u32,
        pid: u32,
        writer: TcpStream,
    },
    Msg {
        conn: u64,
        rank: u32,
        msg: RankMsg,
    },
    /// The rank's line closed: every message it sent has been delivered before this.
    Gone {
        conn: u64,
        rank: u32,
    },
}

pub(super) fn spawn_acceptor(
    listener: Arc<TcpListener>,
    token: String,
    events: Sender<Event>,
    rejected: Arc<AtomicU64>,
    open: OpenConns,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut readers = vec![];
        let mut conn = 0u64;
        let unproven = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        while let Ok((stream, _)) = listener.accept() {
            conn += 1;
            // Strangers cannot pile up: past this many connections that have not yet proved
            // themselves, a new one is closed at once (and counted).
            if unproven.load(Ordering::Relaxed) >= MAX_UNPROVEN {
                rejected.fetch_add(1, Ordering::Relaxed);
                let _ = stream.shutdown(std::net::Shutdown::Both);
                continue;
            }
            if let Ok(clone) = stream.try_clone() {
                open.lock().unwrap_or_else(|p| p.into_inner()).push(clone);
            }
            unproven.fetch_add(1, Ordering::Relaxed);
            let (token, events, rejected) = (token.clone(), events.clone(), Arc::clone(&rejected));
            let unproven = Arc::clone(&unproven);
            readers.push(std::thread::spawn(move || {
                serve_rank(conn, stream, &token, &events, &rejected, &unproven)
            }));
            readers.retain(|r: &std::thread::JoinHandle<()>| !r.is_finished());
        }
        for r in readers {
            let _ = r.join();
        }
    })
}

/// Every rendezvous connection accepted, so all can be cut when the run ends.
pub(super) type OpenConns = Arc<std::sync::Mutex<Vec<TcpStream>>>;

/// Most connections that may be waiting to prove themselves at once.
const MAX_UNPROVEN: usize = 64;
/// A hello is one short line; a peer gets this many bytes, and this long in all, to send it.
const MAX_HELLO_BYTES: usize = 4096;
const HELLO_LIMIT: Duration = Duration::from_secs(10);

/// Read the first line within `HELLO_LIMIT` in all (a byte now and then does not extend it)
/// and `MAX_HELLO_BYTES`; `None` for anything else.
fn read_hello(stream: &TcpStream, limit: Duration) -> Option<Vec<u8>> {
    use std::io::Read;
    let deadline = Instant::now() + limit;
    let mut line = Vec::with_capacity(256);
    let mut byte = [0u8; 256];
    let mut s = stream;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return None;
        }
        // Peek first so nothing after the newline is taken from the rank's later messages.
        let n = match stream.peek(&mut byte) {
            Ok(0) | Err(_) => return None,
            Ok(n) => n,
        };
        let take = byte[..n]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(n, |i| i + 1);
        let mut chunk = vec![0u8; take];
        s.read_exact(&mut chunk).ok()?;
        line.extend_from_slice(&chunk);
        if line.ends_with(b"\n") {
            return Some(line);
        }
        if line.len() > MAX_HELLO_BYTES {
            return None;
        }
    }
}

/// The first line must be a hello with this run's token; anything else is rejected and counted.
fn serve_rank(
    conn: u64,
    stream: TcpStream,
    token: &str,
    events: &Sender<Event>,
    rejected: &AtomicU64,
    unproven: &std::sync::atomic::AtomicUsize,
) {
    let hello = read_hello(&stream, HELLO_LIMIT)
        .and_then(|line| serde_json::from_slice::<RankMsg>(&line).ok());
    unproven.fetch_sub(1, Ordering::Relaxed);
    let Ok(writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let (rank, pid) = match hello {
        Some(RankMsg::Hello {
            rank,
            token: t,
            pid,
        }) if t == token => (rank, pid),
        _ => {
            rejected.fetch_add(1, Ordering::Relaxed);
            let _ = writer.shutdown(std::net::Shutdown::Both);
            return;
        }
    };
    // Authenticated ranks live until they exit (or are killed); no read deadline from here on,
    // the watchdog owns the deadlines.
    let _ = reader.get_ref().set_read_timeout(None);
    if events
        .send(Event::Joined {
            conn,
            rank,
            pid,
            writer,
        })
        .is_err()
    {
        return;
    }
    loop {
        match read_line::<_, RankMsg>(&mut reader) {
            Ok(Some(msg)) => {
                if events.send(Event::Msg { conn, rank, msg }).is_err() {
                    return;
                }
            }
            _ => {
                let _ = events.send(Event::Gone { conn, rank });
                return;
            }
        }
    }
}

pub fn random_token() -> Result<String> {
    let mut buf = [0u8; 16];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use super::{read_hello, MAX_HELLO_BYTES};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn a_hello_is_read_whole_and_nothing_after_it() {
        let (mut c, s) = pair();
        c.write_all(b"{\"hello\":1}\nnext line\n").unwrap();
        let line = read_hello(&s, Duration::from_secs(5)).unwrap();
        assert_eq!(line, b"{\"hello\":1}\n");
        let mut rest = [0u8; 10];
        use std::io::Read;
        (&s).read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"next line\n");
    }

    #[test]
    fn a_peer_that_dribbles_bytes_gets_the_limit_in_all_not_per_byte() {
        let (c, s) = pair();
        let dribbler = std::thread::spawn(move || {
            let mut c = c;
            for _ in 0..40 {
                if c.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let started = Instant::now();
        assert!(read_hello(&s, Duration::from_millis(400)).is_none());
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
        drop(s);
        let _ = dribbler.join();
    }

    #[test]
    fn a_hello_longer_than_any_real_one_is_refused_without_buffering_it() {
        let (mut c, s) = pair();
        let junk = vec![b'a'; MAX_HELLO_BYTES * 4];
        let writer = std::thread::spawn(move || {
            let _ = c.write_all(&junk);
        });
        assert!(read_hello(&s, Duration::from_secs(5)).is_none());
        drop(s);
        let _ = writer.join();
    }
}
