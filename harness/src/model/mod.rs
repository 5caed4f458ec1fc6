//! Layer 1, the model: what a scenario says and what a run records. Types and checks only: no
//! processes, sockets or files beyond reading the scenario itself.

pub mod bench;
pub mod duration;
pub mod failure;
pub mod faults;
pub mod input;
pub mod invalid;
pub mod known;
pub mod metric;
pub mod name;
pub mod reach;
pub mod requirement;
pub mod result;
pub mod scenario;
pub mod seed;
pub mod suppression;
pub mod sync_marker;
pub mod syscalls;
pub mod traced;
