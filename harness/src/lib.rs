//! The wringer harness: scenario files, host profiles and probes, the coordinator and its
//! ranks, the watchdog, verdicts and reports, in five layers.

/// Print a line to stdout, ignoring a closed pipe (`wringer list | head` must not panic, and a
/// run whose reader went away must still finish and write its report).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

// The layers, each importing only the ones above it (a test checks it):
pub mod bench; // 6. ours against the reference tools, driving the orchestration above
pub mod hosts; // 2. host profiles and what hosts can do: probe, placement, ssh, containers, vm
pub mod model; // 1. what a scenario says and what a run records: types and checks, no IO
pub mod orchestration; // 4. runner, coordinator core and shell, launcher, policy, verdicts
pub mod outputs; // 5. reporters, the HTML site
pub mod rank; // 3. the rank side: the worker, its protocol, the step kinds
