//! RDMA discovery and the configured interface list, against a fake sysfs tree shaped like the
//! one two rxe devices produce (so this runs on any machine).
#![cfg(feature = "rdma")]

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use wringer_transport::rdma::discovery::{
    discover, rdma_mtu_for, DiscoveryError, GidType, PortState,
};
use wringer_transport::rdma::interfaces::{resolve, InterfaceSpec, ResolveError};

fn put(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, format!("{text}\n")).unwrap();
}

/// rxe0 on veth0 (10.213.0.1), rxe1 on veth1 (10.213.0.2), mlx5_9 with a DOWN port.
fn fake_sysfs(tag: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("wringer-sysfs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (dev, ndev, ip, mtu) in [
        ("rxe0", "veth0", "0ad5:0001", "1500"),
        ("rxe1", "veth1", "0ad5:0002", "9000"),
    ] {
        let port = format!("class/infiniband/{dev}/ports/1");
        put(&root, &format!("{port}/state"), "4: ACTIVE");
        put(&root, &format!("{port}/link_layer"), "Ethernet");
        put(
            &root,
            &format!("{port}/gids/0"),
            "fe80:0000:0000:0000:b0a1:c2ff:fed3:e4f5",
        );
        put(&root, &format!("{port}/gid_attrs/types/0"), "IB/RoCE v1");
        put(&root, &format!("{port}/gid_attrs/ndevs/0"), ndev);
        // IPv4-mapped: ::ffff:10.213.0.x
        put(
            &root,
            &format!("{port}/gids/1"),
            &format!("0000:0000:0000:0000:0000:ffff:{ip}"),
        );
        put(&root, &format!("{port}/gid_attrs/types/1"), "RoCE v2");
        put(&root, &format!("{port}/gid_attrs/ndevs/1"), ndev);
        put(
            &root,
            &format!("{port}/gids/2"),
            "0000:0000:0000:0000:0000:0000:0000:0000",
        );
        put(&root, &format!("class/net/{ndev}/mtu"), mtu);
    }
    put(&root, "class/infiniband/mlx5_9/ports/1/state", "1: DOWN");
    put(
        &root,
        "class/infiniband/mlx5_9/ports/1/link_layer",
        "InfiniBand",
    );
    put(
        &root,
        "class/infiniband/mlx5_9/ports/1/gids/0",
        "fe80:0000:0000:0000:0002:c903:0000:0001",
    );
    root
}

#[test]
fn discovers_ports_gids_types_addresses_and_mtu() {
    let root = fake_sysfs("disc");
    let devs = discover(&root).unwrap();
    let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["mlx5_9", "rxe0", "rxe1"]);
    let rxe1 = &devs[2];
    assert!(rxe1.is_rxe());
    let port = &rxe1.ports[0];
    assert_eq!(
        (port.number, port.state, port.link_layer.as_str()),
        (1, PortState::Active, "Ethernet")
    );
    assert_eq!(port.gids.len(), 2, "the all-zero GID is skipped");
    assert_eq!(port.gids[0].kind, GidType::RoceV1);
    assert_eq!(port.gids[0].ip, None, "a link-local GID carries no address");
    assert_eq!(port.gids[1].kind, GidType::RoceV2);
    assert_eq!(
        port.gids[1].ip,
        Some(IpAddr::V4(Ipv4Addr::new(10, 213, 0, 2)))
    );
    assert_eq!(port.gids[1].netdev.as_deref(), Some("veth1"));
    assert_eq!(port.mtu, Some(4096));
    assert_eq!(devs[1].ports[0].mtu, Some(1024));
    assert_eq!(devs[0].ports[0].state, PortState::Down);
    assert_eq!(rdma_mtu_for(1500), 1024);
}

#[test]
fn no_sysfs_class_is_a_typed_no_rdma_answer() {
    let empty = std::env::temp_dir().join(format!("wringer-sysfs-none-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    assert!(matches!(discover(&empty), Err(DiscoveryError::NoRdma(why)) if why.contains("absent")));
}

/// DAQIRI #113: two interfaces configured in reverse order. Each keeps its list index; the IB
/// port number (1 for both) is never what selects one.
#[test]
fn interfaces_keep_their_configured_index_not_the_port_number() {
    let devs = discover(&fake_sysfs("idx")).unwrap();
    let config = [
        InterfaceSpec::DevicePort {
            device: "rxe1".into(),
            port: 1,
        },
        InterfaceSpec::Netdev("veth0".into()),
        InterfaceSpec::Ip(IpAddr::V4(Ipv4Addr::new(10, 213, 0, 2))),
    ];
    // The last entry duplicates the first (same device and port): refused, not silently merged.
    assert!(matches!(
        resolve(&config, &devs),
        Err(ResolveError::Duplicate {
            first: 0,
            second: 2,
            ..
        })
    ));
    let ifs = resolve(&config[..2], &devs).unwrap();
    assert_eq!(
        (ifs[0].index, ifs[0].device.as_str(), ifs[0].port),
        (0, "rxe1", 1)
    );
    assert_eq!(
        (ifs[1].index, ifs[1].device.as_str(), ifs[1].port),
        (1, "rxe0", 1)
    );
    assert_eq!(ifs[0].gid.kind, GidType::RoceV2);
    assert_eq!(
        ifs[1].gid.ip,
        Some(IpAddr::V4(Ipv4Addr::new(10, 213, 0, 1)))
    );
    let by_ip = resolve(&config[2..], &devs).unwrap();
    assert_eq!((by_ip[0].index, by_ip[0].device.as_str()), (0, "rxe1"));
}

#[test]
fn unknown_and_down_interfaces_are_typed_errors() {
    let devs = discover(&fake_sysfs("err")).unwrap();
    let unknown = [InterfaceSpec::Netdev("eth7".into())];
    assert!(matches!(
        resolve(&unknown, &devs),
        Err(ResolveError::NotFound { index: 0, .. })
    ));
    let down = [
        InterfaceSpec::Netdev("veth0".into()),
        InterfaceSpec::DevicePort {
            device: "mlx5_9".into(),
            port: 1,
        },
    ];
    assert!(matches!(
        resolve(&down, &devs),
        Err(ResolveError::NotActive {
            index: 1,
            state: PortState::Down,
            ..
        })
    ));
}
