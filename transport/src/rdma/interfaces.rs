//! The configured interface list. Entries name a device and port, a netdev, or an IP; each
//! resolves to one device, port and GID. Everything downstream refers to an interface by its
//! index in this list (DAQIRI #113: using the IB port number instead crashed the server).

use std::net::IpAddr;

use thiserror::Error;

use super::discovery::{Device, Gid, GidType, PortState};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InterfaceSpec {
    DevicePort { device: String, port: u32 },
    Netdev(String),
    Ip(IpAddr),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Position in the configured list: the only number used to pick this interface.
    pub index: usize,
    pub spec: InterfaceSpec,
    pub device: String,
    /// The IB port number (1-based, per device). Never an index into anything of ours.
    pub port: u32,
    pub gid: Gid,
    pub mtu: Option<u32>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ResolveError {
    #[error("interface {index} ({spec:?}): no such RDMA device/port, netdev or address among the discovered devices")]
    NotFound { index: usize, spec: InterfaceSpec },
    #[error("interface {index} ({spec:?}): port {device}/{port} is {state:?}, not ACTIVE")]
    NotActive {
        index: usize,
        spec: InterfaceSpec,
        device: String,
        port: u32,
        state: PortState,
    },
    #[error("interface {index} ({spec:?}): {device}/{port} has no usable GID (RoCE v2 with an IP, or IB)")]
    NoGid {
        index: usize,
        spec: InterfaceSpec,
        device: String,
        port: u32,
    },
    #[error("interfaces {first} and {second} both resolve to {device}/{port}")]
    Duplicate {
        first: usize,
        second: usize,
        device: String,
        port: u32,
    },
}

/// Resolve the configured list against discovered devices, keeping its order.
pub fn resolve(
    config: &[InterfaceSpec],
    devices: &[Device],
) -> Result<Vec<Interface>, ResolveError> {
    let mut out: Vec<Interface> = vec![];
    for (index, spec) in config.iter().enumerate() {
        let found = devices
            .iter()
            .flat_map(|d| d.ports.iter().map(move |p| (d, p)))
            .find(|(d, p)| match spec {
                InterfaceSpec::DevicePort { device, port } => {
                    &d.name == device && p.number == *port
                }
                InterfaceSpec::Netdev(n) => p.gids.iter().any(|g| g.netdev.as_deref() == Some(n)),
                InterfaceSpec::Ip(ip) => p.gids.iter().any(|g| g.ip == Some(*ip)),
            });
        let Some((dev, port)) = found else {
            return Err(ResolveError::NotFound {
                index,
                spec: spec.clone(),
            });
        };
        if port.state != PortState::Active {
            return Err(ResolveError::NotActive {
                index,
                spec: spec.clone(),
                device: dev.name.clone(),
                port: port.number,
                state: port.state,
            });
        }
        // The GID this interface uses: the one carrying the asked-for IP, else the first
        // RoCE v2 GID with an IPv4 address, else any RoCE v2 with an IP, else an IB GID.
        let gid = match spec {
            InterfaceSpec::Ip(ip) => port.gids.iter().find(|g| g.ip == Some(*ip)),
            _ => port
                .gids
                .iter()
                .find(|g| g.kind == GidType::RoceV2 && matches!(g.ip, Some(IpAddr::V4(_))))
                .or_else(|| {
                    port.gids
                        .iter()
                        .find(|g| g.kind == GidType::RoceV2 && g.ip.is_some())
                })
                .or_else(|| port.gids.iter().find(|g| g.kind == GidType::Ib)),
        };
        let Some(gid) = gid.cloned() else {
            return Err(ResolveError::NoGid {
                index,
                spec: spec.clone(),
                device: dev.name.clone(),
                port: port.number,
            });
        };
        if let Some(prev) = out
            .iter()
            .find(|i| i.device == dev.name && i.port == port.number)
        {
            return Err(ResolveError::Duplicate {
                first: prev.index,
                second: index,
                device: dev.name.clone(),
                port: port.number,
            });
        }
        out.push(Interface {
            index,
            spec: spec.clone(),
            device: dev.name.clone(),
            port: port.number,
            gid,
            mtu: port.mtu,
        });
    }
    Ok(out)
}
