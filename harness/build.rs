//! Builds the verbs observer (`verbs-audit/wringer_verbs.c`), the library the verbs audit
//! preloads into RDMA ranks, and its lookup scope (`verbs-audit/scope.c`), and embeds both in
//! `wringer`: a rank writes them out on its own host. Without libibverbs' and librdmacm's
//! headers they are left out, and the audit says so when asked.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    for src in ["verbs-audit/wringer_verbs.c", "verbs-audit/scope.c"] {
        println!("cargo:rerun-if-changed={src}");
    }
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rustc-check-cfg=cfg(verbs_observer)");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    // Linked against libibverbs and librdmacm, so that they are in every observed process's
    // global scope, where the wrappers find the real functions (RTLD_NEXT).
    let observer = compile(
        &cc,
        &out,
        "verbs-audit/wringer_verbs.c",
        "libwringer-verbs.so",
        &[
            "-fvisibility=hidden",
            "-Wl,-soname,libwringer-verbs.so",
            // Kept although no call names them: the wrappers reach them by dlsym.
            "-Wl,--no-as-needed",
            "-libverbs",
            "-lrdmacm",
            "-ldl",
            "-lpthread",
        ],
    );
    // Needs the observer by its soname: the one already preloaded is the one it gets.
    let scope = observer.and_then(|()| {
        let dir = format!("-L{}", out.display());
        compile(
            &cc,
            &out,
            "verbs-audit/scope.c",
            "libwringer-verbs-scope.so",
            &[
                "-Wl,--no-as-needed",
                &dir,
                "-lwringer-verbs",
                "-libverbs",
                "-lrdmacm",
            ],
        )
    });
    match scope {
        Ok(()) => println!("cargo:rustc-cfg=verbs_observer"),
        Err(why) => println!(
            "cargo:warning=the verbs observer did not build ({why}): install libibverbs-dev and librdmacm-dev; the verbs audit is off in this build"
        ),
    }
    ebpf_audit(&out);
    sync_observer(&cc, &out);
    perturb_observer(&cc, &out);
}

/// The sync observer (`sync-audit/wringer_sync.c`), preloaded into audited programs: it needs
/// only libc. Without a C compiler the audit judges order by timing, and says so.
fn sync_observer(cc: &str, out: &Path) {
    let src = "sync-audit/wringer_sync.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rustc-check-cfg=cfg(sync_observer)");
    match compile(
        cc,
        out,
        src,
        "libwringer-sync.so",
        &["-Wl,-soname,libwringer-sync.so", "-ldl", "-lpthread"],
    ) {
        Ok(()) => println!("cargo:rustc-cfg=sync_observer"),
        Err(why) => println!(
            "cargo:warning=the sync observer did not build ({why}): the audit orders events by timing in this build"
        ),
    }
}

/// The perturbation observer (`perturb/wringer_perturb.c`), preloaded into perturbed
/// programs: it needs only libc. Without a C compiler perturbations are injected by strace.
fn perturb_observer(cc: &str, out: &Path) {
    let src = "perturb/wringer_perturb.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rustc-check-cfg=cfg(perturb_observer)");
    match compile(
        cc,
        out,
        src,
        "libwringer-perturb.so",
        &["-Wl,-soname,libwringer-perturb.so", "-ldl"],
    ) {
        Ok(()) => println!("cargo:rustc-cfg=perturb_observer"),
        Err(why) => println!(
            "cargo:warning=the perturbation observer did not build ({why}): perturbations are injected by strace in this build"
        ),
    }
}

/// The eBPF audit's kernel program (`ebpf-audit/audit.bpf.c`), compiled by clang for the BPF
/// target and embedded. Without clang the audit keeps to strace, and says why.
fn ebpf_audit(out: &Path) {
    let src = "ebpf-audit/audit.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=WRINGER_BPF_CLANG");
    println!("cargo:rustc-check-cfg=cfg(ebpf_audit)");
    let clang = std::env::var("WRINGER_BPF_CLANG").unwrap_or_else(|_| "clang".into());
    // The program reads the syscall registers at this architecture's offsets.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let status = Command::new(&clang)
        .args([
            "-target", "bpf", "-O2", "-g", "-Wall", "-Werror", "-c", src, "-o",
        ])
        .arg(out.join("audit.bpf.o"))
        .arg(format!("-DWRINGER_ARCH_{arch}"))
        .status();
    match status {
        Ok(s) if s.success() => println!("cargo:rustc-cfg=ebpf_audit"),
        Ok(s) => println!("cargo:warning={clang} exited {s} on {src}: the eBPF audit is off in this build"),
        Err(e) => println!(
            "cargo:warning=no {clang} ({e}): install Debian's `clang` for the eBPF audit; this build audits with strace only"
        ),
    }
}

fn compile(cc: &str, out: &Path, src: &str, name: &str, extra: &[&str]) -> Result<(), String> {
    let status = Command::new(cc)
        .args([
            "-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-o",
        ])
        .arg(out.join(name))
        .arg(src)
        .args(extra)
        .status()
        .map_err(|e| format!("{cc}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cc} exited {status} on {src}"))
    }
}
