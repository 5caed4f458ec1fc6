//! The coordinator core's decisions, driven with a fake clock: no processes, no sockets.

use std::net::{IpAddr, SocketAddr};

use super::*;

const MS: Duration = Duration::from_millis(1);
crate::declare_metrics! {
    TEST_PAIRS = "test_core_pairs", Count, Neither;
}

fn fault(rank: u32, at: &str, action: FaultAction) -> Fault {
    Fault {
        rank,
        at: at.into(),
        action,
    }
}

fn config(ranks: u32) -> Config {
    Config {
        ranks,
        steps: vec![("pingpong", 1000 * MS), ("stall", 500 * MS)],
        faults: vec![],
        deadline: 10_000 * MS,
        join_timeout: 3000 * MS,
        pids: Some((0..ranks).map(|r| 100 + r).collect()),
        host_of: vec![0; ranks as usize],
    }
}

fn addrs(rank: u32) -> PeerAddrs {
    let ip = IpAddr::from([127, 0, 0, 1]);
    PeerAddrs {
        transport: SocketAddr::new(ip, 20000 + rank as u16),
        raw: SocketAddr::new(ip, 30000 + rank as u16),
        rdma: None,
        exec_port: 0,
    }
}

/// A core and its fake clock.
struct Harness {
    core: Core,
    t0: Instant,
    now: Instant,
}

impl Harness {
    fn new(cfg: Config) -> Harness {
        let t0 = Instant::now();
        Harness {
            core: Core::new(cfg, t0),
            t0,
            now: t0,
        }
    }

    fn at(&mut self, ms: u64) -> &mut Harness {
        self.now = self.t0 + Duration::from_millis(ms);
        self
    }

    fn feed(&mut self, input: Input) -> Vec<Action> {
        self.core.handle(self.now, input)
    }

    fn msg(&mut self, rank: u32, msg: RankMsg) -> Vec<Action> {
        self.feed(Input::Msg { rank, msg })
    }

    /// Every rank joins with its own pid and publishes its addresses; returns the last actions.
    fn join_all(&mut self, ranks: u32) -> Vec<Action> {
        let mut last = vec![];
        for r in 0..ranks {
            assert_eq!(
                self.feed(Input::Joined {
                    rank: r,
                    pid: 100 + r
                }),
                vec![Action::Admit {
                    rank: r,
                    remote_pid: None
                }]
            );
            last = self.msg(r, RankMsg::Ready { addrs: addrs(r) });
        }
        last
    }

    /// A rank ends the way a finished rank does: Done, exit 0, line closed.
    fn finish(&mut self, rank: u32) -> Vec<Action> {
        self.msg(rank, RankMsg::Done);
        self.feed(Input::Exited {
            rank,
            status: "exit status: 0".into(),
            clean: true,
        });
        self.feed(Input::LineClosed { rank })
    }

    fn outcome(self) -> Outcome {
        self.core.into_outcome()
    }
}

fn is_hang(acts: &[Action]) -> Option<&str> {
    acts.iter().find_map(|a| match a {
        Action::Hang { summary, .. } => Some(summary.as_str()),
        _ => None,
    })
}

// --- rendezvous admission ---

#[test]
fn the_steps_start_once_every_rank_has_joined_and_published_its_addresses() {
    let mut h = Harness::new(config(3));
    for r in 0..3 {
        h.feed(Input::Joined {
            rank: r,
            pid: 100 + r,
        });
    }
    assert!(h.msg(0, RankMsg::Ready { addrs: addrs(0) }).is_empty());
    assert!(h.msg(1, RankMsg::Ready { addrs: addrs(1) }).is_empty());
    h.at(40);
    let acts = h.msg(2, RankMsg::Ready { addrs: addrs(2) });
    let [Action::Start { peers }] = &acts[..] else {
        panic!("expected one start, got {acts:?}")
    };
    assert_eq!(peers.len(), 3);
    assert_eq!(peers[2].transport, addrs(2).transport);
    assert_eq!(h.outcome().rendezvous, Some(40 * MS));
}

#[test]
fn a_hello_naming_a_rank_out_of_range_is_refused() {
    let mut h = Harness::new(config(2));
    let acts = h.feed(Input::Joined { rank: 2, pid: 102 });
    assert_eq!(acts, vec![Action::Refuse { rank: 2, pid: 102 }]);
    let o = h.outcome();
    assert!(
        o.unexpected[0].contains("out of range"),
        "{:?}",
        o.unexpected
    );
}

#[test]
fn a_second_hello_for_the_same_rank_is_refused_and_the_first_keeps_its_place() {
    let mut h = Harness::new(config(2));
    h.feed(Input::Joined { rank: 0, pid: 100 });
    let acts = h.feed(Input::Joined { rank: 0, pid: 100 });
    assert_eq!(acts, vec![Action::Refuse { rank: 0, pid: 100 }]);
    assert!(h.core.ranks[0].admitted);
    assert!(h.outcome().unexpected[0].contains("already joined"));
}

#[test]
fn a_local_rank_with_the_wrong_pid_is_not_one_of_ours() {
    let mut h = Harness::new(config(2));
    let acts = h.feed(Input::Joined { rank: 1, pid: 999 });
    assert_eq!(acts, vec![Action::Refuse { rank: 1, pid: 999 }]);
    assert!(h.outcome().unexpected[0].contains("started as pid 101"));
}

#[test]
fn a_remote_rank_is_admitted_with_the_pid_it_reports() {
    let mut cfg = config(2);
    cfg.pids = None;
    let mut h = Harness::new(cfg);
    let acts = h.feed(Input::Joined { rank: 1, pid: 4242 });
    assert_eq!(
        acts,
        vec![Action::Admit {
            rank: 1,
            remote_pid: Some(4242)
        }]
    );
}

#[test]
fn messages_for_a_rank_that_was_never_admitted_are_ignored() {
    let mut h = Harness::new(config(2));
    assert!(h.msg(0, RankMsg::Ready { addrs: addrs(0) }).is_empty());
    assert!(h.core.ranks[0].addrs.is_none());
    assert!(h.msg(7, RankMsg::Done).is_empty());
}

#[test]
fn ranks_that_never_join_end_the_attempt_at_the_join_timeout() {
    let mut h = Harness::new(config(3));
    h.feed(Input::Joined { rank: 0, pid: 100 });
    h.msg(0, RankMsg::Ready { addrs: addrs(0) });
    assert!(is_hang(&h.at(3000).feed(Input::Tick)).is_none());
    let acts = h.at(3001).feed(Input::Tick);
    let summary = is_hang(&acts).expect("a hang");
    assert!(summary.contains("ranks 1, 2 never joined"), "{summary}");
}

#[test]
fn the_join_timeout_is_capped_by_the_scenario_deadline() {
    let mut cfg = config(2);
    cfg.deadline = 1000 * MS;
    let mut h = Harness::new(cfg);
    let summary = is_hang(&h.at(1001).feed(Input::Tick)).map(str::to_owned);
    assert!(summary.unwrap().contains("within 1s"));
}

// --- barriers ---

#[test]
fn a_barrier_releases_every_party_once_the_last_arrives() {
    let mut h = Harness::new(config(3));
    h.join_all(3);
    let b = |parties| RankMsg::Barrier {
        name: "b".into(),
        parties,
        members: vec![],
    };
    assert!(h.msg(2, b(3)).is_empty());
    assert!(h.msg(0, b(3)).is_empty());
    let acts = h.msg(1, b(3));
    let released: Vec<u32> = acts
        .iter()
        .filter_map(|a| match a {
            Action::Release { rank, name } if name == "b" => Some(*rank),
            _ => None,
        })
        .collect();
    assert_eq!(released, vec![0, 1, 2]);
}

#[test]
fn a_barrier_can_be_used_again_after_it_released() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    let b = || RankMsg::Barrier {
        name: "again".into(),
        parties: 2,
        members: vec![],
    };
    h.msg(0, b());
    assert_eq!(h.msg(1, b()).len(), 2);
    assert!(
        h.msg(0, b()).is_empty(),
        "a fresh round waits for both again"
    );
    assert_eq!(h.msg(1, b()).len(), 2);
}

#[test]
fn a_rank_that_dies_inside_a_barrier_ends_the_attempt_at_once() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    h.msg(0, RankMsg::StepStart { step: 0 });
    h.msg(1, RankMsg::StepStart { step: 0 });
    h.msg(
        0,
        RankMsg::Barrier {
            name: "step-0-listening".into(),
            parties: 2,
            members: vec![],
        },
    );
    h.at(50).feed(Input::Exited {
        rank: 1,
        status: "signal: 11 (SIGSEGV)".into(),
        clean: false,
    });
    let acts = h.feed(Input::LineClosed { rank: 1 });
    assert_eq!(acts, vec![Action::Finish]);
    let o = h.outcome();
    assert!(o.unexpected.iter().any(|u| u.contains("rank 1 ended")));
    assert!(
        o.unexpected
            .iter()
            .any(|u| u.contains("barrier `step-0-listening` can never be released")),
        "{:?}",
        o.unexpected
    );
}

#[test]
fn a_rank_that_finishes_without_reaching_a_barrier_strands_its_peer_and_ends_the_attempt() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    h.msg(
        0,
        RankMsg::Barrier {
            name: "checked".into(),
            parties: 2,
            members: vec![],
        },
    );
    h.msg(
        1,
        RankMsg::StepError {
            step: 0,
            error: "write timed out".into(),
        },
    );
    let acts = h.finish(1);
    assert_eq!(acts, vec![Action::Finish]);
    let o = h.outcome();
    assert!(o.unexpected[0].contains("barrier `checked` can never be released: rank 1 ended"));
}

#[test]
fn a_barrier_a_living_rank_can_still_reach_is_not_orphaned() {
    let mut h = Harness::new(config(3));
    h.join_all(3);
    h.msg(
        0,
        RankMsg::Barrier {
            name: "two-of-three".into(),
            parties: 2,
            members: vec![],
        },
    );
    h.feed(Input::Exited {
        rank: 2,
        status: "exit status: 1".into(),
        clean: false,
    });
    let acts = h.feed(Input::LineClosed { rank: 2 });
    assert!(!acts.contains(&Action::Finish), "{acts:?}");
    assert_eq!(
        h.msg(
            1,
            RankMsg::Barrier {
                name: "two-of-three".into(),
                parties: 2,
                members: vec![],
            }
        )
        .len(),
        2
    );
}

// --- fault points ---

#[test]
fn a_fault_strikes_at_its_point_before_the_rank_is_released() {
    let mut cfg = config(2);
    cfg.faults = vec![fault(1, "mid-stream", FaultAction::Sigkill)];
    let mut h = Harness::new(cfg);
    h.join_all(2);
    let acts = h.at(70).msg(
        1,
        RankMsg::Point {
            step: 0,
            name: "mid-stream".into(),
        },
    );
    assert_eq!(
        acts,
        vec![
            Action::Strike {
                fault: 0,
                rank: 1,
                action: FaultAction::Sigkill
            },
            Action::Release {
                rank: 1,
                name: point_release("mid-stream")
            }
        ]
    );
    h.feed(Input::FaultApplied {
        fault: 0,
        result: Ok(()),
    });
    let o = h.outcome();
    assert_eq!(o.faulted_ranks, vec![1]);
    assert!(o.faults_struck[0]
        .contains("Sigkill to rank 1 at `mid-stream` (occurrence 1 on rank 1, step 0) 70 ms"));
}

fn released(acts: &[Action], barrier: &str) -> Vec<u32> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Release { rank, name } if name == barrier => Some(*rank),
            _ => None,
        })
        .collect()
}

fn among(members: &[u32]) -> RankMsg {
    RankMsg::Barrier {
        name: "done".into(),
        parties: members.len() as u32,
        members: members.to_vec(),
    }
}

#[test]
fn a_barrier_among_named_members_does_not_wait_for_one_a_fault_stopped() {
    let mut cfg = config(3);
    cfg.faults = vec![fault(2, "ready", FaultAction::Sigkill)];
    let mut h = Harness::new(cfg);
    h.join_all(3);
    h.msg(
        2,
        RankMsg::Point {
            step: 0,
            name: "ready".into(),
        },
    );
    assert!(h.msg(0, among(&[0, 1, 2])).is_empty());
    // Before the fault is applied, rank 2 is still awaited.
    assert!(released(&h.msg(1, among(&[0, 1, 2])), "done").is_empty());
    let acts = h.feed(Input::FaultApplied {
        fault: 0,
        result: Ok(()),
    });
    assert_eq!(released(&acts, "done"), vec![0, 1]);
    // The killed rank's exit is planned: nothing is stranded, nothing unexpected.
    h.feed(Input::Exited {
        rank: 2,
        status: "signal 9".into(),
        clean: false,
    });
    h.feed(Input::LineClosed { rank: 2 });
    let unexpected = h.outcome().unexpected;
    assert!(unexpected.is_empty(), "{unexpected:?}");
}

#[test]
fn a_member_that_dies_unplanned_still_strands_its_barrier() {
    let mut h = Harness::new(config(3));
    h.join_all(3);
    h.msg(0, among(&[0, 1, 2]));
    h.msg(1, among(&[0, 1, 2]));
    h.feed(Input::Exited {
        rank: 2,
        status: "exit 3".into(),
        clean: false,
    });
    h.feed(Input::LineClosed { rank: 2 });
    let o = h.outcome();
    assert!(
        o.unexpected
            .iter()
            .any(|u| u.contains("barrier `done` can never be released")),
        "{:?}",
        o.unexpected
    );
}

#[test]
fn a_fault_strikes_once_even_when_its_point_is_reached_again() {
    let mut cfg = config(2);
    cfg.faults = vec![fault(1, "p", FaultAction::Sigstop)];
    let mut h = Harness::new(cfg);
    h.join_all(2);
    let point = || RankMsg::Point {
        step: 0,
        name: "p".into(),
    };
    assert_eq!(h.msg(1, point()).len(), 2);
    assert_eq!(
        h.msg(1, point()).len(),
        1,
        "only the release the second time"
    );
}

#[test]
fn a_point_another_rank_reaches_does_not_trigger_the_fault() {
    let mut cfg = config(2);
    cfg.faults = vec![fault(1, "p", FaultAction::Sigkill)];
    let mut h = Harness::new(cfg);
    h.join_all(2);
    let acts = h.msg(
        0,
        RankMsg::Point {
            step: 0,
            name: "p".into(),
        },
    );
    assert_eq!(
        acts,
        vec![Action::Release {
            rank: 0,
            name: point_release("p")
        }]
    );
}

#[test]
fn a_fault_that_is_never_reached_is_reported_missed() {
    let mut cfg = config(2);
    cfg.faults = vec![fault(1, "mid-stream", FaultAction::Sigkill)];
    let mut h = Harness::new(cfg);
    h.join_all(2);
    h.finish(0);
    let acts = h.finish(1);
    assert_eq!(acts, vec![Action::Finish]);
    let o = h.outcome();
    assert!(
        o.faults_missed[0].contains("never struck"),
        "{:?}",
        o.faults_missed
    );
    assert!(o.unexpected.is_empty());
}

#[test]
fn a_fault_that_cannot_be_applied_is_evidence_and_excuses_nobody() {
    let mut cfg = config(2);
    cfg.faults = vec![fault(1, "cut", FaultAction::LinkCut)];
    let mut h = Harness::new(cfg);
    h.join_all(2);
    h.msg(
        1,
        RankMsg::Point {
            step: 0,
            name: "cut".into(),
        },
    );
    h.feed(Input::FaultApplied {
        fault: 0,
        result: Err("host-level faults need the containers host profile".into()),
    });
    let o = h.outcome();
    assert!(o.faulted_ranks.is_empty());
    assert!(o.faults_struck.is_empty());
    assert!(o.unexpected[0].contains("could not be applied"));
}

#[test]
fn a_host_level_fault_hits_every_rank_on_that_host() {
    let mut cfg = config(4);
    cfg.host_of = vec![0, 1, 0, 1];
    cfg.faults = vec![fault(1, "p", FaultAction::HostFreeze)];
    let mut h = Harness::new(cfg);
    h.join_all(4);
    h.msg(
        1,
        RankMsg::Point {
            step: 0,
            name: "p".into(),
        },
    );
    h.feed(Input::FaultApplied {
        fault: 0,
        result: Ok(()),
    });
    assert_eq!(h.outcome().faulted_ranks, vec![1, 3]);
}

#[test]
fn a_rate_limit_does_not_excuse_the_ranks_own_errors() {
    let mut cfg = config(2);
    cfg.faults = vec![fault(1, "slow", FaultAction::RateLimit)];
    let mut h = Harness::new(cfg);
    h.join_all(2);
    h.msg(
        1,
        RankMsg::Point {
            step: 0,
            name: "slow".into(),
        },
    );
    h.feed(Input::FaultApplied {
        fault: 0,
        result: Ok(()),
    });
    let o = h.outcome();
    assert!(o.faulted_ranks.is_empty());
    assert_eq!(o.faults_struck.len(), 1);
}

#[test]
fn a_killed_rank_counts_as_finished_and_its_step_deadline_no_longer_runs() {
    let mut cfg = config(2);
    cfg.faults = vec![fault(1, "p", FaultAction::Sigkill)];
    let mut h = Harness::new(cfg);
    h.join_all(2);
    h.msg(1, RankMsg::StepStart { step: 0 });
    h.msg(
        1,
        RankMsg::Point {
            step: 0,
            name: "p".into(),
        },
    );
    h.feed(Input::FaultApplied {
        fault: 0,
        result: Ok(()),
    });
    // Long past the step's deadline, the killed rank is not "hung".
    assert!(is_hang(&h.at(1500).feed(Input::Tick)).is_none());
    let acts = h.at(1600).finish(0);
    assert_eq!(acts, vec![Action::Finish]);
    assert!(h.outcome().unexpected.is_empty());
}

// --- deadlines ---

#[test]
fn a_step_past_its_deadline_is_a_hang_naming_the_rank_and_step() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    h.at(100).msg(1, RankMsg::StepStart { step: 1 });
    assert!(is_hang(&h.at(600).feed(Input::Tick)).is_none());
    let acts = h.at(601).feed(Input::Tick);
    assert!(is_hang(&acts)
        .unwrap()
        .contains("rank 1 hung in step 1 (stall) past its 500ms deadline"));
    let Some(Action::Hang { alive, .. }) = acts.last() else {
        panic!()
    };
    assert_eq!(alive, &vec![0, 1]);
}

#[test]
fn the_scenario_deadline_ends_the_attempt_naming_what_still_runs() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    h.finish(0);
    let acts = h.at(10_001).feed(Input::Tick);
    let summary = is_hang(&acts).unwrap().to_string();
    assert!(summary.contains("scenario deadline"), "{summary}");
    assert!(summary.contains("rank 1 between steps"), "{summary}");
    assert!(!summary.contains("rank 0"), "{summary}");
    let Some(Action::Hang { alive, .. }) = acts.last() else {
        panic!()
    };
    assert_eq!(alive, &vec![1], "only living ranks get their stacks taken");
}

#[test]
fn completion_and_the_deadline_at_the_same_instant_is_a_completion() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    h.finish(0);
    h.at(10_000);
    let acts = h.finish(1);
    assert_eq!(acts, vec![Action::Finish]);
    assert!(h.outcome().hang.is_none());
}

#[test]
fn completion_one_tick_after_the_deadline_is_too_late() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    h.finish(0);
    assert!(is_hang(&h.at(10_001).feed(Input::Tick)).is_some());
    assert!(h.finish(1).is_empty(), "the core is over");
}

#[test]
fn a_step_result_stops_that_ranks_step_clock() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    h.msg(0, RankMsg::StepStart { step: 0 });
    h.at(900).msg(0, RankMsg::StepResult(StepReport::new(0)));
    assert!(is_hang(&h.at(5000).feed(Input::Tick)).is_none());
}

#[test]
fn a_step_error_is_evidence_and_stops_the_step_clock() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    h.msg(1, RankMsg::StepStart { step: 0 });
    h.msg(
        1,
        RankMsg::StepError {
            step: 0,
            error: "connection refused".into(),
        },
    );
    assert!(is_hang(&h.at(2000).feed(Input::Tick)).is_none());
    assert_eq!(
        h.outcome().step_errors,
        vec![(1, 0, "connection refused".to_string())]
    );
}

// --- rank deaths and endings ---

#[test]
fn a_rank_dying_mid_step_is_an_unexpected_exit_naming_the_step() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    h.msg(1, RankMsg::StepStart { step: 0 });
    h.feed(Input::Exited {
        rank: 1,
        status: "signal: 6 (SIGABRT)".into(),
        clean: false,
    });
    h.feed(Input::LineClosed { rank: 1 });
    let o = h.outcome();
    assert_eq!(
        o.unexpected,
        vec!["rank 1 ended (signal: 6 (SIGABRT)) during step 0 (pingpong)".to_string()]
    );
}

#[test]
fn an_exit_is_judged_only_after_the_line_closed_so_the_last_messages_count() {
    let mut h = Harness::new(config(1));
    h.join_all(1);
    h.feed(Input::Exited {
        rank: 0,
        status: "exit status: 0".into(),
        clean: true,
    });
    // Done arrives after the exit was seen, but before the line closed.
    h.msg(0, RankMsg::Done);
    let acts = h.feed(Input::LineClosed { rank: 0 });
    assert_eq!(acts, vec![Action::Finish]);
    assert!(h.outcome().unexpected.is_empty());
}

#[test]
fn a_rank_that_says_done_but_exits_nonzero_is_unexpected() {
    let mut h = Harness::new(config(1));
    h.join_all(1);
    h.msg(0, RankMsg::Done);
    h.feed(Input::Exited {
        rank: 0,
        status: "exit status: 3".into(),
        clean: false,
    });
    h.feed(Input::LineClosed { rank: 0 });
    assert!(h.outcome().unexpected[0].contains("exit status: 3"));
}

#[test]
fn a_rank_exiting_by_design_is_not_a_failure() {
    let mut h = Harness::new(config(3));
    h.join_all(3);
    h.msg(
        2,
        RankMsg::ExitingByDesign {
            step: 0,
            reason: "leaves before the first exchange".into(),
        },
    );
    h.feed(Input::Exited {
        rank: 2,
        status: "exit status: 0".into(),
        clean: true,
    });
    h.feed(Input::LineClosed { rank: 2 });
    h.finish(0);
    assert_eq!(h.finish(1), vec![Action::Finish]);
    assert!(h.outcome().unexpected.is_empty());
}

#[test]
fn a_rank_that_exits_before_joining_needs_no_line_to_be_judged() {
    let mut h = Harness::new(config(2));
    let acts = h.feed(Input::Exited {
        rank: 1,
        status: "exit status: 101".into(),
        clean: false,
    });
    assert!(acts.is_empty());
    assert!(h.outcome().unexpected[0].contains("rank 1 ended (exit status: 101) outside any step"));
}

#[test]
fn an_interruption_ends_the_attempt_and_says_so() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    assert_eq!(h.feed(Input::Interrupted), vec![Action::Finish]);
    assert!(h.core.is_over());
    assert!(h.outcome().interrupted);
}

#[test]
fn reports_are_kept_per_rank() {
    let mut h = Harness::new(config(2));
    h.join_all(2);
    let mut r = StepReport::new(0);
    r.metrics.insert(TEST_PAIRS, 1.0);
    h.msg(1, RankMsg::StepResult(r));
    let o = h.outcome();
    assert_eq!(o.reports.len(), 1);
    assert_eq!(o.reports[0].0, 1);
    assert_eq!(o.reports[0].1.metrics[&TEST_PAIRS], 1.0);
}

#[test]
fn leftovers_the_shell_found_are_kept() {
    let mut h = Harness::new(config(1));
    h.core
        .leftovers(vec!["pid 77 on host-1: wringer rank".into()]);
    assert_eq!(h.outcome().leftovers.len(), 1);
}

#[test]
fn after_the_end_nothing_more_happens() {
    let mut h = Harness::new(config(1));
    h.join_all(1);
    h.finish(0);
    assert!(h.core.is_over());
    assert!(h
        .msg(
            0,
            RankMsg::Barrier {
                name: "late".into(),
                parties: 1,
                members: vec![],
            }
        )
        .is_empty());
    assert!(h.at(99_999).feed(Input::Tick).is_empty());
}
