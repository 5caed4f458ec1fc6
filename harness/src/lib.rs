//! The wringer harness: scenario files, host profiles and probes, the coordinator and its
//! ranks, the watchdog, verdicts and reports.

/// Print a line to stdout, ignoring a closed pipe (`wringer list | head` must not panic, and a
/// run whose reader went away must still finish and write its report).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

pub mod bench;
pub mod child;
pub mod containers;
pub mod coordinator;
pub mod duration;
pub mod hosts;
pub mod input;
pub mod launcher;
pub mod placement;
pub mod probe;
pub mod procfs;
pub mod protocol;
pub mod rank;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod site;
pub mod ssh;
pub mod steps;
pub mod verdict;
pub mod vm;
