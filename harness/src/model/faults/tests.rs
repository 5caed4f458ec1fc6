use std::cell::RefCell;

use super::wire::WireScripts;
use super::*;

fn action(yaml: &str) -> FaultAction {
    serde_saphyr::from_str(yaml).unwrap()
}

#[test]
fn bare_actions_are_names_and_the_others_are_names_over_their_parameters() {
    assert_eq!(action("sigkill"), FaultAction::Sigkill);
    assert_eq!(action("roce-blackhole"), FaultAction::RoceBlackhole);
    let loss = action("{ roce-loss: { percent: 2 } }");
    assert_eq!(
        loss,
        FaultAction::RoceLoss(roce_loss::RoceLoss { percent: 2 })
    );
    // Reports, logs and replay lines keep the forms they had.
    assert_eq!(format!("{loss:?}"), "RoceLoss { percent: 2 }");
    assert_eq!(format!("{:?}", FaultAction::QpError), "QpError");
    assert_eq!(
        serde_json::to_string(&loss).unwrap(),
        r#"{"roce-loss":{"percent":2}}"#
    );
    assert_eq!(
        serde_json::to_string(&FaultAction::LinkCut).unwrap(),
        r#""link-cut""#
    );
    for name in FaultAction::NAMES {
        let parsed: Result<FaultAction, _> = serde_saphyr::from_str(name);
        if let Ok(a) = parsed {
            assert_eq!(a.name(), *name);
        }
    }
}

#[test]
fn an_unknown_action_or_parameter_is_refused_by_name() {
    let err = serde_saphyr::from_str::<FaultAction>("sigkil").unwrap_err();
    assert!(err.to_string().contains("sigkill"), "{err}");
    assert!(serde_saphyr::from_str::<FaultAction>("{ roce-loss: { percnt: 2 } }").is_err());
    assert!(serde_saphyr::from_str::<FaultAction>("roce-loss").is_err());
}

#[test]
fn each_action_says_where_it_reaches_and_what_it_excuses() {
    let reach = |yaml: &str| action(yaml).kind().reach();
    assert_eq!(reach("sigstop"), Reach::Rank);
    assert_eq!(reach("host-freeze"), Reach::Host);
    assert_eq!(reach("{ link-flap: { down_for: 1s } }"), Reach::Wire);
    assert!(action("sigkill").kind().stops_the_rank());
    assert!(!action("link-cut").kind().stops_the_rank());
    assert!(!action("rate-limit").kind().excuses_the_rank());
    assert!(action("link-cut").kind().excuses_the_rank());
    assert!(!action("link-down").kind().excuses_the_rank());
    assert!(action("qp-error").kind().needs_verbs_observer());
    assert_eq!(action("sigkill").kind().signal(), Some(Signal::SIGKILL));
    assert_eq!(action("host-kill").kind().signal(), None);
    let only_rank = Strikes::default();
    assert!(only_rank.allows(FaultAction::Sigkill) && !only_rank.allows(FaultAction::HostKill));
    let wire = Strikes {
        host: false,
        wire: true,
    };
    assert!(wire.allows(FaultAction::LinkDown) && !wire.allows(FaultAction::LinkCut));
}

#[test]
fn parameters_are_checked_with_what_to_write_instead() {
    let why = |yaml: &str| action(yaml).kind().check().unwrap_err().0;
    assert!(why("{ roce-loss: { percent: 100 } }").contains("roce-blackhole"));
    assert!(why("{ roce-corrupt: { percent: 0 } }").contains("1..=99"));
    assert!(why("{ roce-delay: { delay: 11s } }").contains("at most"));
    assert!(why("{ roce-reorder: { delay: 5ms, gap: 1 } }").contains("gap"));
    assert!(why("{ link-flap: { down_for: 601s } }").contains("600s"));
    assert!(action("{ roce-delay: { delay: 5ms } }")
        .kind()
        .check()
        .is_ok());
}

/// Planes that write down what they were asked to do.
#[derive(Default)]
struct Recorded(RefCell<Vec<String>>);

impl RankPlane for Recorded {
    fn signal(&self, signal: Signal) -> Result<()> {
        self.0.borrow_mut().push(format!("signal {signal}"));
        Ok(())
    }
    fn force_qp_error(&self) -> Result<()> {
        self.0.borrow_mut().push("qp error".into());
        Ok(())
    }
}

impl HostPlane for Recorded {
    fn kill(&self) -> Result<()> {
        self.0.borrow_mut().push("kill".into());
        Ok(())
    }
    fn freeze(&self) -> Result<()> {
        self.0.borrow_mut().push("freeze".into());
        Ok(())
    }
    fn cut_link(&self) -> Result<()> {
        self.0.borrow_mut().push("cut".into());
        Ok(())
    }
    fn rate_limit(&self, rate: &str) -> Result<()> {
        self.0.borrow_mut().push(format!("rate {rate}"));
        Ok(())
    }
}

impl WirePlane for Recorded {
    fn address(&self) -> &str {
        "10.0.0.2"
    }
    fn apply(&self, scripts: &WireScripts) -> Result<()> {
        self.0.borrow_mut().push(format!(
            "wire {} | {}",
            scripts.struck.trim(),
            scripts.peer.as_deref().unwrap_or("-").trim()
        ));
        Ok(())
    }
    fn link_goes_down(&self) {
        self.0.borrow_mut().push("link down".into());
    }
}

#[test]
fn an_action_strikes_through_its_own_plane_and_is_refused_where_the_site_lacks_it() {
    let planes = Recorded::default();
    let everything = Site {
        backend: "test",
        rank: Some(&planes),
        host: Some(&planes),
        wire: Some(&planes),
        seed: 7,
    };
    for yaml in [
        "sigstop",
        "qp-error",
        "host-kill",
        "rate-limit",
        "link-down",
        "{ roce-loss: { percent: 3 } }",
    ] {
        action(yaml).kind().strike(&everything).unwrap();
    }
    let done = planes.0.take();
    assert_eq!(
        &done[..5],
        [
            "signal SIGSTOP",
            "qp error",
            "kill",
            "rate 10mbit",
            "link down"
        ]
    );
    assert!(done[5].contains("ip link set $D down"), "{done:?}");
    assert!(
        done[6].contains("numgen inc mod 100") && done[6].contains("ip saddr 10.0.0.2"),
        "{done:?}"
    );

    let rank_only = Site::rank("local", &planes, 1);
    let why = action("host-kill").kind().strike(&rank_only).unwrap_err();
    assert!(
        why.to_string()
            .contains("local hosts cannot take a host-level fault"),
        "{why}"
    );
    let why = action("roce-blackhole")
        .kind()
        .strike(&rank_only)
        .unwrap_err();
    assert!(why.to_string().contains("rxe-vm-pair"), "{why}");
    let hosts_only = Site {
        backend: "containers",
        rank: None,
        host: Some(&planes),
        wire: None,
        seed: 1,
    };
    assert!(action("sigkill").kind().strike(&hosts_only).is_err());
    assert!(planes.0.take().is_empty(), "a refused strike does nothing");
}
