//! AMD GPUs as the kernel's KFD driver lists them (`/sys/class/kfd/kfd/topology/nodes`): which
//! GPUs a host has even when no HIP runtime is installed, and each one's architecture.
//!
//! The architecture comes from here rather than from `hipDeviceProp_t::gcnArchName` because
//! that struct's layout changed between ROCm 5 and 6 (`hipGetDevicePropertiesR0600`); a HIP
//! device is matched to its node by PCI address, which both sides report.

use std::path::Path;

/// One GPU node of the KFD topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KfdGpu {
    /// "gfx942", from `gfx_target_version`.
    pub arch: String,
    /// The gfx major and minor version (9 and 4 for gfx942).
    pub version: (i32, i32),
    pub domain: u32,
    /// PCI bus, device and function packed as `bus << 8 | device << 3 | function`.
    pub location_id: u32,
}

/// The GPU nodes under `sysfs` (normally `/sys`); CPU nodes (version 0) are left out.
pub fn gpus(sysfs: &Path) -> Vec<KfdGpu> {
    let nodes = sysfs.join("class/kfd/kfd/topology/nodes");
    let Ok(dir) = std::fs::read_dir(nodes) else {
        return vec![];
    };
    let mut found: Vec<(u32, KfdGpu)> = dir
        .flatten()
        .filter_map(|node| {
            let index = node.file_name().to_str()?.parse::<u32>().ok()?;
            let text = std::fs::read_to_string(node.path().join("properties")).ok()?;
            let field = |name: &str| {
                text.lines().find_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    (k == name).then(|| v.trim().parse::<u64>().ok())?
                })
            };
            let version = field("gfx_target_version")?;
            (version != 0).then(|| {
                (
                    index,
                    KfdGpu {
                        arch: arch_name(version),
                        version: ((version / 10_000) as i32, (version / 100 % 100) as i32),
                        domain: field("domain").unwrap_or(0) as u32,
                        location_id: field("location_id").unwrap_or(0) as u32,
                    },
                )
            })
        })
        .collect();
    found.sort_by_key(|(i, _)| *i);
    found.into_iter().map(|(_, g)| g).collect()
}

/// `gfx_target_version` (major * 10000 + minor * 100 + stepping) as LLVM names the target:
/// 90010 is gfx90a, 90402 gfx942, 110000 gfx1100.
pub fn arch_name(version: u64) -> String {
    let (major, minor, stepping) = (version / 10_000, version / 100 % 100, version % 100);
    format!("gfx{major}{minor:x}{stepping:x}")
}

/// The node whose PCI address is `pci` ("0000:c1:00.0", as `hipDeviceGetPCIBusId` writes it).
pub fn by_pci<'a>(gpus: &'a [KfdGpu], pci: &str) -> Option<&'a KfdGpu> {
    let (domain, rest) = pci.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s.trim(), 16).ok();
    let location = hex(bus)? << 8 | hex(device)? << 3 | hex(function)?;
    let domain = hex(domain)?;
    gpus.iter()
        .find(|g| g.domain == domain && g.location_id == location)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_versions_name_llvm_targets() {
        assert_eq!(arch_name(90010), "gfx90a");
        assert_eq!(arch_name(90402), "gfx942");
        assert_eq!(arch_name(90008), "gfx908");
        assert_eq!(arch_name(110000), "gfx1100");
        assert_eq!(arch_name(100300), "gfx1030");
    }

    #[test]
    fn gpu_nodes_are_read_and_matched_by_pci_address() {
        let root = std::env::temp_dir().join(format!("wringer-kfd-{}", std::process::id()));
        let nodes = root.join("class/kfd/kfd/topology/nodes");
        let node = |i: u32, props: &str| {
            let d = nodes.join(i.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("properties"), props).unwrap();
        };
        // A CPU node, then two MI300X partitions (location_id 0xc100 is bus c1, 00.0).
        node(
            0,
            "cpu_cores_count 96\nsimd_count 0\ngfx_target_version 0\ndomain 0\n",
        );
        node(
            2,
            "simd_count 1216\ngfx_target_version 90402\nlocation_id 49408\ndomain 0\n",
        );
        node(
            1,
            "simd_count 1216\ngfx_target_version 90402\nlocation_id 1280\ndomain 0\n",
        );
        let found = gpus(&root);
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(
            found[0].location_id, 1280,
            "node order, not directory order"
        );
        assert_eq!(
            by_pci(&found, "0000:c1:00.0").map(|g| g.arch.as_str()),
            Some("gfx942")
        );
        assert_eq!(
            by_pci(&found, "0000:05:00.0").map(|g| g.location_id),
            Some(1280)
        );
        assert_eq!(by_pci(&found, "0000:c2:00.0"), None);
        assert_eq!(by_pci(&found, "garbage"), None);
    }

    #[test]
    fn no_kfd_is_no_gpus() {
        assert!(gpus(Path::new("/nonexistent")).is_empty());
    }
}
