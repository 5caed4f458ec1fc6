//! GPU buffers. On a machine without a GPU (this project's CI) the API must answer with a typed
//! "no GPU", the HIP runtime must load and say it has no device, and the kernels must still
//! assemble (PTX) and compile (HIP) for every GPU generation wringer targets. On a machine with
//! a GPU of either vendor the same tests move real device memory.
#![cfg(feature = "gpu")]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use wringer_transport::gpu::hip::rtc;
use wringer_transport::gpu::tcp::TcpStaging;
use wringer_transport::gpu::{inventory, inventory_of, pattern, Gpu, GpuError, Vendor};
use wringer_transport::{connect, ConnectOptions, Hello, Listener, ListenerOptions};

/// `Some(gpu)` on a machine with one; `None` after checking that the absence is typed.
fn gpu_or_typed_absence() -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            assert!(e.is_absent(), "no GPU must read as absence, got: {e}");
            None
        }
    }
}

#[test]
fn without_libcuda_open_and_inventory_are_typed_no_driver_errors() {
    if wringer_transport::gpu::libcuda_present() {
        eprintln!("skipped: libcuda is present here; the GPU round-trip tests cover this host");
        return;
    }
    let err = inventory_of(Vendor::Nvidia).expect_err("no libcuda, so no inventory");
    assert!(matches!(err, GpuError::NoDriver { .. }), "{err:?}");
    assert!(err.to_string().contains("libcuda.so"), "{err}");
    match inventory() {
        // An AMD host answers through HIP instead.
        Ok(inv) => assert_eq!(inv.vendor, Vendor::Amd, "{inv:?}"),
        Err(err) => {
            assert!(err.is_absent(), "{err:?}");
            assert!(err.to_string().contains("libcuda.so"), "{err}");
            let err = Gpu::open(0).err().expect("no GPU, so nothing opens");
            assert!(err.is_absent(), "{err:?}");
        }
    }
}

/// `just test` installs Debian's HIP (libamdhip64, hiprtc, comgr) and sets WRINGER_REQUIRE_HIP,
/// so CI never skips the HIP tests.
fn skip_without_hip(why: &str) {
    assert!(
        std::env::var_os("WRINGER_REQUIRE_HIP").is_none(),
        "WRINGER_REQUIRE_HIP is set but HIP is missing: {why}"
    );
    eprintln!("skipped: no-hip-runtime: {why}");
}

#[test]
fn the_hip_runtime_loads_and_a_host_without_an_amd_gpu_is_a_typed_no_device() {
    match inventory_of(Vendor::Amd) {
        Ok(inv) => {
            // An AMD host: the runtime names itself and every device has an architecture.
            assert!(inv.runtime.starts_with("HIP "), "{inv:?}");
            assert!(!inv.devices.is_empty(), "{inv:?}");
            assert!(
                inv.devices.iter().all(|d| d.arch.starts_with("gfx")),
                "{inv:?}"
            );
        }
        Err(GpuError::NoDevice(why)) => {
            // The table loaded and answered: it names the runtime's version and library.
            assert!(why.contains("HIP ") && why.contains("libamdhip64"), "{why}");
            assert!(GpuError::NoDevice(why).is_absent());
        }
        Err(GpuError::NoHipRuntime(why)) => skip_without_hip(&why),
        Err(e) => panic!("a host without an AMD GPU must be a typed absence, got {e:?}"),
    }
}

/// The HIP kernels' source, run on the CPU: compiled as plain C++ with the few HIP built-ins it
/// uses defined, and every thread of every block run in turn, as a launch of `grid` blocks of
/// 256 would. Holds the HIP fill to the host reference and the check to a flipped byte without
/// an AMD GPU (the PTX twin is held to the same on NVIDIA GPUs).
#[test]
fn hip_kernel_source_computes_the_host_reference_when_run_on_the_cpu() {
    let Some(cxx) = ["c++", "g++", "clang++"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        assert!(
            std::env::var_os("WRINGER_REQUIRE_HIP").is_none(),
            "WRINGER_REQUIRE_HIP is set but no C++ compiler was found"
        );
        eprintln!("skipped: no C++ compiler to run the HIP source on the CPU");
        return;
    };
    let dir = std::env::temp_dir().join(format!("wringer-hip-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = format!(
        "#include <cstdio>\n#include <cstdlib>\n#include <vector>\n\
         struct Dim {{ unsigned x; }};\n\
         static Dim blockIdx, blockDim, gridDim, threadIdx;\n\
         #define __global__\n\
         static unsigned atomicAdd(unsigned* p, unsigned v) {{ unsigned o = *p; *p += v; return o; }}\n\
         {}\n\
         int main(int argc, char** argv) {{\n\
           unsigned long long n = strtoull(argv[1], 0, 10), key = strtoull(argv[2], 0, 10);\n\
           std::vector<unsigned char> buf(n);\n\
           blockDim.x = 256; gridDim.x = (unsigned)((n + 255) / 256 > 1024 ? 1024 : (n + 255) / 256);\n\
           if (gridDim.x == 0) gridDim.x = 1;\n\
           for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++)\n\
             for (threadIdx.x = 0; threadIdx.x < blockDim.x; threadIdx.x++) wringer_fill(buf.data(), n, key);\n\
           fwrite(buf.data(), 1, n, stdout);\n\
           unsigned counts[2] = {{0, 0}};\n\
           for (int k = 0; k < 2; k++) {{\n\
             if (k == 1) buf[n / 2] ^= 0x40;\n\
             for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++)\n\
               for (threadIdx.x = 0; threadIdx.x < blockDim.x; threadIdx.x++) wringer_check(buf.data(), n, key, &counts[k]);\n\
           }}\n\
           fprintf(stderr, \"%u %u\", counts[0], counts[1]);\n\
         }}\n",
        pattern::HIP_SOURCE
    );
    std::fs::write(dir.join("hip_on_cpu.cc"), src).unwrap();
    let bin = dir.join("hip_on_cpu");
    let out = Command::new(cxx)
        .args(["-O2", "-std=c++17", "-o"])
        .arg(&bin)
        .arg(dir.join("hip_on_cpu.cc"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One block, a partial block, and more than 1024 blocks of 256 (the grid-stride loop).
    for (len, seed) in [(1usize, 3u64), (4099, 42), ((1 << 18) + 4097, 7)] {
        let out = Command::new(&bin)
            .arg(len.to_string())
            .arg(pattern::key(seed).to_string())
            .output()
            .unwrap();
        assert!(out.status.success(), "{len}: {out:?}");
        assert!(
            out.stdout == pattern::bytes(seed, len),
            "fill at {len} != the host reference"
        );
        let counts = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(
            counts, "0 1",
            "check at {len}: clean, then one flipped byte"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every architecture from gfx90a (MI200) on that the host's ROCm knows is compiled; the data
/// centre ones it may not know yet (MI300 is gfx942) must be refused with a typed error, never
/// handed to a compiler that would crash on them.
#[test]
fn hip_kernels_compile_for_gfx90a_and_every_newer_architecture_this_rocm_knows() {
    let known = match rtc::known_architectures() {
        Ok(known) => known,
        Err(why) => return skip_without_hip(&why),
    };
    let from = known
        .iter()
        .position(|a| a == "gfx90a")
        .unwrap_or_else(|| panic!("this ROCm does not know gfx90a: {known:?}"));
    let cache = std::env::temp_dir().join(format!("wringer-hip-{}", std::process::id()));
    for arch in &known[from..] {
        let code = rtc::code_object(arch, Some(&cache)).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(code.starts_with(b"\x7fELF"), "{arch}: not a code object");
        for entry in [&b"wringer_fill"[..], b"wringer_check"] {
            assert!(
                code.windows(entry.len()).any(|w| w == entry),
                "{arch}: {} missing",
                String::from_utf8_lossy(entry)
            );
        }
        // Cached per architecture: the next rank reads the same bytes without compiling.
        let cached = std::fs::read(rtc::cache_file(&cache, arch)).expect("cached");
        assert_eq!(cached, code, "{arch}");
        assert_eq!(rtc::code_object(arch, Some(&cache)).unwrap(), code);
    }
    let _ = std::fs::remove_dir_all(&cache);
    let unknown: Vec<&str> = ["gfx940", "gfx941", "gfx942", "gfx950", "gfx1100", "gfx1200"]
        .into_iter()
        .filter(|a| !known.iter().any(|k| k == a))
        .collect();
    for arch in &unknown {
        match rtc::compile(arch) {
            Err(GpuError::HipArchUnsupported { why, .. }) => {
                assert!(
                    why.contains("gfx90a"),
                    "the refusal lists what is known: {why}"
                )
            }
            other => panic!("{arch}: {other:?}"),
        }
    }
    eprintln!(
        "compiled for {}; skipped, unknown to this ROCm: {}",
        known[from..].join(", "),
        if unknown.is_empty() {
            "none".into()
        } else {
            unknown.join(", ")
        }
    );
}

fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WRINGER_PTXAS") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("ptxas"))
            .find(|p| p.is_file())
    })
}

#[test]
fn kernels_assemble_for_volta_ampere_and_hopper() {
    let Some(ptxas) = ptxas() else {
        // `just test` installs ptxas and sets WRINGER_REQUIRE_PTXAS, so CI never skips this.
        assert!(
            std::env::var_os("WRINGER_REQUIRE_PTXAS").is_none(),
            "WRINGER_REQUIRE_PTXAS is set but no ptxas was found (WRINGER_PTXAS or PATH)"
        );
        eprintln!("skipped: no ptxas (set WRINGER_PTXAS, or run `just test`, which installs it)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("wringer-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("pattern.ptx");
    std::fs::write(&src, pattern::PTX).unwrap();
    for arch in ["sm_70", "sm_80", "sm_90"] {
        let out = Command::new(&ptxas)
            .args(["--gpu-name", arch, "-v", "-o"])
            .arg(dir.join(format!("{arch}.cubin")))
            .arg(&src)
            .output()
            .expect("ptxas runs");
        let log = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "ptxas {arch}: {log}");
        for entry in ["wringer_fill", "wringer_check"] {
            assert!(log.contains(entry), "{arch}: {entry} not compiled: {log}");
        }
        // No local-memory spills: the loops must stay in registers.
        assert!(!log.contains("bytes spill stores") || log.contains("0 bytes spill stores"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn device_pattern_matches_the_host_reference_and_catches_one_bad_byte() {
    let Some(gpu) = gpu_or_typed_absence() else {
        eprintln!("skipped: no-gpu (no NVIDIA or AMD GPU on this host)");
        return;
    };
    for (len, exportable) in [
        (1usize, false),
        (255, true),
        (4096, false),
        ((1 << 20) + 3, true),
    ] {
        let mut buf = if exportable {
            gpu.alloc_exportable(len).unwrap()
        } else {
            gpu.alloc(len).unwrap()
        };
        gpu.fill_pattern(&mut buf, len, 42).unwrap();
        let mut host = vec![0u8; len];
        gpu.to_host(&buf, &mut host).unwrap();
        assert_eq!(
            host,
            pattern::bytes(42, len),
            "device fill != host reference at {len}"
        );
        assert_eq!(gpu.pattern_mismatches(&buf, len, 42).unwrap(), 0);
        assert_eq!(
            gpu.pattern_mismatches(&buf, len, 43).unwrap() as usize > len / 2,
            len > 64
        );
        host[len / 2] ^= 0x40;
        gpu.to_device(&host, &mut buf).unwrap();
        assert_eq!(
            gpu.pattern_mismatches(&buf, len, 42).unwrap(),
            1,
            "one flipped byte at {len}"
        );
    }
}

#[test]
fn device_buffers_round_trip_over_tcp_through_pinned_staging() {
    let Some(gpu) = gpu_or_typed_absence() else {
        eprintln!("skipped: no-gpu (no NVIDIA or AMD GPU on this host)");
        return;
    };
    let token = 0x7777_u128;
    let listener =
        Listener::bind("127.0.0.1:0".parse().unwrap(), ListenerOptions::new(token)).unwrap();
    let hello = Hello {
        rank: 1,
        sequence: 1,
        generation: 0,
        token,
    };
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || connect(addr, &hello, &ConnectOptions::default()).unwrap());
    let server = listener.wait_for(1, Duration::from_secs(10)).unwrap();
    let client = t.join().unwrap();
    let max = 4 << 20;
    let (mut tx, mut rx) = (
        TcpStaging::new(&gpu, max).unwrap(),
        TcpStaging::new(&gpu, max).unwrap(),
    );
    let (mut a, mut b) = (gpu.alloc(max).unwrap(), gpu.alloc(max).unwrap());
    for (i, len) in [1usize, 4096, max].into_iter().enumerate() {
        gpu.fill_pattern(&mut a, len, i as u64).unwrap();
        tx.send(&gpu, &client, &a, len, Duration::from_secs(10))
            .unwrap();
        let got = rx
            .recv(&gpu, &server, &mut b, Duration::from_secs(10))
            .unwrap();
        assert_eq!(got, len);
        assert_eq!(gpu.pattern_mismatches(&b, len, i as u64).unwrap(), 0);
    }
    client.close().unwrap();
    server.close().unwrap();
}
