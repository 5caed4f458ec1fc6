//! Layer 3, the rank side: the worker a rank process runs, the protocol it speaks with the
//! coordinator, what a step sees of its rank, and the step kinds.

pub mod context;
pub mod perturb_observer;
pub mod preload;
pub mod protocol;
pub mod slurm_task;
pub mod steps;
pub mod sync_observer;
pub mod verbs_observer;
pub mod worker;
