//! `wringer trace-syscalls`: run a program under the audit's eBPF recorder (started by
//! `wringer run` in place of strace, not by hand), and exit as the program did.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use wringer::hosts::syscall_trace;

#[derive(clap::Args)]
pub struct Args {
    /// Where the trace goes (strace's `-f -ttt` format).
    #[arg(long)]
    out: PathBuf,
    /// Record `futex` too (the check of waits without a bound).
    #[arg(long)]
    futex: bool,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    program: Vec<String>,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let status = syscall_trace::trace(&a.out, a.futex, &a.program)?;
    if let Some(sig) = status.signal() {
        // Die as the program did, so the parent sees the same signal.
        // SAFETY: restoring the default disposition installs no handler of ours.
        let _ = unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::try_from(sig)?,
                nix::sys::signal::SigHandler::SigDfl,
            )
        };
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::try_from(sig)?);
    }
    Ok(status.code().unwrap_or(1))
}
