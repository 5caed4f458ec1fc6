use super::*;

fn parse(yaml: &str) -> Exec {
    serde_saphyr::from_str(yaml).unwrap()
}

const PAIR: &str = r#"
deadline: 30s
roles:
  server:
    ranks: [0]
    program: srv
    args: ["-p", "{port}"]
    ready: { listening: true }
    expect: { signal: SIGKILL }
  client:
    ranks: [1]
    after: [server]
    program: cli
    args: ["{addr:0}"]
    error: "^error"
    expect: { exit: 1, detect_within: 2s, exit_within: 3s }
faults:
  - { role: server, action: sigkill, at: ready, delay: 100ms }
"#;

#[test]
fn a_well_formed_pair_passes_its_checks() {
    assert_eq!(parse(PAIR).check(2), Ok(()));
}

fn refused(yaml: &str, ranks: u32) -> String {
    parse(yaml).check(ranks).unwrap_err().0
}

#[test]
fn what_is_wrong_with_a_step_is_named() {
    // A rank beyond the scenario, a rank in two roles, a placeholder typo.
    assert!(refused(PAIR, 1).contains("not below the scenario's 1 ranks"));
    let two_roles = PAIR.replace("ranks: [1]", "ranks: [0]");
    assert!(refused(&two_roles, 2).contains("already in role"));
    let typo = PAIR.replace("{addr:0}", "{adr:0}");
    assert!(refused(&typo, 2).contains("unknown placeholder `{adr:0}`"));
    // Waiting for a role that is never ready, or for one that does not exist.
    let unready = PAIR
        .replace("    ready: { listening: true }\n", "")
        .replace("at: ready", "at: started");
    assert!(refused(&unready, 2).contains("has no `ready:`"));
    let ghost = PAIR.replace("after: [server]", "after: [sever]");
    assert!(refused(&ghost, 2).contains("`sever`, which is not a role"));
    // Detection without an error line.
    let no_error = PAIR.replace("    error: \"^error\"\n", "");
    assert!(refused(&no_error, 2).contains("set `error:`"));
    let bad_signal = PAIR.replace("SIGKILL", "SIGKIL");
    assert!(refused(&bad_signal, 2).contains("not a signal name"));
    let bad_regex = PAIR.replace("^error", "(unclosed");
    assert!(refused(&bad_regex, 2).contains("bad regex"));
}

#[test]
fn roles_that_wait_for_each_other_in_a_circle_are_refused() {
    let circle = PAIR
        .replace("program: srv", "program: srv\n    after: [client]")
        .replace(
            "    error: \"^error\"\n",
            "    error: \"^error\"\n    ready: { line: up }\n",
        );
    assert!(
        refused(&circle, 2).contains("in a circle"),
        "{}",
        refused(&circle, 2)
    );
}

#[test]
fn only_output_metrics_can_be_read_from_output() {
    let y = PAIR.replace(
        "    error: \"^error\"\n",
        "    error: \"^error\"\n    metrics: [{ metric: detect_ms, regex: 'x=([0-9]+)' }]\n",
    );
    assert!(refused(&y, 2).contains("cannot be read from output"));
    let no_group = PAIR.replace(
        "    error: \"^error\"\n",
        "    error: \"^error\"\n    metrics: [{ metric: rounds, regex: 'x=[0-9]+' }]\n",
    );
    assert!(refused(&no_group, 2).contains("capture group"));
}

#[test]
fn json_lines_are_read_leniently() {
    assert_eq!(
        json_number(r#"{"lat": {"avg": 1.5}}"#, "lat.avg"),
        Some(1.5)
    );
    // perftest 4.5's --out_json: bare keys.
    assert_eq!(
        json_number("{ BW_average: 9.25, MsgRate: \"3\" }", "BW_average"),
        Some(9.25)
    );
    assert_eq!(json_number("{ MsgRate: \"3\" }", "MsgRate"), Some(3.0));
    assert_eq!(json_number("not json", "x"), None);
    assert_eq!(json_number("{\"x\": true}", "x"), None);
}

fn record(rank: u32, role: &str) -> Record {
    Record {
        role: role.into(),
        rank,
        started_us: 1_000_000,
        ..Record::default()
    }
}

fn reports(records: &[Record]) -> Vec<StepReport> {
    records
        .iter()
        .map(|r| StepReport {
            outcomes: vec![serde_json::to_value(r).unwrap()],
            ..StepReport::default()
        })
        .collect()
}

fn judge(records: &[Record]) -> Reconciled {
    let reps = reports(records);
    let pairs: Vec<(u32, &StepReport)> = records.iter().map(|r| r.rank).zip(reps.iter()).collect();
    reconcile(&parse(PAIR), &pairs, &[])
}

#[test]
fn detection_and_exit_are_timed_from_the_victims_fault_per_survivor() {
    let mut server = record(0, "server");
    server.fault = Some((FaultAction::Sigkill, 2_000_000));
    let mut client = record(1, "client");
    client.first_error_us = Some(2_006_000);
    client.first_error = Some("error: reset".into());
    client.exit = Some("exit 1".into());
    client.exit_us = Some(2_007_500);
    let r = judge(&[server, client]);
    assert_eq!(r.failures, Vec::<String>::new());
    assert_eq!(r.metrics, vec![(DETECT_MS, 6.0), (super::EXIT_MS, 7.5)]);
    assert!(r
        .notes
        .iter()
        .any(|n| n.contains("rank 1 (client)") && n.contains("detect_ms 6.0 ms")));
}

#[test]
fn a_survivor_that_logs_the_error_and_never_exits_fails_with_its_last_lines() {
    let mut server = record(0, "server");
    server.fault = Some((FaultAction::Sigkill, 2_000_000));
    let mut client = record(1, "client");
    client.first_error_us = Some(2_010_000);
    client.ended_by_harness = Some("still running at the step's deadline".into());
    client.tail = vec!["error: endpoint timeout".into()];
    let r = judge(&[server, client]);
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert!(r.failures[0].contains("logged the error 10.0 ms after the fault but never exited"));
    assert!(r.failures[0].contains("`error: endpoint timeout`"));
}

#[test]
fn late_detection_and_rank_local_violations_fail() {
    let mut server = record(0, "server");
    server.fault = Some((FaultAction::Sigkill, 2_000_000));
    server.violations = vec!["ended with exit 0, expected killed by SIGKILL".into()];
    let mut client = record(1, "client");
    client.first_error_us = Some(4_500_000);
    client.exit_us = Some(4_600_000);
    client.exit = Some("exit 1".into());
    let r = judge(&[server, client]);
    assert_eq!(r.failures.len(), 2, "{:?}", r.failures);
    assert!(r
        .failures
        .iter()
        .any(|f| f.contains("rank 0 (server): ended with exit 0")));
    assert!(r
        .failures
        .iter()
        .any(|f| f.contains("after 2500.0 ms, over the 2s allowed")));
}

#[test]
fn timed_expectations_without_any_fault_fail_rather_than_pass_unchecked() {
    let mut client = record(1, "client");
    client.violations = vec!["ended with exit 2, expected exit 1".into()];
    let r = judge(&[record(0, "server"), client]);
    assert_eq!(r.failures.len(), 2, "{:?}", r.failures);
    assert!(r.failures[0].contains("no fault struck"));
    assert!(r.failures[1].contains("ended with exit 2"));
    assert!(r.metrics.is_empty());
}

#[test]
fn a_scenario_fault_on_another_host_times_the_survivors_too() {
    // The victim's host was killed: it sent no record; the coordinator's strike time counts.
    let mut client = record(1, "client");
    client.first_error_us = Some(5_040_000);
    client.exit_us = Some(5_050_000);
    client.exit = Some("exit 1".into());
    let reps = reports(std::slice::from_ref(&client));
    let pairs = [(1, &reps[0])];
    let struck = [StruckFault {
        rank: 0,
        action: crate::model::scenario::FaultAction::HostKill,
        at_us: 5_000_000,
    }];
    let r = reconcile(&parse(PAIR), &pairs, &struck);
    assert_eq!(r.failures, Vec::<String>::new());
    assert_eq!(r.metrics, vec![(DETECT_MS, 40.0), (super::EXIT_MS, 50.0)]);
    assert!(
        r.notes[0].contains("after the HostKill of rank 0"),
        "{:?}",
        r.notes
    );
}

#[test]
fn a_host_level_role_fault_becomes_a_scenario_fault_at_each_rank_point() {
    let y = PAIR
        .replace(
            "action: sigkill, at: ready",
            "action: host-kill, at: { line: up }",
        )
        .replace("ranks: [0]", "ranks: [0, 2]");
    let e = parse(&y);
    assert_eq!(e.check(3), Ok(()));
    let faults = e.faults(4);
    let got: Vec<(u32, String, FaultAction)> = faults
        .iter()
        .map(|f| (f.rank, f.at.clone(), f.action))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, "exec-4-fault-0".to_string(), FaultAction::HostKill),
            (2, "exec-4-fault-0".to_string(), FaultAction::HostKill),
        ]
    );
    // Signals stay with the rank that runs the program.
    assert!(parse(PAIR).faults(0).is_empty());
}

#[test]
fn readiness_is_exactly_one_of_a_port_a_line_or_a_command() {
    let with = |ready: &str| PAIR.replace("ready: { listening: true }", ready);
    assert_eq!(
        parse(&with("ready: { command: [sh, -c, \"true\", \"{port}\"] }")).check(2),
        Ok(())
    );
    assert!(
        refused(&with("ready: { command: [sh, \"{prot}\"] }"), 2).contains("unknown placeholder")
    );
    assert!(refused(&with("ready: { listening: true, line: up }"), 2).contains("exactly one"));
    assert!(refused(&with("ready: { command: [] }"), 2).contains("exactly one"));
}

#[test]
fn a_departure_is_the_fault_its_peers_are_timed_from() {
    let mut leaver = record(0, "server");
    leaver.departed_us = Some(3_000_000);
    leaver.exit = Some("exit 0".into());
    let mut client = record(1, "client");
    client.first_error_us = Some(3_250_000);
    client.first_error = Some("error: peer left".into());
    client.exit = Some("exit 1".into());
    client.exit_us = Some(3_260_000);
    let r = judge(&[leaver, client]);
    assert_eq!(r.failures, Vec::<String>::new());
    assert_eq!(r.metrics, vec![(DETECT_MS, 250.0), (super::EXIT_MS, 260.0)]);
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("rank 0 (server): left on purpose")),
        "{:?}",
        r.notes
    );
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("after the exit of rank 0")),
        "{:?}",
        r.notes
    );
}

#[test]
fn a_departing_role_is_checked_and_release_placeholders_are_put_in() {
    let departs = PAIR.replace(
        "    ready: { listening: true }\n",
        "    ready: { listening: true }\n    departs: \"(bad\"\n",
    );
    assert!(refused(&departs, 2).contains("bad regex"));
    let signalled = PAIR.replace(
        "    ready: { listening: true }\n",
        "    ready: { listening: true }\n    departs: \"^bye\"\n",
    );
    assert!(refused(&signalled, 2).contains("a role that departs exits by itself"));
    let e = parse(&PAIR.replace("program: srv", "program: \"{release}/bin/srv\""));
    assert!(e.uses_release() && !parse(PAIR).uses_release());
    let put = e.for_release("/opt/torch-2.15.0").unwrap();
    assert_eq!(put.roles["server"].program, "/opt/torch-2.15.0/bin/srv");
    // The rank's own placeholders are left for the rank to fill.
    assert_eq!(put.roles["client"].args, ["{addr:0}"]);
    assert!(!put.uses_release());
}
