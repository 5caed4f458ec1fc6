//! RDMA devices, ports, port state, GIDs with their type, and the netdev and IP behind each GID,
//! read from sysfs (`/sys/class/infiniband`). Needs no rdma-core at run time, so a host without
//! RDMA gets a typed "no RDMA device" answer instead of a library error.

use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DiscoveryError {
    #[error("no RDMA device: {0}")]
    NoRdma(String),
    #[error("reading {path}: {message}")]
    Io { path: String, message: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    Ib,
    RoceV1,
    RoceV2,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gid {
    pub index: u32,
    pub gid: Ipv6Addr,
    pub kind: GidType,
    pub netdev: Option<String>,
    /// The IP address the GID carries (IPv4-mapped GIDs give IPv4).
    pub ip: Option<IpAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    Down,
    Init,
    Armed,
    Active,
    Other(u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub number: u32,
    pub state: PortState,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: String,
    pub gids: Vec<Gid>,
    /// The largest RDMA MTU (256..=4096) the port's netdev carries; `None` without a netdev.
    pub mtu: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub ports: Vec<Port>,
}

impl Device {
    /// Soft-RoCE (rxe) device.
    pub fn is_rxe(&self) -> bool {
        self.name.starts_with("rxe")
    }
}

/// Discover every device under `sysfs` (normally `/sys`).
pub fn discover(sysfs: &Path) -> Result<Vec<Device>, DiscoveryError> {
    let root = sysfs.join("class/infiniband");
    let entries = std::fs::read_dir(&root).map_err(|_| {
        DiscoveryError::NoRdma(format!(
            "{} is absent (the kernel has no RDMA support loaded)",
            root.display()
        ))
    })?;
    let mut devices = vec![];
    for dev in entries.flatten() {
        let name = dev.file_name().to_string_lossy().into_owned();
        let mut ports = vec![];
        for port in read_dir_sorted(&dev.path().join("ports"))? {
            let Ok(number) = port
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .parse::<u32>()
            else {
                continue;
            };
            ports.push(read_port(sysfs, &port, number)?);
        }
        ports.sort_by_key(|p| p.number);
        devices.push(Device { name, ports });
    }
    if devices.is_empty() {
        return Err(DiscoveryError::NoRdma(format!(
            "{} has no devices",
            root.display()
        )));
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(devices)
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<std::path::PathBuf>, DiscoveryError> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .flatten()
        .map(|e| e.path())
        .collect();
    v.sort();
    Ok(v)
}

fn io(path: &Path, e: std::io::Error) -> DiscoveryError {
    DiscoveryError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn read_port(sysfs: &Path, dir: &Path, number: u32) -> Result<Port, DiscoveryError> {
    // "4: ACTIVE"
    let state = match read(&dir.join("state")).and_then(|s| {
        s.split(':')
            .next()
            .and_then(|n| n.trim().parse::<u32>().ok())
    }) {
        Some(1) => PortState::Down,
        Some(2) => PortState::Init,
        Some(3) => PortState::Armed,
        Some(4) => PortState::Active,
        Some(n) => PortState::Other(n),
        None => PortState::Other(0),
    };
    let link_layer = read(&dir.join("link_layer")).unwrap_or_default();
    let mut gids = vec![];
    if let Ok(list) = std::fs::read_dir(dir.join("gids")) {
        for g in list.flatten() {
            let Ok(index) = g.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Some(gid) = read(&g.path()).and_then(|s| parse_gid(&s)) else {
                continue;
            };
            if gid.is_unspecified() {
                continue;
            }
            let kind = match read(&dir.join(format!("gid_attrs/types/{index}"))).as_deref() {
                Some("RoCE v2") => GidType::RoceV2,
                Some(t) if t.contains("RoCE") => GidType::RoceV1,
                _ => GidType::Ib,
            };
            let netdev =
                read(&dir.join(format!("gid_attrs/ndevs/{index}"))).filter(|n| !n.is_empty());
            let ip = match gid.to_ipv4_mapped() {
                Some(v4) => Some(IpAddr::V4(v4)),
                None if kind != GidType::Ib && !is_link_local(&gid) => Some(IpAddr::V6(gid)),
                None => None,
            };
            gids.push(Gid {
                index,
                gid,
                kind,
                netdev,
                ip,
            });
        }
    }
    gids.sort_by_key(|g| g.index);
    let mtu = gids
        .iter()
        .find_map(|g| g.netdev.as_ref())
        .and_then(|n| read(&sysfs.join(format!("class/net/{n}/mtu"))))
        .and_then(|m| m.parse::<u32>().ok())
        .map(rdma_mtu_for);
    Ok(Port {
        number,
        state,
        link_layer,
        gids,
        mtu,
    })
}

fn parse_gid(s: &str) -> Option<Ipv6Addr> {
    // sysfs writes eight groups of four hex digits, which is valid IPv6 text.
    s.parse().ok()
}

fn is_link_local(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// The largest RDMA path MTU that fits an Ethernet MTU (RoCE headers take about 100 bytes).
pub fn rdma_mtu_for(eth_mtu: u32) -> u32 {
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|m| m + 100 <= eth_mtu)
        .unwrap_or(256)
}
