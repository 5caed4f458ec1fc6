//! RDMA backend (cargo feature `rdma`). So far: discovery from sysfs and the configured
//! interface list. The rdma_cm data path is not in this build yet.
//!
//! The rule from the DAQIRI seed: everything that picks an interface uses the index into the
//! *configured* interface list ([`interfaces::Interface::index`]), never an IB port number.

pub mod compat;
pub mod discovery;
pub mod interfaces;
pub mod rc;
pub mod server;
