//! `wringer validate`: parse and check scenario, host profile and known-failures files only.

use std::path::PathBuf;

use wringer::hosts::profile as hosts;
use wringer::model::scenario;
use wringer::outputs::progress::printable;
use wringer::rank::steps;

#[derive(clap::Args)]
pub struct Args {
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let paths = &a.paths;
    use wringer::model::input::FileKind;
    let mut files = vec![];
    for p in paths {
        files.extend(scenario::discover(std::slice::from_ref(p))?);
    }
    let mut bad = 0;
    for f in &files {
        // What a file is follows from what it says, not from the folder it sits in: a host
        // profile has a top-level `kind:`, a known-failures file is a list.
        // Read the one bounded way (a FIFO or /dev/zero is refused here, not waited on); the
        // folder only names what the file was meant to be in that error.
        let meant = if f.components().any(|c| c.as_os_str() == "hosts") {
            FileKind::Profile
        } else {
            FileKind::Scenario
        };
        let text = match wringer::model::input::read_bytes(f, meant) {
            Ok(bytes) => bytes,
            Err(e) => {
                bad += 1;
                eprintln!("error: {}", printable(&e.to_string()));
                continue;
            }
        };
        let text = String::from_utf8_lossy(&text);
        let first = text
            .lines()
            .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .unwrap_or("");
        let result = if first.starts_with("- ") || first == "-" {
            wringer::model::known::load(f).map(|_| ())
        } else if text.lines().any(|l| l.starts_with("kind:")) {
            hosts::load(f).map(|_| ())
        } else {
            steps::load(f).map(|_| ())
        };
        match result {
            Ok(()) => wringer::say!("ok   {}", f.display()),
            Err(e) => {
                bad += 1;
                eprintln!("error: {}", printable(&e.to_string()));
            }
        }
    }
    Ok(if bad > 0 { 2 } else { 0 })
}
