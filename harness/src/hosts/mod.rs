//! Layer 2, hosts: host profiles and what the hosts can do. One trait over every kind of host
//! (backend), the probe, placement (a profile's hosts brought up as a backend), SSH, container hosts, soft-RoCE VMs, and the process-level tools (/proc, bounded
//! children, stacks), private folders and files on a shared host (private), where exec programs are found (programs), the installed releases of torch (releases), one way to run a command on
//! any host (shell), Slurm as a launcher (slurm), the checks on profile values (values), and the audit's eBPF
//! syscall recorder that runs around a rank (syscall_trace).

pub mod backend;
pub mod child;
pub mod containers;
pub mod placement;
pub mod private;
pub mod probe;
pub mod procfs;
pub mod profile;
pub mod programs;
pub mod releases;
pub mod shell;
pub mod slurm;
pub mod ssh;
pub mod syscall_trace;
pub mod values;
pub mod vm;
