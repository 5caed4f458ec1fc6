//! The connection's threads under a model checker (shuttle): the real `conn.rs`, built with
//! `--cfg wringer_model` so that its locks, atomics, channels and threads are shuttle's, over a
//! model stream (`model_socket`). Each model runs a few hundred schedules chosen by PCT (depth
//! 3: the scheduler may preempt at up to three points of its choosing, the bound under which PCT
//! finds a bug of depth 3 with a stated probability) and says how many it ran. A failing schedule
//! is written to a file and replayed, and fails again. `just model-check` runs these; an
//! ordinary build compiles this file to nothing.
//!
//! What each model holds (on every schedule): the read path delivers every frame once and in
//! order to one or two callers racing the receiver, through hand-overs of the read side, and
//! reports the end to every caller; teardown against callers in `recv` and `send` ends every
//! thread (a wait that never ends is a deadlock shuttle reports), releases the descriptor only
//! after the receiver is done (a use of a closed model descriptor fails the model), and gives
//! each caller an error that says closed.
#![cfg(wringer_model)]

use std::net::Shutdown;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Duration;

use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::sync::Arc;
use shuttle::{Config, FailurePersistence, MaxSteps, Runner};
use wringer_transport::frame::{Header, Kind};
use wringer_transport::model::{pair, pass_time, reset_clock, set_model_bug, Socket};
use wringer_transport::{Connection, ConnectionOptions, Error, ReceiverError, Terminal};

/// Schedules per model (WRINGER_MODEL_SCHEDULES overrides).
fn schedules() -> usize {
    std::env::var("WRINGER_MODEL_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000)
}

/// The schedulers' seed (WRINGER_MODEL_SEED overrides): fixed, so that a run explores the same
/// schedules every time (a CI that passes or fails for the code, never by the draw); another
/// seed explores others.
fn seed() -> u64 {
    std::env::var("WRINGER_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2026)
}

/// PCT's bound: preemption points per schedule.
const DEPTH: usize = 3;

/// A step bound far above any legitimate schedule here (a few thousand steps): one that runs
/// past it is a thread that never stops, which fails the model.
const MAX_STEPS: usize = 200_000;

const FRAMES: u64 = 4;

fn frame(seq: u64) -> Vec<u8> {
    let payload = [seq as u8; 5];
    let mut out = Header {
        kind: Kind::Data,
        flags: 0,
        sequence: seq,
        len: payload.len() as u32,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(&payload);
    out
}

/// How the peer ends its stream after its frames.
#[derive(Clone, Copy, PartialEq)]
enum PeerEnd {
    /// It does not (teardown comes from our side).
    Open,
    /// FIN: a clean end.
    Fin,
    /// RST: an error that can be read only once.
    Reset,
}

/// The peer's side: `FRAMES` frames, each sent in two pieces (so a reader meets half a
/// frame), then its end. Returns its socket, kept open until the model ends.
fn peer_sends_then_ends(theirs: Socket, end: PeerEnd) -> shuttle::thread::JoinHandle<Socket> {
    shuttle::thread::spawn(move || {
        for seq in 0..FRAMES {
            let bytes = frame(seq);
            let (a, b) = bytes.split_at(7);
            theirs.write_all(a);
            shuttle::thread::yield_now();
            theirs.write_all(b);
        }
        match end {
            PeerEnd::Open => {}
            PeerEnd::Fin => theirs.shutdown(Shutdown::Write).unwrap(),
            PeerEnd::Reset => theirs.abort(),
        }
        theirs
    })
}

/// A caller of `recv` until the connection ends: the sequences it got, and the end it saw.
fn receive_until_end(conn: &Connection) -> (Vec<u64>, Error) {
    let mut got = vec![];
    loop {
        match conn.recv(Duration::from_millis(2)) {
            Ok(f) => {
                assert_eq!(
                    f.payload,
                    vec![f.header.sequence as u8; 5],
                    "payload intact"
                );
                got.push(f.header.sequence);
                // Away from recv for a while, as an application is: the receiver reads
                // meanwhile, so the read side changes hands both ways.
                pass_time(Duration::from_millis(2));
            }
            Err(Error::Timeout { .. }) => continue,
            Err(e) => return (got, e),
        }
    }
}

fn options() -> ConnectionOptions {
    ConnectionOptions {
        queue_depth: 2,
        ..ConnectionOptions::default()
    }
}

/// Schedules of the read path in which the receiver queued a frame, and in which the read side
/// changed hands: evidence that the models reach both paths, not just one.
static QUEUED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static HANDED_OVER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The read path: `callers` threads in `recv` racing the receiver thread for the stream, which
/// the peer ends with `end` (FIN or RST).
fn read_path(callers: usize, end: PeerEnd) -> impl Fn() + Send + Sync + 'static {
    move || {
        reset_clock();
        let (ours, theirs) = pair();
        let conn = Arc::new(Connection::over_model(ours, options()).unwrap());
        let peer = peer_sends_then_ends(theirs, end);
        let peer_end = end;
        let readers: Vec<_> = (0..callers)
            .map(|_| {
                let conn = Arc::clone(&conn);
                shuttle::thread::spawn(move || receive_until_end(&conn))
            })
            .collect();
        let mut all = vec![];
        for r in readers {
            let (got, end) = r.join().unwrap();
            assert!(
                got.windows(2).all(|w| w[0] < w[1]),
                "a caller got frames out of order: {got:?}"
            );
            // Every caller is told the end the connection published, the one there was.
            let published = conn.terminal().cloned();
            match peer_end {
                PeerEnd::Reset => assert!(
                    matches!(&end, Error::Receiver(ReceiverError::Io { .. }))
                        && matches!(published, Some(Terminal::Failed(_))),
                    "the peer reset: a caller was told {end:?}, the connection {published:?}"
                ),
                _ => assert!(
                    matches!(end, Error::PeerClosed)
                        && matches!(published, Some(Terminal::PeerClosed)),
                    "the peer ended: a caller was told {end:?}, the connection {published:?}"
                ),
            }
            all.extend(got);
        }
        let stats = conn.read_stats();
        if stats.frames_queued > 0 {
            QUEUED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if stats.handovers > 0 {
            HANDED_OVER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        all.sort_unstable();
        assert_eq!(
            all,
            (0..FRAMES).collect::<Vec<_>>(),
            "every frame delivered once"
        );
        conn.close().unwrap();
        drop(peer.join().unwrap());
    }
}

/// Teardown: `close` from the main thread while a caller is in `recv` and another in `send`,
/// and frames are still coming.
///
/// `quiet`: the peer has sent everything before the close (the receiver may be asleep waiting
/// for bytes that never come, with a caller in `recv`); else frames are still coming.
fn teardown(quiet: bool) -> impl Fn() + Send + Sync + 'static {
    move || {
        reset_clock();
        let (ours, theirs) = pair();
        let conn = Arc::new(Connection::over_model(ours, options()).unwrap());
        let peer = peer_sends_then_ends(theirs, PeerEnd::Open);
        let peer = if quiet {
            // Everything sent and the peer silent from now on.
            let theirs = peer.join().unwrap();
            shuttle::thread::spawn(move || theirs)
        } else {
            peer
        };
        let reader = {
            let conn = Arc::clone(&conn);
            shuttle::thread::spawn(move || receive_until_end(&conn))
        };
        let sender = {
            let conn = Arc::clone(&conn);
            // A few sends, then one after the close is certain to have begun.
            shuttle::thread::spawn(move || {
                for _ in 0..3 {
                    match conn.send(b"x", Duration::from_millis(2)) {
                        Ok(()) | Err(Error::Timeout { .. }) => {}
                        Err(e) => return Some(e),
                    }
                }
                None
            })
        };
        shuttle::thread::yield_now();
        conn.close().unwrap();
        // After close, nothing is left to wait for: every caller ends, told it is closed.
        let (got, end) = reader.join().unwrap();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order: {got:?}");
        assert!(
            matches!(end, Error::Closed),
            "recv after close said {end:?}"
        );
        if let Some(sent) = sender.join().unwrap() {
            assert!(
                matches!(sent, Error::Closed | Error::Io(_) | Error::SendBroken),
                "send during close said {sent:?}"
            );
        }
        assert!(
            matches!(
                conn.send(b"x", Duration::from_millis(2)),
                Err(Error::Closed)
            ),
            "a send after close is told it is closed"
        );
        drop(peer.join().unwrap());
    }
}

/// Teardown with nobody receiving: the receiver reads the peer's frames into its queue (one
/// deep), so it waits to hand the next one over when `close` comes, which must wake it.
fn teardown_idle() -> impl Fn() + Send + Sync + 'static {
    || {
        reset_clock();
        let (ours, theirs) = pair();
        let opts = ConnectionOptions {
            queue_depth: 1,
            ..ConnectionOptions::default()
        };
        let conn = Connection::over_model(ours, opts).unwrap();
        let peer = peer_sends_then_ends(theirs, PeerEnd::Open);
        shuttle::thread::yield_now();
        conn.close().unwrap();
        assert!(matches!(
            conn.recv(Duration::from_millis(2)),
            Ok(_) | Err(Error::Closed)
        ));
        drop(peer.join().unwrap());
    }
}

/// The listener's waiter table as the listener runs it (`waits.rs`), with plain values for
/// sockets and connections (an arrival's value is its generation). Thread W waits for
/// sequence 7 twice in a row (generations 0 and 1, short deadlines); their initiators A0 and
/// A1 arrive whenever the scheduler says, a late one after its wait timed out included; X and
/// Y wait for sequence 9 at once (a duplicate wait) with one initiator; and the listener shuts
/// down at some point with waits pending.
fn waiter_table() -> impl Fn() + Send + Sync + 'static {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use wringer_transport::model::{wait_for, Outcome, Placement, Table, Waits};

    struct Held(shuttle::sync::Mutex<Waits<u64, u64>>);
    impl Table<u64, u64> for Held {
        fn with<R>(&self, f: impl FnOnce(&mut Waits<u64, u64>) -> R) -> R {
            f(&mut self.0.lock().unwrap())
        }
    }
    || {
        reset_clock();
        let table = Arc::new(Held(shuttle::sync::Mutex::new(Waits::default())));
        // Arrivals handed to a waiter, and results a waiter got from one: never unequal.
        let delivered = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(AtomicUsize::new(0));
        let wait = |table: &Held, sequence: u64, received: &AtomicUsize| {
            let (r, outcome) = wait_for(table, sequence, Duration::from_millis(2), 8, Ok);
            if r.is_ok() && outcome == Outcome::Other {
                received.fetch_add(1, SeqCst);
            }
            r
        };
        let arrive =
            |table: Arc<Held>, sequence: u64, generation: u64, delivered: Arc<AtomicUsize>| {
                shuttle::thread::spawn(move || {
                    let placed =
                        table.with(|w| w.place(sequence, generation, generation, 8, |_| true));
                    if let Placement::Deliver(waiter, socket) = placed {
                        delivered.fetch_add(1, SeqCst);
                        waiter.deliver(Ok(socket));
                    }
                })
            };
        let w = {
            let (table, received) = (Arc::clone(&table), Arc::clone(&received));
            shuttle::thread::spawn(move || {
                let first = wait(&table, 7, &received);
                let second = wait(&table, 7, &received);
                (first, second)
            })
        };
        let duplicates: Vec<_> = (0..2)
            .map(|_| {
                let (table, received) = (Arc::clone(&table), Arc::clone(&received));
                shuttle::thread::spawn(move || wait(&table, 9, &received))
            })
            .collect();
        let arrivals = [
            arrive(Arc::clone(&table), 7, 0, Arc::clone(&delivered)),
            arrive(Arc::clone(&table), 7, 1, Arc::clone(&delivered)),
            arrive(Arc::clone(&table), 9, 0, Arc::clone(&delivered)),
        ];
        shuttle::thread::yield_now();
        table.with(|w| w.close());
        // Every wait returns, once, with its own generation's arrival or an error.
        let (first, second) = w.join().unwrap();
        assert!(
            matches!(
                first,
                Ok(0) | Err(Error::Timeout { .. } | Error::ListenerClosed)
            ),
            "the first wait for 7 (generation 0) returned {first:?}"
        );
        assert!(
            matches!(
                second,
                Ok(1) | Err(Error::Timeout { .. } | Error::ListenerClosed)
            ),
            "the second wait for 7 (generation 1) returned {second:?}"
        );
        let got: Vec<_> = duplicates.into_iter().map(|d| d.join().unwrap()).collect();
        assert!(
            got.iter().filter(|r| r.is_ok()).count() <= 1
                && got.iter().all(|r| matches!(r, Ok(0) | Err(_))),
            "two waits for 9 with one initiator got {got:?}"
        );
        for a in arrivals {
            a.join().unwrap();
        }
        assert_eq!(
            delivered.load(SeqCst),
            received.load(SeqCst),
            "a connection was handed to a wait that had already given up: lost"
        );
    }
}

/// Run `model` over PCT schedules, then random ones; the failing schedule's file when one
/// fails. PCT makes few preemptions at well-chosen points, random ones many anywhere: each
/// finds windows the other rarely does.
fn explore(name: &str, model: Model) -> Result<usize, PathBuf> {
    let dir = schedules_dir();
    let model: std::sync::Arc<dyn Fn() + Send + Sync> = std::sync::Arc::from(model);
    let mut total = 0;
    for scheduler in ["PCT (depth 3)", "random"] {
        let mut config = Config::new();
        config.failure_persistence = FailurePersistence::File(Some(dir.clone()));
        config.max_steps = MaxSteps::FailAfter(MAX_STEPS);
        let m = std::sync::Arc::clone(&model);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if scheduler == "random" {
                Runner::new(RandomScheduler::new_from_seed(seed(), schedules()), config)
                    .run(move || m())
            } else {
                Runner::new(
                    PctScheduler::new_from_seed(seed(), DEPTH, schedules()),
                    config,
                )
                .run(move || m())
            }
        }));
        let Ok(n) = outcome else {
            let schedule = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
                .expect("a failing schedule is written to a file");
            println!(
                "model {name}: a {scheduler} schedule failed; it is in {}",
                schedule.display()
            );
            return Err(schedule);
        };
        let queued = QUEUED.swap(0, std::sync::atomic::Ordering::Relaxed);
        let handed = HANDED_OVER.swap(0, std::sync::atomic::Ordering::Relaxed);
        let paths = if name.starts_with("teardown") || name.starts_with("waiter") {
            String::new()
        } else {
            format!(
                "; the receiver queued frames in {queued}, the read side changed hands in {handed}"
            )
        };
        println!(
            "model {name}: {n} {scheduler} schedules explored (seed {}), none failed{paths}",
            seed()
        );
        total += n;
    }
    Ok(total)
}

/// Where failing schedules are written: one folder for the whole process, since shuttle's
/// panic hook keeps the folder of the first run it served.
fn schedules_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("wringer-model-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    })
    .clone()
}

fn holds(name: &str, model: Model) {
    assert!(set_model_bug(None));
    let n = explore(name, model).unwrap_or_else(|s| {
        panic!(
            "model {name} failed on main; replay: WRINGER_MODEL_REPLAY={}",
            s.display()
        )
    });
    assert_eq!(n, 2 * schedules());
}

#[test]
fn one_caller_and_the_receiver_share_the_stream() {
    holds("read-path-1", Box::new(read_path(1, PeerEnd::Fin)));
}

#[test]
fn two_callers_and_the_receiver_share_the_stream() {
    holds("read-path-2", Box::new(read_path(2, PeerEnd::Fin)));
}

#[test]
fn a_reset_read_once_is_the_end_everyone_is_told() {
    holds("reset-1", Box::new(read_path(1, PeerEnd::Reset)));
    holds("reset-2", Box::new(read_path(2, PeerEnd::Reset)));
}

#[test]
fn close_against_callers_in_recv_and_send() {
    holds("teardown", Box::new(teardown(false)));
    holds("teardown-quiet", Box::new(teardown(true)));
}

#[test]
fn the_listener_s_waiter_table() {
    holds("waiter-table", Box::new(waiter_table()));
}

#[test]
fn a_late_timer_is_caught() {
    caught("late-timer");
}

#[test]
fn close_wakes_a_receiver_waiting_to_queue() {
    holds("teardown-idle", Box::new(teardown_idle()));
}

type Model = Box<dyn Fn() + Send + Sync>;
type MakeModel = fn() -> Model;

/// Every model by name, made afresh.
const MODELS: [(&str, MakeModel); 8] = [
    ("read-path-1", || Box::new(read_path(1, PeerEnd::Fin))),
    ("read-path-2", || Box::new(read_path(2, PeerEnd::Fin))),
    ("reset-1", || Box::new(read_path(1, PeerEnd::Reset))),
    ("reset-2", || Box::new(read_path(2, PeerEnd::Reset))),
    ("teardown", || Box::new(teardown(false))),
    ("teardown-quiet", || Box::new(teardown(true))),
    ("teardown-idle", || Box::new(teardown_idle())),
    ("waiter-table", || Box::new(waiter_table())),
];

/// With `bug` switched on, some model fails, and replaying the schedule it printed fails again.
fn caught(bug: &str) {
    assert!(set_model_bug(Some(bug)), "no bug named {bug}");
    for (name, make) in MODELS {
        let Err(schedule) = explore(name, make()) else {
            continue;
        };
        let model = make();
        let again = catch_unwind(AssertUnwindSafe(|| {
            shuttle::replay_from_file(model, &schedule)
        }));
        assert!(
            again.is_err(),
            "{bug}: the schedule in {} did not fail again on replay",
            schedule.display()
        );
        println!("{bug}: caught by model {name}; its schedule fails again on replay");
        assert!(set_model_bug(None));
        return;
    }
    assert!(set_model_bug(None));
    panic!("{bug}: no model failed");
}

#[test]
fn queue_before_read_side_is_caught() {
    caught("queue-before-read-side");
}

#[test]
fn queue_before_try_read_side_is_caught() {
    caught("queue-before-try-read-side");
}

#[test]
fn queue_after_read_side_is_caught() {
    caught("queue-after-read-side");
}

#[test]
fn end_published_after_read_side_is_caught() {
    caught("end-published-after-read-side");
}

#[test]
fn timeout_drops_partial_frame_is_caught() {
    caught("timeout-drops-partial-frame");
}

#[test]
fn close_skips_shutdown_while_receiving_is_caught() {
    caught("close-skips-shutdown-while-receiving");
}

#[test]
fn caller_end_unpublished_is_caught() {
    caught("caller-end-unpublished");
}

#[test]
fn close_before_join_is_caught() {
    caught("close-before-join");
}

#[test]
fn close_while_in_use_is_caught() {
    caught("close-while-in-use");
}

#[test]
fn use_after_close_is_caught() {
    caught("use-after-close");
}

/// `WRINGER_MODEL_REPLAY=FILE [WRINGER_MODEL_BUG=name] WRINGER_MODEL=NAME` (one of
/// [`MODELS`]): replay one schedule (what a failure printed), under the bug it was found with.
#[test]
fn replay_a_schedule() {
    let Ok(file) = std::env::var("WRINGER_MODEL_REPLAY") else {
        return;
    };
    let bug = std::env::var("WRINGER_MODEL_BUG").ok();
    assert!(set_model_bug(bug.as_deref()));
    let which = std::env::var("WRINGER_MODEL").unwrap_or_else(|_| "read-path-1".into());
    let (_, make) = MODELS
        .iter()
        .find(|(n, _)| *n == which)
        .unwrap_or_else(|| panic!("no model named {which}"));
    let model = make();
    shuttle::replay_from_file(model, file);
}
