use super::*;
use crate::rank::protocol::StepReport;

fn point(name: &str, required: bool) -> Reach {
    Reach {
        point: name.into(),
        required,
        ..Reach::default()
    }
}

#[test]
fn a_point_counts_once_per_repeat_that_any_rank_reached_and_undeclared_ones_fail() {
    let mut reach = vec![point("a", true), point("b", false)];
    let mut r0 = StepReport::new(0);
    r0.reached.insert("a".into(), 3);
    let mut r1 = StepReport::new(0);
    r1.reached.insert("a".into(), 2);
    let reports = [(0, r0), (1, r1)];
    assert!(count_reached(&mut reach, &reports).is_empty());
    assert!(count_reached(&mut reach, &[]).is_empty());
    assert_eq!((reach[0].repeats_reached, reach[0].times), (1, 5));
    assert_eq!(reach[1].repeats_reached, 0);
    let mut stray = StepReport::new(0);
    stray.reached.insert("stray".into(), 1);
    let f = count_reached(&mut reach, &[(0, stray)]);
    assert_eq!(f.len(), 1);
    assert!(f[0].to_string().contains("`stray`"), "{}", f[0]);
}

#[test]
fn a_replay_line_spells_out_seed_attempt_perturbations_and_faults_as_shell_words() {
    let rerun = Rerun {
        head: vec![
            "wringer".into(),
            "run".into(),
            "--hosts".into(),
            "hosts/local.yaml".into(),
        ],
        tail: None,
    };
    let p: Perturb =
        serde_saphyr::from_str("{ syscall: poll, delay_exit: 100us, when: \"3+2\" }").unwrap();
    let f: Fault = serde_saphyr::from_str("{ rank: 1, at: mid-stream, action: sigkill }").unwrap();
    let line = rerun.line(
        Path::new("scenarios/x.yaml"),
        None,
        42,
        3,
        &[p],
        &[f],
        false,
    );
    assert_eq!(
        line,
        "wringer run --hosts hosts/local.yaml --seed 42 --attempt 3 \
         --perturb '{delay_exit: 100us, syscall: poll, when: 3+2}' \
         --fault '{action: sigkill, at: mid-stream, rank: 1}' scenarios/x.yaml"
    );
    assert_eq!(shell_word("it's"), "'it'\\''s'");
}

#[test]
fn a_torch_scenario_s_line_pins_its_release_and_pastes_back_to_the_same_words() {
    let rerun = Rerun {
        head: vec![
            "wringer".into(),
            "run".into(),
            "--hosts".into(),
            "-h.yaml".into(),
        ],
        tail: None,
    };
    let root = Path::new("/srv/torch venvs/2.8.0");
    let line = rerun.line(
        Path::new("-x\u{202e}.yaml"),
        Some(("WRINGER_TORCH", root)),
        7,
        0,
        &[],
        &[],
        true,
    );
    assert!(
        line.starts_with("WRINGER_TORCH='/srv/torch venvs/2.8.0' wringer run"),
        "{line}"
    );
    assert!(!line.contains('\u{202e}'), "{line}");
    // bash reads it back as the same assignment and words.
    let out = std::process::Command::new("bash")
        .args([
            "-c",
            &format!("wringer() {{ printf '%s|' \"$WRINGER_TORCH\" \"$@\"; }}; {line}"),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/srv/torch venvs/2.8.0|run|--hosts|./-h.yaml|--seed|7|--attempt|0|--shrink|./-x\u{202e}.yaml|"
    );
}
