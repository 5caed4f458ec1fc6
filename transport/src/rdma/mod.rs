//! RDMA backend (cargo feature `rdma`): discovery from sysfs, the configured interface list,
//! RC connections over rdma_cm ([`rc`]), the DAQIRI-shaped server ([`server`]) and
//! interoperation with rdma-core's `ibv_rc_pingpong` ([`compat`]).
//!
//! The rule from the DAQIRI seed: everything that picks an interface uses the index into the
//! *configured* interface list ([`interfaces::Interface::index`]), never an IB port number.

pub mod compat;
pub mod discovery;
pub mod interfaces;
pub mod port_events;
pub mod rc;
pub mod server;
