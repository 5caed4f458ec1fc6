//! The coordinator's decisions, without IO (in the manner of quinn-proto): inputs go in with a
//! timestamp, actions come out. Rendezvous admission, starting the steps, barrier release,
//! fault points, step and scenario deadlines, ranks that die, and when the attempt is over
//! are all decided here; the shell around it only moves bytes, signals and processes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::model::scenario::{Fault, FaultAction};
use crate::rank::context::point_release;
use crate::rank::protocol::{PeerAddrs, RankMsg, StepReport};

/// What the core needs to know about the attempt, fixed before it starts.
pub struct Config {
    pub ranks: u32,
    /// Each step's name and deadline, in order.
    pub steps: Vec<(&'static str, Duration)>,
    pub faults: Vec<Fault>,
    /// The whole attempt's deadline.
    pub deadline: Duration,
    /// How long the ranks get to join the rendezvous (capped by `deadline`).
    pub join_timeout: Duration,
    /// For local ranks, the PID each must have; `None` where ranks are remote and report
    /// their own host's PID.
    pub pids: Option<Vec<u32>>,
    /// The host index each rank runs on (host-level faults strike every rank there).
    pub host_of: Vec<usize>,
}

/// What happens to the core.
#[derive(Debug)]
pub enum Input {
    /// A process presented this run's token and claims `rank`.
    Joined { rank: u32, pid: u32 },
    /// A message on an admitted rank's line.
    Msg { rank: u32, msg: RankMsg },
    /// An admitted rank's line closed; every message it sent came before.
    LineClosed { rank: u32 },
    /// The rank's process ended; `clean` when it exited with status 0.
    Exited {
        rank: u32,
        status: String,
        clean: bool,
    },
    /// The shell applied (or failed to apply) a fault the core asked for.
    FaultApplied {
        fault: usize,
        result: Result<(), String>,
    },
    /// SIGINT or SIGTERM reached the coordinator.
    Interrupted,
    /// Nothing happened; time passed.
    Tick,
}

/// What the shell must do, in order.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Keep this rank's line; `remote_pid` is its PID on its host, when remote.
    Admit { rank: u32, remote_pid: Option<u32> },
    /// Close the line of a process that is not the rank it claims to be.
    Refuse { rank: u32, pid: u32 },
    /// Send every rank the start message with these addresses.
    Start { peers: Vec<PeerAddrs> },
    /// Send `name` as a release to `rank`.
    Release { rank: u32, name: String },
    /// Apply fault number `fault` (`action` to `rank`) now, then report with
    /// [`Input::FaultApplied`].
    Strike {
        fault: usize,
        rank: u32,
        action: FaultAction,
    },
    /// A deadline passed: capture the stacks of these ranks, then end the attempt.
    Hang { summary: String, alive: Vec<u32> },
    /// The attempt is over.
    Finish,
}

/// What one attempt produced, as the core saw it.
#[derive(Debug, Default)]
pub struct Outcome {
    pub reports: Vec<(u32, StepReport)>,
    pub step_errors: Vec<(u32, usize, String)>,
    /// Ranks that ended, or processes that joined, in ways the scenario did not plan for.
    pub unexpected: Vec<String>,
    pub hang: Option<String>,
    pub faults_struck: Vec<String>,
    pub faults_missed: Vec<String>,
    /// Ranks a fault struck (directly or through their host): their own errors are excused.
    pub faulted_ranks: Vec<u32>,
    pub interrupted: bool,
    /// From the attempt's start to the start message.
    pub rendezvous: Option<Duration>,
    /// Processes of the run found alive after it ended.
    pub leftovers: Vec<String>,
}

#[derive(Default)]
struct Rank {
    admitted: bool,
    addrs: Option<PeerAddrs>,
    step: Option<(usize, Instant)>,
    done: bool,
    by_design: bool,
    faulted: Option<FaultAction>,
    exit: Option<(String, bool)>,
    line_closed: bool,
    judged: bool,
}

pub struct Core {
    cfg: Config,
    started_at: Instant,
    ranks: Vec<Rank>,
    /// Barrier name -> (parties, ranks arrived).
    barriers: BTreeMap<String, (u32, BTreeSet<u32>)>,
    /// Barrier name -> its members, for barriers that named them.
    members: BTreeMap<String, BTreeSet<u32>>,
    struck: BTreeSet<usize>,
    /// How many times each rank reported each point: a fault is recorded against the count
    /// (the Nth `mid-stream` of rank 1), which replays whatever the timing.
    reported: BTreeMap<(u32, String), u32>,
    /// Fault index -> (ranks hit, where it struck).
    pending: BTreeMap<usize, (Vec<u32>, String)>,
    started_steps: bool,
    over: bool,
    out: Outcome,
}

impl Core {
    pub fn new(cfg: Config, now: Instant) -> Core {
        let n = cfg.ranks as usize;
        Core {
            cfg,
            started_at: now,
            ranks: (0..n).map(|_| Rank::default()).collect(),
            barriers: BTreeMap::new(),
            members: BTreeMap::new(),
            struck: BTreeSet::new(),
            reported: BTreeMap::new(),
            pending: BTreeMap::new(),
            started_steps: false,
            over: false,
            out: Outcome::default(),
        }
    }

    pub fn is_over(&self) -> bool {
        self.over
    }

    /// Feed one input; returns what to do, in order. After [`Action::Finish`] or
    /// [`Action::Hang`] the core ignores further inputs.
    pub fn handle(&mut self, now: Instant, input: Input) -> Vec<Action> {
        if self.over {
            return vec![];
        }
        let mut acts = vec![];
        match input {
            Input::Joined { rank, pid } => self.joined(rank, pid, &mut acts),
            Input::Msg { rank, msg } => self.message(now, rank, msg, &mut acts),
            Input::LineClosed { rank } => {
                if let Some(r) = self.ranks.get_mut(rank as usize) {
                    r.line_closed = true;
                }
            }
            Input::Exited {
                rank,
                status,
                clean,
            } => {
                if let Some(r) = self.ranks.get_mut(rank as usize) {
                    if r.exit.is_none() {
                        r.exit = Some((status, clean));
                        // A rank that never joined has no line to wait for.
                        if !r.admitted {
                            r.line_closed = true;
                        }
                    }
                }
            }
            Input::FaultApplied { fault, result } => {
                self.fault_applied(now, fault, result);
                // Members it stopped are no longer waited for.
                self.release_complete(&mut acts);
            }
            Input::Interrupted => {
                self.out.interrupted = true;
                self.over = true;
                return vec![Action::Finish];
            }
            Input::Tick => {}
        }
        self.maybe_start(now, &mut acts);
        self.judge_exits(&mut acts);
        if !self.over {
            self.check_finished(&mut acts);
        }
        if !self.over {
            self.watchdog(now, &mut acts);
        }
        acts
    }

    /// Record what the shell found alive after the attempt.
    pub fn leftovers(&mut self, found: Vec<String>) {
        self.out.leftovers.extend(found);
    }

    pub fn into_outcome(self) -> Outcome {
        self.out
    }

    fn joined(&mut self, rank: u32, pid: u32, acts: &mut Vec<Action>) {
        let n = self.cfg.ranks;
        let why = if rank >= n {
            Some(format!("rank {rank} is out of range (0..{n})"))
        } else if self.ranks[rank as usize].admitted {
            Some(format!("rank {rank} has already joined"))
        } else if let Some(expected) = self.cfg.pids.as_ref().map(|p| p[rank as usize]) {
            (expected != pid).then(|| format!("rank {rank} was started as pid {expected}"))
        } else {
            None
        };
        match why {
            Some(why) => {
                self.out.unexpected.push(format!(
                    "a process claiming rank {rank} (pid {pid}) joined; not one of ours: {why}"
                ));
                acts.push(Action::Refuse { rank, pid });
            }
            None => {
                self.ranks[rank as usize].admitted = true;
                let remote_pid = self.cfg.pids.is_none().then_some(pid);
                acts.push(Action::Admit { rank, remote_pid });
            }
        }
    }

    fn message(&mut self, now: Instant, rank: u32, msg: RankMsg, acts: &mut Vec<Action>) {
        let Some(r) = self.ranks.get_mut(rank as usize).filter(|r| r.admitted) else {
            return;
        };
        match msg {
            RankMsg::Hello { .. } => {}
            RankMsg::Ready { addrs } => r.addrs = Some(addrs),
            RankMsg::StepStart { step } => r.step = Some((step, now)),
            RankMsg::Point { step, name } => self.point(now, rank, step, &name, acts),
            RankMsg::Barrier {
                name,
                parties,
                members,
            } => {
                let (want, arrived) = self
                    .barriers
                    .entry(name.clone())
                    .or_insert_with(|| (parties, BTreeSet::new()));
                *want = (*want).max(parties);
                arrived.insert(rank);
                if !members.is_empty() {
                    self.members
                        .entry(name.clone())
                        .or_default()
                        .extend(members);
                }
                self.release_complete(acts);
            }
            RankMsg::StepResult(report) => {
                r.step = None;
                self.out.reports.push((rank, report));
            }
            RankMsg::StepError { step, error } => {
                r.step = None;
                self.out.step_errors.push((rank, step, error));
            }
            RankMsg::ExitingByDesign { .. } => {
                r.by_design = true;
                r.step = None;
            }
            RankMsg::Done => {
                r.done = true;
                r.step = None;
            }
        }
    }

    /// A rank reached a named point: strike every fault set there (once each), then let the
    /// rank go on.
    fn point(&mut self, now: Instant, rank: u32, step: usize, name: &str, acts: &mut Vec<Action>) {
        let nth = {
            let n = self.reported.entry((rank, name.to_string())).or_default();
            *n += 1;
            *n
        };
        for (i, f) in self.cfg.faults.iter().enumerate() {
            if f.rank == rank && f.at == name && self.struck.insert(i) {
                let hit: Vec<u32> = if f.action.is_host_level() {
                    let host = self.cfg.host_of[rank as usize];
                    (0..self.cfg.ranks)
                        .filter(|x| self.cfg.host_of[*x as usize] == host)
                        .collect()
                } else {
                    vec![rank]
                };
                let at = now.saturating_duration_since(self.started_at);
                let place = format!(
                    "at `{name}` (occurrence {nth} on rank {rank}, step {step}) {:.0} ms into the run",
                    at.as_secs_f64() * 1e3
                );
                self.pending.insert(i, (hit, place));
                acts.push(Action::Strike {
                    fault: i,
                    rank,
                    action: f.action,
                });
            }
        }
        acts.push(Action::Release {
            rank,
            name: point_release(name),
        });
    }

    fn fault_applied(&mut self, _now: Instant, fault: usize, result: Result<(), String>) {
        let (Some(f), Some((hit, place))) = (
            self.cfg.faults.get(fault).cloned(),
            self.pending.remove(&fault),
        ) else {
            return;
        };
        match result {
            Ok(()) => {
                for x in &hit {
                    let r = &mut self.ranks[*x as usize];
                    if f.action.excuses_the_rank() {
                        r.faulted = Some(f.action);
                        self.out.faulted_ranks.push(*x);
                    }
                    if f.action.stops_the_rank() {
                        r.step = None;
                    }
                }
                self.out.faults_struck.push(format!(
                    "{:?} to rank {} {place} (ranks hit: {hit:?})",
                    f.action, f.rank
                ));
            }
            Err(e) => self.out.unexpected.push(format!(
                "fault {:?} at `{}` could not be applied: {e}",
                f.action, f.at
            )),
        }
    }

    fn maybe_start(&mut self, now: Instant, acts: &mut Vec<Action>) {
        if self.started_steps || !self.ranks.iter().all(|r| r.admitted && r.addrs.is_some()) {
            return;
        }
        let peers = self.ranks.iter().filter_map(|r| r.addrs.clone()).collect();
        self.started_steps = true;
        self.out.rendezvous = Some(now.saturating_duration_since(self.started_at));
        acts.push(Action::Start { peers });
    }

    /// Exits are judged once the rank's line has closed too, so its last messages are in.
    fn judge_exits(&mut self, acts: &mut Vec<Action>) {
        for i in 0..self.ranks.len() {
            let r = &mut self.ranks[i];
            let Some((status, clean)) = r.exit.clone() else {
                continue;
            };
            if !r.line_closed || r.judged {
                continue;
            }
            r.judged = true;
            let planned = r.faulted.is_some() || r.by_design || (r.done && clean);
            if planned {
                // Even a planned exit strands whoever waits for it in a barrier.
                self.orphaned_barriers(i as u32, acts);
                continue;
            }
            let during = match r.step {
                Some((s, _)) => format!("during step {s} ({})", self.step_name(s)),
                None => "outside any step".to_string(),
            };
            self.out
                .unexpected
                .push(format!("rank {i} ended ({status}) {during}"));
            self.orphaned_barriers(i as u32, acts);
        }
    }

    /// Release every barrier whose parties have all arrived; for a barrier that named its
    /// members, a member a fault stopped counts as arrived.
    fn release_complete(&mut self, acts: &mut Vec<Action>) {
        let stopped: BTreeSet<u32> = (0..self.cfg.ranks)
            .filter(|x| {
                self.ranks[*x as usize]
                    .faulted
                    .is_some_and(|f| f.stops_the_rank())
            })
            .collect();
        let done: Vec<String> = self
            .barriers
            .iter()
            .filter(|(name, (want, arrived))| match self.members.get(*name) {
                Some(m) => m.iter().all(|x| arrived.contains(x) || stopped.contains(x)),
                None => arrived.len() >= *want as usize,
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in done {
            if let Some((_, arrived)) = self.barriers.remove(&name) {
                self.members.remove(&name);
                for p in arrived {
                    acts.push(Action::Release {
                        rank: p,
                        name: name.clone(),
                    });
                }
            }
        }
    }

    /// A rank ended while others wait in a barrier it never reached: that barrier can never be
    /// released, so end now rather than at the deadline.
    fn orphaned_barriers(&mut self, dead: u32, acts: &mut Vec<Action>) {
        let alive = |x: u32| self.ranks[x as usize].exit.is_none();
        let stuck: Vec<String> = self
            .barriers
            .iter()
            // A barrier that named its members is released without a member a fault stopped.
            .filter(|(name, _)| {
                !(self.members.contains_key(*name)
                    && self.ranks[dead as usize]
                        .faulted
                        .is_some_and(|f| f.stops_the_rank()))
            })
            .filter(|(_, (parties, arrived))| {
                let could_come = (0..self.cfg.ranks)
                    .filter(|x| !arrived.contains(x) && alive(*x))
                    .count();
                !arrived.contains(&dead) && arrived.len() + could_come < *parties as usize
            })
            .map(|(name, (_, arrived))| {
                format!("barrier `{name}` can never be released: rank {dead} ended while ranks {arrived:?} waited in it")
            })
            .collect();
        if !stuck.is_empty() {
            self.out.unexpected.extend(stuck);
            self.end(acts);
        }
    }

    fn check_finished(&mut self, acts: &mut Vec<Action>) {
        // Every rank judged, or stopped by a fault (a frozen or killed host's rank never
        // reports its own end).
        if self
            .ranks
            .iter()
            .all(|r| r.judged || r.faulted.is_some_and(|f| f.stops_the_rank()))
        {
            self.end(acts);
        }
    }

    fn end(&mut self, acts: &mut Vec<Action>) {
        for (i, f) in self.cfg.faults.iter().enumerate() {
            if !self.struck.contains(&i) {
                self.out.faults_missed.push(format!(
                    "{:?} for rank {} at `{}` never struck: the rank never reached that point",
                    f.action, f.rank, f.at
                ));
            }
        }
        self.over = true;
        acts.push(Action::Finish);
    }

    /// Every step and the attempt have deadlines; the first one passed ends the attempt.
    fn watchdog(&mut self, now: Instant, acts: &mut Vec<Action>) {
        let since = now.saturating_duration_since(self.started_at);
        let join_limit = self.cfg.join_timeout.min(self.cfg.deadline);
        let summary = if !self.started_steps && since > join_limit {
            let missing: Vec<String> = (0..self.ranks.len())
                .filter(|i| !self.ranks[*i].admitted || self.ranks[*i].addrs.is_none())
                .map(|i| i.to_string())
                .collect();
            Some(format!(
                "ranks {} never joined the rendezvous within {join_limit:?}",
                missing.join(", ")
            ))
        } else if let Some((rank, step, limit)) = self.hung_step(now) {
            Some(format!(
                "rank {rank} hung in step {step} ({}) past its {limit:?} deadline",
                self.step_name(step)
            ))
        } else if since > self.cfg.deadline {
            let running: Vec<String> = self
                .ranks
                .iter()
                .enumerate()
                .filter(|(_, r)| r.exit.is_none() && r.faulted.is_none())
                .map(|(i, r)| match r.step {
                    Some((s, _)) => format!("rank {i} in step {s} ({})", self.step_name(s)),
                    None => format!("rank {i} between steps"),
                })
                .collect();
            Some(format!(
                "scenario deadline of {:?} passed with {} still running",
                self.cfg.deadline,
                running.join(", ")
            ))
        } else {
            None
        };
        if let Some(summary) = summary {
            let alive = (0..self.cfg.ranks)
                .filter(|r| self.ranks[*r as usize].exit.is_none())
                .collect();
            self.out.hang = Some(summary.clone());
            self.over = true;
            acts.push(Action::Hang { summary, alive });
        }
    }

    fn hung_step(&self, now: Instant) -> Option<(usize, usize, Duration)> {
        self.ranks.iter().enumerate().find_map(|(i, r)| {
            let (s, since) = r.step?;
            let limit = self.cfg.steps.get(s)?.1;
            (r.exit.is_none() && now.saturating_duration_since(since) > limit)
                .then_some((i, s, limit))
        })
    }

    fn step_name(&self, step: usize) -> &'static str {
        self.cfg.steps.get(step).map(|s| s.0).unwrap_or("?")
    }
}

#[cfg(test)]
mod tests;
