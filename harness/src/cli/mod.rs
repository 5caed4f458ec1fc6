//! The subcommands of `wringer`, one module each, above the library's five layers.

pub mod audit;
pub mod bench;
pub mod list;
pub mod probe;
pub mod rank;
pub mod replay;
pub mod report;
pub mod run;
pub mod scenarios;
pub mod trace;
pub mod validate;
