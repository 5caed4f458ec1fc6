//! The HTML report in a real browser: headless Chromium loads the page from disk, and the DOM
//! it built must show every scenario of the run with its verdict. A screenshot is kept as an
//! artifact (target/tmp/report-screenshot.png).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Some(p) = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join(name))
            .find(|p| p.is_file())
        {
            return p;
        }
    }
    panic!("no Chromium on PATH: install Debian's `chromium` (`just test` and .ci/run do)");
}

/// wringer's output for `args`, with no input.
fn output_of(args: &[&str]) -> Output {
    common::wringer()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Run Chromium headless in its own process group, bounded; the whole group is killed after.
fn headless(profile: &Path, args: &[String]) -> String {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("chromium starts");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        use std::io::Read;
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let pgid = child.id() as i32;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: signals the process group this test created for Chromium (its helpers included).
    unsafe { libc::killpg(pgid, libc::SIGKILL) };
    let _ = child.wait();
    assert!(status.is_some(), "chromium did not finish within 90 s");
    reader.join().unwrap()
}

#[test]
fn report_page_shows_every_scenario_with_its_verdict_in_chromium() {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("report-browser-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let run = tmp.join("run");
    let fixture = workspace().join("harness/tests/fixtures/impossible.yaml");
    let out = output_of(&[
        "run",
        "scenarios/tcp-exact-reads.yaml",
        "scenarios/tcp-pingpong-8rank.yaml",
        fixture.to_str().unwrap(),
        "--repeat",
        "1",
        "--report-dir",
        run.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the impossible fixture must fail the run"
    );
    let page = tmp.join("site/index.html");
    let history = tmp.join("history.jsonl");
    let out = output_of(&[
        "report",
        run.to_str().unwrap(),
        "--history",
        history.to_str().unwrap(),
        "--out",
        page.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let url = format!("file://{}", page.display());
    let dom = headless(
        &tmp.join("chromium-dom"),
        &["--dump-dom".into(), url.clone()],
    );
    let results: Value =
        serde_json::from_slice(&std::fs::read(run.join("results.json")).unwrap()).unwrap();
    let scenarios = results["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 3);
    for s in scenarios {
        let (name, verdict) = (s["name"].as_str().unwrap(), s["verdict"].as_str().unwrap());
        let cell =
            format!(r#"data-scenario="{name}" data-profile="local" data-verdict="{verdict}""#);
        assert!(dom.contains(&cell), "the page lacks {cell}");
    }
    // The failure's reason and the latency plots are on the page.
    assert!(
        dom.contains("frames_intact"),
        "the failure reason is missing"
    );
    assert!(
        dom.contains("one-way latency by message size"),
        "the latency chart is missing"
    );
    assert!(dom.contains("<svg"), "no charts rendered");

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    headless(
        &tmp.join("chromium-shot"),
        &[
            "--window-size=1300,2600".into(),
            format!("--screenshot={}", shot.display()),
            url,
        ],
    );
    let png = std::fs::read(&shot).expect("a screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "the screenshot is not a real PNG"
    );
    println!("screenshot: {}", shot.display());
}
