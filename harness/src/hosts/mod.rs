//! Layer 2, hosts: host profiles and what the hosts can do. The probe, placement (where ranks
//! go), SSH, container hosts, soft-RoCE VMs, and the process-level tools (/proc, bounded
//! children, stacks), and where exec programs are found (programs).

pub mod child;
pub mod containers;
pub mod placement;
pub mod probe;
pub mod procfs;
pub mod profile;
pub mod programs;
pub mod ssh;
pub mod vm;
