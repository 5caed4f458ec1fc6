//! One attempt (one repeat) of a scenario: the IO shell around the coordinator's [`core`].
//! It starts the ranks, runs the rendezvous listener, turns messages, child exits and the
//! clock into the core's inputs, and carries out its actions (start, releases, faults, stack
//! capture). Verdicts are not decided here but in `verdict`.

pub mod core;
mod rendezvous;

pub use self::rendezvous::random_token;
use self::rendezvous::{spawn_acceptor, Event, OpenConns};

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use nix::sys::signal::Signal;

use self::core::{Action, Config, Core, Input, Outcome};
use crate::hosts::placement::Placement;
use crate::model::failure::Failure;
use crate::model::faults::{RankPlane, Site};
use crate::model::scenario::{AuditBackend, AuditCheck, Fault, FaultAction, Named, Perturb};
use crate::model::suppression::Suppression;
use crate::orchestration::launcher::Tracing;
use crate::orchestration::launcher::{RankGroup, StepLimits};
use crate::orchestration::observer;
use crate::rank::protocol::{write_line, CoordMsg, StepReport};
use crate::rank::steps::{Step, StruckFault};
use std::collections::BTreeMap;

/// How long ranks get to start and join the rendezvous.
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long traced ranks get to start and join the rendezvous.
const TRACED_JOIN_TIMEOUT: Duration = Duration::from_secs(120);
/// When the watchdog fires: how many hung ranks get user-space stacks (gdb), and how long gdb
/// may take; the others get kernel stacks, which cost nothing.
const GDB_RANKS: usize = 2;
const GDB_BUDGET: Duration = Duration::from_secs(4);
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
    /// Lifecycle audit violations, each with its trace lines.
    pub audit: Vec<Failure>,
    /// Findings a suppression silenced: how many, by each entry's label.
    pub audit_suppressed: BTreeMap<String, u32>,
    /// Expectations judged on every rank's evidence together (see `StepKind::reconcile`).
    pub reconciled_failures: Vec<Failure>,
    /// The scenario's faults as they struck, on the wall clock, for `reconcile`.
    pub struck: Vec<StruckFault>,
    /// What the perturbation observer delayed, per rank and process (local ranks).
    pub perturbed: Vec<String>,
    /// Stacks captured when the watchdog fired, until the hang is recorded.
    stacks: Vec<(u32, u32, String)>,
}

#[derive(Debug)]
pub struct Hang {
    pub summary: String,
    pub stacks: Vec<(u32, u32, String)>,
}

impl Attempt {
    /// Take in what the core decided.
    fn absorb(&mut self, o: Outcome) {
        self.reports = o.reports;
        self.step_errors = o.step_errors;
        self.unexpected_exits = o.unexpected;
        if let Some(summary) = o.hang {
            self.hang = Some(Hang {
                summary,
                stacks: std::mem::take(&mut self.stacks),
            });
        }
        self.faults_struck = o.faults_struck;
        self.faults_missed = o.faults_missed;
        self.faulted_ranks = o.faulted_ranks;
        self.interrupted = o.interrupted;
        self.rendezvous = o.rendezvous;
        self.leftovers = o.leftovers;
    }
}

pub struct Plan<'a> {
    /// The scenario's name (it picks a `bug-injection` build's transport bug, when a test
    /// switched one on per scenario).
    pub scenario: &'a str,
    /// The lifecycle audit's checks and perturbations; ranks run under strace when either
    /// is non-empty.
    pub audit: &'a [AuditCheck],
    pub perturb: &'a [Perturb],
    /// What records the syscalls (strace whenever there are perturbations).
    pub backend: AuditBackend,
    pub ranks: u32,
    pub steps: &'a [Step],
    pub faults: &'a [Fault],
    pub deadline: Duration,
    pub seed: u64,
    pub log_dir: &'a Path,
    pub interrupted: &'a AtomicBool,
    pub placement: &'a Placement,
    /// What delays the perturbed calls.
    pub perturb_by: crate::orchestration::audit::PerturbBy,
    /// Audit findings the user has read and silenced (counted, not failed).
    pub suppressions: &'a [Suppression],
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
        TcpListener::bind((plan.placement.rendezvous().bind, 0))
            .context("binding the rendezvous")?,
    );
    // Ranks are told the address their hosts reach it at.
    let addr = std::net::SocketAddr::new(
        plan.placement.rendezvous().advertise,
        listener.local_addr()?.port(),
    );
    let (events_tx, events) = crossbeam_channel::unbounded();
    let rejected = Arc::new(AtomicU64::new(0));
    let open_conns: OpenConns = Arc::default();
    let acceptor = spawn_acceptor(
        Arc::clone(&listener),
        token.clone(),
        events_tx,
        Arc::clone(&rejected),
        Arc::clone(&open_conns),
    );
    let tracing = (!plan.audit.is_empty() || !plan.perturb.is_empty()).then_some(Tracing {
        checks: plan.audit,
        perturb: plan.perturb,
        seed: plan.seed,
        backend: plan.backend,
        perturb_by: plan.perturb_by,
    });
    // The attempt's clock starts before the ranks are launched: the rendezvous time counts
    // the launcher's own work (spawning, or a Slurm step's set-up), and so do the deadlines.
    let launched = Instant::now();
    let mut group = RankGroup::start(
        plan.ranks,
        addr,
        &token,
        plan.log_dir,
        plan.placement,
        tracing.as_ref(),
        StepLimits {
            deadline: plan.deadline,
            faults: !plan.faults.is_empty(),
            transport_bug: crate::orchestration::launcher::transport_bug(plan.scenario),
        },
    )?;
    let cfg = Config {
        ranks: plan.ranks,
        steps: plan
            .steps
            .iter()
            .map(|s| (s.name(), s.deadline()))
            .collect(),
        faults: plan.faults.to_vec(),
        deadline: plan.deadline,
        // Starting under strace is slower (much slower in a TCG VM).
        join_timeout: if tracing.is_some() {
            TRACED_JOIN_TIMEOUT
        } else {
            JOIN_TIMEOUT
        },
        pids: (!group.is_remote() && !tracing.as_ref().is_some_and(Tracing::syscalls))
            .then(|| (0..plan.ranks).map(|r| group.pid(r).unwrap_or(0)).collect()),
        host_of: (0..plan.ranks).map(|r| plan.placement.host_of(r)).collect(),
    };
    let mut core = Core::new(cfg, launched);
    let result = drive(plan, &mut core, &mut group, &events, &token, attempt);
    // Everything ends here, on every path: hosts healed (so they can be reached), ranks killed
    // (stopped ones included), the hosts' process tables checked, then our threads.
    let mut outcome = core.into_outcome();
    if !outcome.faults_struck.is_empty() {
        outcome
            .faults_struck
            .extend(plan.placement.fault_evidence());
        if let Err(e) = plan.placement.heal() {
            outcome.unexpected.push(format!(
                "could not heal the {} hosts after the faults: {e:#}",
                plan.placement.kind()
            ));
        }
    }
    group.kill_all();
    outcome.leftovers.extend(group.leftovers());
    if !outcome.faults_struck.is_empty() {
        if let Err(e) = plan.placement.renew() {
            outcome.unexpected.push(format!(
                "could not renew the {} hosts after the faults: {e:#}",
                plan.placement.kind()
            ));
        }
    }
    // Every observer the plan's checks asked for, run the same way.
    let syscalls = observer::Syscalls {
        checks: plan.audit.to_vec(),
        hung: outcome.hang.is_some(),
    };
    let mut observers: Vec<&dyn observer::Observer> = vec![];
    if tracing.as_ref().is_some_and(Tracing::syscalls) {
        observers.push(&syscalls);
    }
    if tracing.as_ref().is_some_and(Tracing::verbs) {
        observers.push(&observer::Verbs);
    }
    for o in observers {
        attempt.audit.extend(observer::audit(
            o,
            &group,
            plan.ranks,
            plan.suppressions,
            &mut attempt.audit_suppressed,
        ));
    }
    if tracing
        .as_ref()
        .is_some_and(|t| t.preload_rules().is_some())
    {
        // A remote rank's processes write theirs on its host, where they stay.
        let here: Vec<u32> = (0..plan.ranks).filter(|r| group.runs_here(*r)).collect();
        for &rank in &here {
            let logs = crate::rank::perturb_observer::read_logs(&group.perturb_log_prefix(rank));
            attempt.perturbed.extend(
                logs.into_iter()
                    .map(|(pid, line)| format!("rank {rank} pid {pid}: {line}")),
            );
        }
        if attempt.perturbed.is_empty() && !here.is_empty() {
            attempt.perturbed.push(
                "no process reported a delayed call (none made a chosen call, or none exited by itself)"
                    .into(),
            );
        }
    }
    // SAFETY: shutdown on a listening socket we own wakes the acceptor blocked in accept().
    unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
    // Every connection still open (a rank's, or a stranger dribbling bytes) is cut now, so no
    // reader thread, and no peer, can hold the run open past its end.
    for s in open_conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
    {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    let _ = acceptor.join();
    attempt.absorb(outcome);
    reconcile(plan.steps, attempt);
    attempt.rejected_connections = rejected.load(Ordering::Relaxed);
    result
}

/// The IO shell: turn channel messages, child exits and the clock into the core's inputs,
/// and carry out its actions.
fn drive(
    plan: &Plan,
    core: &mut Core,
    group: &mut RankGroup,
    events: &Receiver<Event>,
    token: &str,
    attempt: &mut Attempt,
) -> Result<()> {
    let mut writers: Vec<Option<TcpStream>> = (0..plan.ranks).map(|_| None).collect();
    // Only the admitted connection speaks for a rank; an impostor's lines are ignored.
    let mut admitted: Vec<Option<u64>> = vec![None; plan.ranks as usize];
    let mut pending: Option<(u64, TcpStream)> = None;
    let speaks = |admitted: &[Option<u64>], rank: u32, conn: u64| {
        admitted.get(rank as usize).copied().flatten() == Some(conn)
    };
    while !core.is_over() {
        let mut inputs = vec![];
        if plan.interrupted.load(Ordering::Relaxed) {
            inputs.push(Input::Interrupted);
        }
        match events.recv_timeout(TICK) {
            Ok(Event::Joined {
                conn,
                rank,
                pid,
                writer,
            }) => {
                pending = Some((conn, writer));
                inputs.push(Input::Joined { rank, pid });
            }
            Ok(Event::Msg { conn, rank, msg }) if speaks(&admitted, rank, conn) => {
                inputs.push(Input::Msg { rank, msg })
            }
            Ok(Event::Gone { conn, rank }) if speaks(&admitted, rank, conn) => {
                inputs.push(Input::LineClosed { rank })
            }
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => anyhow::bail!("the rendezvous stopped"),
        }
        for rank in 0..plan.ranks {
            if let Some(status) = group.try_wait(rank as usize) {
                inputs.push(Input::Exited {
                    rank,
                    status: status.to_string(),
                    clean: status.success(),
                });
            }
        }
        inputs.push(Input::Tick);
        for input in inputs {
            let mut queue: std::collections::VecDeque<Action> =
                core.handle(Instant::now(), input).into();
            while let Some(action) = queue.pop_front() {
                match action {
                    Action::Admit { rank, remote_pid } => {
                        if let Some(pid) = remote_pid {
                            group.set_remote_pid(rank, pid);
                        }
                        if let Some((conn, w)) = pending.take() {
                            admitted[rank as usize] = Some(conn);
                            writers[rank as usize] = Some(w);
                        }
                    }
                    Action::Refuse { .. } => {
                        if let Some((_, w)) = pending.take() {
                            let _ = w.shutdown(std::net::Shutdown::Both);
                        }
                    }
                    Action::Start { peers } => {
                        for w in writers.iter_mut().flatten() {
                            let start = CoordMsg::Start {
                                steps: plan.steps.to_vec(),
                                peers: peers.clone(),
                                seed: plan.seed,
                                token: token.to_string(),
                            };
                            write_line(w, &start)?;
                        }
                    }
                    Action::Release { rank, name } => {
                        if let Some(w) = writers[rank as usize].as_mut() {
                            let _ = write_line(w, &CoordMsg::<Step>::Release { name });
                        }
                    }
                    Action::Strike {
                        fault,
                        rank,
                        action,
                    } => {
                        // The fault's time is when it starts: a host kill takes effect
                        // while `docker kill` is still running.
                        let at_us = crate::rank::steps::wall_us(Instant::now());
                        let result = apply_fault(action, rank, group, plan.placement, plan.seed)
                            .map_err(|e| format!("{e:#}"));
                        if result.is_ok() {
                            attempt.struck.push(StruckFault {
                                rank,
                                action,
                                at_us,
                            });
                        }
                        let input = Input::FaultApplied { fault, result };
                        queue.extend(core.handle(Instant::now(), input));
                    }
                    Action::Hang { summary: _, alive } => {
                        // Freeze every hung rank at once (stopped by the deadline, its stacks
                        // kept as they were), then read all the stacks in parallel within one
                        // budget; the kill follows.
                        for &r in &alive {
                            let _ = group.signal(r, Signal::SIGSTOP);
                        }
                        let group = &*group;
                        attempt.stacks = std::thread::scope(|s| {
                            let readers: Vec<_> = alive
                                .iter()
                                .enumerate()
                                .map(|(i, &r)| {
                                    // gdb is slow and takes a core: user stacks for the first
                                    // few ranks, kernel stacks for every one.
                                    let gdb = (i < GDB_RANKS).then_some(GDB_BUDGET);
                                    s.spawn(move || {
                                        group.stacks(r, gdb).map(|(pid, text)| (r, pid, text))
                                    })
                                })
                                .collect();
                            readers
                                .into_iter()
                                .filter_map(|h| h.join().ok().flatten())
                                .collect()
                        });
                    }
                    Action::Finish => {}
                }
            }
        }
    }
    Ok(())
}

pub use crate::model::failure::COORDINATOR;

/// Evidence derived from every rank's report of a step (see `StepKind::reconcile`), reported
/// as the coordinator's own.
fn reconcile(steps: &[Step], attempt: &mut Attempt) {
    for (i, step) in steps.iter().enumerate() {
        let reports: Vec<(u32, &StepReport)> = attempt
            .reports
            .iter()
            .filter(|(_, r)| r.step == i)
            .map(|(rank, r)| (*rank, r))
            .collect();
        let derived = step.kind().reconcile(&reports, &attempt.struck);
        attempt
            .reconciled_failures
            .extend(
                derived
                    .failures
                    .iter()
                    .map(|detail| Failure::ReconcileDisagreement {
                        step: i,
                        detail: detail.clone(),
                    }),
            );
        if derived.metrics.is_empty() && derived.notes.is_empty() {
            continue;
        }
        let mut r = StepReport::new(i);
        r.metrics.extend(derived.metrics);
        r.notes = derived
            .notes
            .into_iter()
            .map(|n| format!("coordinator: {n}"))
            .collect();
        attempt.reports.push((COORDINATOR, r));
    }
}

/// Strike: at the rank (a signal, its QPs), or on its host or wire (where the backend can).
fn apply_fault(
    action: FaultAction,
    rank: u32,
    group: &RankGroup,
    placement: &Placement,
    seed: u64,
) -> Result<()> {
    if action.is_host_level() {
        return placement.strike(action, placement.host_of(rank), seed);
    }
    let at = RankOf { group, rank };
    action
        .kind()
        .strike(&Site::rank(placement.kind(), &at, seed))
}

/// One rank of the group, as a fault reaches it.
struct RankOf<'a> {
    group: &'a RankGroup,
    rank: u32,
}

impl RankPlane for RankOf<'_> {
    fn signal(&self, signal: Signal) -> Result<()> {
        self.group.signal(self.rank, signal)
    }

    fn force_qp_error(&self) -> Result<()> {
        self.group.force_qp_error(self.rank)
    }
}
