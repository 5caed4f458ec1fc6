//! Layer 2, hosts: host profiles and what the hosts can do. The probe, placement (where ranks
//! go), SSH, container hosts, soft-RoCE VMs, and the process-level tools (/proc, bounded
//! children, stacks), where exec programs are found (programs), one way to run a command on
//! any host (shell), and Slurm as a launcher (slurm).

pub mod child;
pub mod containers;
pub mod placement;
pub mod probe;
pub mod procfs;
pub mod profile;
pub mod programs;
pub mod shell;
pub mod slurm;
pub mod ssh;
pub mod vm;
