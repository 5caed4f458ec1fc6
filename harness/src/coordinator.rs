//! One run of one scenario: start the ranks, run the rendezvous, apply faults, release
//! barriers, watch every step's deadline, and collect the evidence. Verdicts are not decided
//! here but in `verdict`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use nix::sys::signal::Signal;

use crate::launcher::{Placement, RankGroup};
use crate::protocol::{read_line, write_line, CoordMsg, PeerAddrs, RankMsg, StepReport};
use crate::scenario::{Fault, FaultAction, Step};

/// How long ranks get to start and join the rendezvous.
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the event loop checks deadlines and child exits when nothing arrives.
const TICK: Duration = Duration::from_millis(20);

/// What one repeat of a scenario produced.
#[derive(Debug, Default)]
pub struct Attempt {
    pub reports: Vec<(u32, StepReport)>,
    pub step_errors: Vec<(u32, usize, String)>,
    /// Ranks that ended in a way the scenario did not plan for.
    pub unexpected_exits: Vec<String>,
    pub hang: Option<Hang>,
    pub faults_struck: Vec<String>,
    pub faults_missed: Vec<String>,
    pub rejected_connections: u64,
    pub interrupted: bool,
    pub logs: Vec<PathBuf>,
    pub setup_error: Option<String>,
    /// Ranks a fault struck (directly or through their host): their own errors are excused.
    pub faulted_ranks: Vec<u32>,
    /// Processes of the run found alive on a host after it ended.
    pub leftovers: Vec<String>,
    /// From starting the ranks to sending every rank its start message.
    pub rendezvous: Option<Duration>,
}

#[derive(Debug)]
pub struct Hang {
    pub summary: String,
    pub stacks: Vec<(u32, u32, String)>,
}

enum Event {
    Joined {
        rank: u32,
        pid: u32,
        writer: TcpStream,
    },
    Msg {
        rank: u32,
        msg: RankMsg,
    },
    /// The rank's line closed: every message it sent has been delivered before this.
    Gone {
        rank: u32,
    },
}

#[derive(Default)]
struct RankState {
    writer: Option<TcpStream>,
    addrs: Option<PeerAddrs>,
    step: Option<(usize, Instant)>,
    done: bool,
    by_design: bool,
    faulted: Option<FaultAction>,
    exited: Option<String>,
    gone: bool,
    judged: bool,
}

pub struct Plan<'a> {
    pub ranks: u32,
    pub steps: &'a [Step],
    pub faults: &'a [Fault],
    pub deadline: Duration,
    pub seed: u64,
    pub log_dir: &'a Path,
    pub interrupted: &'a AtomicBool,
    pub placement: &'a Placement,
}

pub fn run(plan: &Plan) -> Attempt {
    let mut attempt = Attempt::default();
    if let Err(e) = run_inner(plan, &mut attempt) {
        attempt.setup_error = Some(format!("{e:#}"));
    }
    attempt.logs = (0..plan.ranks)
        .map(|r| plan.log_dir.join(format!("rank-{r}.log")))
        .collect();
    attempt
}

fn run_inner(plan: &Plan, attempt: &mut Attempt) -> Result<()> {
    let token = random_token()?;
    let listener = Arc::new(
        TcpListener::bind((plan.placement.rendezvous_ip(), 0)).context("binding the rendezvous")?,
    );
    let addr = listener.local_addr()?;
    let (events_tx, events) = crossbeam_channel::unbounded();
    let rejected = Arc::new(AtomicU64::new(0));
    let acceptor = spawn_acceptor(
        Arc::clone(&listener),
        token.clone(),
        events_tx,
        Arc::clone(&rejected),
    );
    let launched = Instant::now();
    let mut group = RankGroup::start(plan.ranks, addr, &token, plan.log_dir, plan.placement)?;
    let result = drive(plan, &mut group, &events, &token, launched, attempt);
    // Everything ends here, on every path: hosts healed (so they can be reached), ranks killed
    // (stopped ones included), the hosts' process tables checked, then our threads.
    if !attempt.faults_struck.is_empty() {
        if let Some(c) = plan.placement.containers() {
            if let Err(e) = c.heal() {
                attempt.unexpected_exits.push(format!(
                    "could not heal the container hosts after the faults: {e:#}"
                ));
            }
        }
    }
    group.kill_all();
    attempt.leftovers = group.remote_leftovers();
    // SAFETY: shutdown on a listening socket we own wakes the acceptor blocked in accept().
    unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
    let _ = acceptor.join();
    attempt.rejected_connections = rejected.load(Ordering::Relaxed);
    result
}

fn drive(
    plan: &Plan,
    group: &mut RankGroup,
    events: &Receiver<Event>,
    token: &str,
    launched: Instant,
    attempt: &mut Attempt,
) -> Result<()> {
    let n = plan.ranks as usize;
    let started = Instant::now();
    let scenario_deadline = started + plan.deadline;
    let mut ranks: Vec<RankState> = (0..n).map(|_| RankState::default()).collect();
    let mut barriers: HashMap<String, HashSet<u32>> = HashMap::new();
    let mut struck: HashSet<usize> = HashSet::new();
    let mut started_steps = false;

    loop {
        if plan.interrupted.load(Ordering::Relaxed) {
            attempt.interrupted = true;
            return Ok(());
        }
        match events.recv_timeout(TICK) {
            Ok(Event::Joined { rank, pid, writer }) => {
                // A local rank must be the very process we started; a remote one reports the PID
                // it has on its host.
                let ours = group.is_remote() || group.pid(rank) == Some(pid);
                if (rank as usize) < n && ours && ranks[rank as usize].writer.is_none() {
                    if group.is_remote() {
                        group.set_remote_pid(rank, pid);
                    }
                    ranks[rank as usize].writer = Some(writer);
                } else {
                    attempt.unexpected_exits.push(format!(
                        "a process claiming rank {rank} (pid {pid}) joined; not one of ours"
                    ));
                }
            }
            Ok(Event::Msg { rank, msg }) => {
                let r = rank as usize;
                match msg {
                    RankMsg::Hello { .. } => {}
                    RankMsg::Ready { addrs } => ranks[r].addrs = Some(addrs),
                    RankMsg::StepStart { step } => ranks[r].step = Some((step, Instant::now())),
                    RankMsg::Point { step, name } => {
                        for (i, f) in plan.faults.iter().enumerate() {
                            if f.rank == rank && f.at == name && struck.insert(i) {
                                let at = started.elapsed();
                                let hit: Vec<u32> = if f.action.is_host_level() {
                                    let host = plan.placement.host_of(rank);
                                    (0..n as u32)
                                        .filter(|x| plan.placement.host_of(*x) == host)
                                        .collect()
                                } else {
                                    vec![rank]
                                };
                                match apply_fault(f.action, rank, group, plan.placement) {
                                    Ok(()) => {
                                        for x in &hit {
                                            if f.action.excuses_the_rank() {
                                                ranks[*x as usize].faulted = Some(f.action);
                                                attempt.faulted_ranks.push(*x);
                                            }
                                            if f.action.stops_the_rank() {
                                                ranks[*x as usize].step = None;
                                            }
                                        }
                                        attempt.faults_struck.push(format!(
                                            "{:?} to rank {rank} at `{name}` (step {step}) {:.0} ms into the run (ranks hit: {hit:?})",
                                            f.action,
                                            at.as_secs_f64() * 1e3
                                        ));
                                    }
                                    Err(e) => attempt.unexpected_exits.push(format!(
                                        "fault {:?} at `{name}` could not be applied: {e:#}",
                                        f.action
                                    )),
                                }
                            }
                        }
                        // Let a rank that waits for its fault know it has been applied.
                        if let Some(w) = ranks[r].writer.as_mut() {
                            let _ = write_line(
                                w,
                                &CoordMsg::Release {
                                    name: crate::rank::point_release(&name),
                                },
                            );
                        }
                    }
                    RankMsg::Barrier { name, parties } => {
                        let arrived = barriers.entry(name.clone()).or_default();
                        arrived.insert(rank);
                        if arrived.len() >= parties as usize {
                            for p in arrived.iter() {
                                if let Some(w) = ranks[*p as usize].writer.as_mut() {
                                    let _ =
                                        write_line(w, &CoordMsg::Release { name: name.clone() });
                                }
                            }
                        }
                    }
                    RankMsg::StepResult(report) => {
                        ranks[r].step = None;
                        attempt.reports.push((rank, report));
                    }
                    RankMsg::StepError { step, error } => {
                        ranks[r].step = None;
                        attempt.step_errors.push((rank, step, error));
                    }
                    RankMsg::ExitingByDesign { .. } => {
                        ranks[r].by_design = true;
                        ranks[r].step = None;
                    }
                    RankMsg::Done => {
                        ranks[r].done = true;
                        ranks[r].step = None;
                    }
                }
            }
            Ok(Event::Gone { rank }) => {
                if let Some(r) = ranks.get_mut(rank as usize) {
                    r.gone = true;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => anyhow::bail!("the rendezvous stopped"),
        }

        // Start once every rank has joined and published its addresses.
        if !started_steps
            && ranks
                .iter()
                .all(|r| r.writer.is_some() && r.addrs.is_some())
        {
            let peers: Vec<PeerAddrs> = ranks
                .iter()
                .map(|r| r.addrs.clone().expect("checked"))
                .collect();
            for r in ranks.iter_mut() {
                let start = CoordMsg::Start {
                    steps: plan.steps.to_vec(),
                    peers: peers.clone(),
                    seed: plan.seed,
                    token: token.to_string(),
                };
                write_line(r.writer.as_mut().expect("checked"), &start)?;
            }
            started_steps = true;
            attempt.rendezvous = Some(launched.elapsed());
        }
        if !started_steps && started.elapsed() > JOIN_TIMEOUT.min(plan.deadline) {
            let missing: Vec<String> = ranks
                .iter()
                .enumerate()
                .filter(|(_, r)| r.addrs.is_none())
                .map(|(i, _)| i.to_string())
                .collect();
            attempt.hang = Some(Hang {
                summary: format!(
                    "ranks {} never joined the rendezvous within {:?}",
                    missing.join(", "),
                    JOIN_TIMEOUT.min(plan.deadline)
                ),
                stacks: capture(group, &ranks),
            });
            return Ok(());
        }

        // Child exits, judged once the rank's line has closed too (so its last messages are in).
        for (i, r) in ranks.iter_mut().enumerate() {
            if r.exited.is_none() {
                if let Some(status) = group.try_wait(i) {
                    r.exited = Some(status.to_string());
                    // A rank that never joined has no line to wait for.
                    if r.writer.is_none() {
                        r.gone = true;
                    }
                }
            }
            if let (Some(status), true, false) = (&r.exited, r.gone, r.judged) {
                r.judged = true;
                let planned =
                    r.faulted.is_some() || r.by_design || (r.done && status == "exit status: 0");
                if !planned {
                    let during = match r.step {
                        Some((s, _)) => format!(
                            "during step {s} ({})",
                            plan.steps.get(s).map(|x| x.name()).unwrap_or("?")
                        ),
                        None => "outside any step".to_string(),
                    };
                    attempt
                        .unexpected_exits
                        .push(format!("rank {i} ended ({status}) {during}"));
                }
            }
        }

        // Finished: every rank judged, or stopped by a fault (a frozen or killed host's rank
        // never reports its own end).
        if ranks
            .iter()
            .all(|r| r.judged || r.faulted.is_some_and(|f| f.stops_the_rank()))
        {
            break;
        }

        // The watchdog: every step and the scenario have deadlines.
        let now = Instant::now();
        let hung_step = ranks.iter().enumerate().find_map(|(i, r)| {
            let (s, since) = r.step?;
            let limit = plan.steps.get(s)?.deadline().0;
            (r.exited.is_none() && now - since > limit).then_some((i, s, limit))
        });
        if let Some((rank, step, limit)) = hung_step {
            attempt.hang = Some(Hang {
                summary: format!(
                    "rank {rank} hung in step {step} ({}) past its {limit:?} deadline",
                    plan.steps[step].name()
                ),
                stacks: capture(group, &ranks),
            });
            return Ok(());
        }
        if now > scenario_deadline {
            let running: Vec<String> = ranks
                .iter()
                .enumerate()
                .filter(|(_, r)| r.exited.is_none() && r.faulted.is_none())
                .map(|(i, r)| match r.step {
                    Some((s, _)) => format!("rank {i} in step {s} ({})", plan.steps[s].name()),
                    None => format!("rank {i} between steps"),
                })
                .collect();
            attempt.hang = Some(Hang {
                summary: format!(
                    "scenario deadline of {:?} passed with {} still running",
                    plan.deadline,
                    running.join(", ")
                ),
                stacks: capture(group, &ranks),
            });
            return Ok(());
        }
    }
    for (i, f) in plan.faults.iter().enumerate() {
        if !struck.contains(&i) {
            attempt.faults_missed.push(format!(
                "{:?} for rank {} at `{}` never struck: the rank never reached that point",
                f.action, f.rank, f.at
            ));
        }
    }
    Ok(())
}

/// Stacks of every rank still alive (the hung one among them).
fn capture(group: &RankGroup, ranks: &[RankState]) -> Vec<(u32, u32, String)> {
    (0..ranks.len() as u32)
        .filter(|&r| ranks[r as usize].exited.is_none())
        .filter_map(|r| group.stacks(r).map(|(pid, text)| (r, pid, text)))
        .collect()
}

/// Strike: a signal to the rank, or an action on its host (containers only).
fn apply_fault(
    action: FaultAction,
    rank: u32,
    group: &RankGroup,
    placement: &Placement,
) -> Result<()> {
    let host = placement.host_of(rank);
    let containers = || {
        placement
            .containers()
            .context("host-level faults need the containers host profile")
    };
    match action {
        FaultAction::Sigkill => group.signal(rank, Signal::SIGKILL),
        FaultAction::Sigstop => group.signal(rank, Signal::SIGSTOP),
        FaultAction::HostKill => containers()?.kill(host),
        FaultAction::HostFreeze => containers()?.freeze(host),
        FaultAction::LinkCut => containers()?.cut_link(host),
        FaultAction::RateLimit => containers()?.rate_limit(host, "10mbit"),
    }
}

fn spawn_acceptor(
    listener: Arc<TcpListener>,
    token: String,
    events: Sender<Event>,
    rejected: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut readers = vec![];
        while let Ok((stream, _)) = listener.accept() {
            let (token, events, rejected) = (token.clone(), events.clone(), Arc::clone(&rejected));
            readers.push(std::thread::spawn(move || {
                serve_rank(stream, &token, &events, &rejected)
            }));
        }
        for r in readers {
            let _ = r.join();
        }
    })
}

/// The first line must be a hello with this run's token; anything else is rejected and counted.
fn serve_rank(stream: TcpStream, token: &str, events: &Sender<Event>, rejected: &AtomicU64) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let (rank, pid) = match read_line::<_, RankMsg>(&mut reader) {
        Ok(Some(RankMsg::Hello {
            rank,
            token: t,
            pid,
        })) if t == token => (rank, pid),
        _ => {
            rejected.fetch_add(1, Ordering::Relaxed);
            let _ = writer.shutdown(std::net::Shutdown::Both);
            return;
        }
    };
    // Authenticated ranks live until they exit (or are killed); no read deadline from here on,
    // the watchdog owns the deadlines.
    let _ = reader.get_ref().set_read_timeout(None);
    if events.send(Event::Joined { rank, pid, writer }).is_err() {
        return;
    }
    loop {
        match read_line::<_, RankMsg>(&mut reader) {
            Ok(Some(msg)) => {
                if events.send(Event::Msg { rank, msg }).is_err() {
                    return;
                }
            }
            _ => {
                let _ = events.send(Event::Gone { rank });
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

/// Samples per key, merged across ranks.
pub fn merged_samples(attempt: &Attempt) -> BTreeMap<String, Vec<f64>> {
    let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (_, r) in &attempt.reports {
        for (k, v) in &r.samples {
            out.entry(k.clone()).or_default().extend(v);
        }
    }
    out
}
