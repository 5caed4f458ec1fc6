//! Layer 4, orchestration: the runner, the coordinator (a core without IO and the shell that
//! does its IO), the launcher, the one skip/fail policy, verdicts, and the audit's checkers
//! (syscalls with happens-before between threads, verbs).

pub mod audit;
pub mod call_sites;
pub mod coordinator;
pub mod events;
pub mod happens_before;
pub mod launcher;
pub mod observer;
pub mod policy;
pub mod preflight;
pub mod runner;
pub mod shrink;
pub mod slurm_step;
pub mod verbs_audit;
pub mod verdict;
pub mod wait_for;
