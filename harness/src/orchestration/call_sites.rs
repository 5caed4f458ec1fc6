//! Call sites as a person reads them: the sync observer's markers carry return addresses,
//! and each observed process leaves its module map (`PREFIX.<pid>.maps`, written by the
//! observer when it attaches and when the program exits). An address becomes
//! `function (file:line)` through binutils' `addr2line` where the module has debug
//! information, else `function+0xOFF (module)` or `module+0xOFF`.
//!
//! Parsing the maps and placing an address in a module is pure; only `addr2line` runs.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// One executable mapping of a file.
#[derive(Clone, Debug, PartialEq)]
struct Mapping {
    start: u64,
    end: u64,
    path: String,
    /// Where the file's first byte is mapped (its mapping at offset 0): addresses in a
    /// position-independent module are relative to it.
    base: u64,
}

/// A process's modules, from its maps (every snapshot of it together).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Modules {
    maps: Vec<Mapping>,
    /// The program: the first file of the last snapshot (`wringer-sync maps` starts one).
    pub program: Option<String>,
}

impl Modules {
    /// Read `/proc/PID/maps` text (several snapshots appended are fine).
    pub fn parse(text: &str) -> Modules {
        let mut base: BTreeMap<String, u64> = BTreeMap::new();
        let mut exec: Vec<(u64, u64, String)> = vec![];
        let mut program = None;
        let mut first = true;
        for line in text.lines() {
            if line.starts_with("wringer-sync maps") {
                first = true;
                continue;
            }
            let mut f = line.split_whitespace();
            let (Some(range), Some(perms), Some(offset)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let path = f.nth(2).unwrap_or("");
            if !path.starts_with('/') {
                continue;
            }
            let Some((a, b)) = range.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end), Ok(offset)) = (
                u64::from_str_radix(a, 16),
                u64::from_str_radix(b, 16),
                u64::from_str_radix(offset, 16),
            ) else {
                continue;
            };
            if first {
                program = Some(path.to_string());
                first = false;
            }
            if offset == 0 {
                base.entry(path.to_string()).or_insert(start);
            }
            if perms.contains('x') {
                exec.push((start, end, path.to_string()));
            }
        }
        let maps = exec
            .into_iter()
            .filter_map(|(start, end, path)| {
                let base = *base.get(&path)?;
                Some(Mapping {
                    start,
                    end,
                    path,
                    base,
                })
            })
            .collect();
        Modules { maps, program }
    }

    /// The module an address is in, and the address relative to the module's load base
    /// (what addr2line reads for a shared object or PIE; a fixed executable reads the address
    /// as it is, which [`symbolise`] decides once per module).
    pub fn place(&self, addr: u64) -> Option<(&str, u64)> {
        let m = self
            .maps
            .iter()
            .find(|m| (m.start..m.end).contains(&addr))?;
        Some((&m.path, addr - m.base))
    }
}

/// `e_type` of an ELF file (2: a fixed-address executable, 3: shared object or PIE).
fn elf_type(path: &Path) -> Option<u16> {
    use std::io::Read;
    let mut head = [0u8; 18];
    crate::model::input::open_regular(path)
        .ok()?
        .0
        .read_exact(&mut head)
        .ok()?;
    (&head[..4] == b"\x7fELF").then(|| u16::from_le_bytes([head[16], head[17]]))
}

/// Every module map a rank's processes left, by process: `PREFIX.<pid>.maps`.
pub fn load(prefix: &Path) -> BTreeMap<u32, Modules> {
    let (Some(dir), Some(stem)) = (prefix.parent(), prefix.file_name()) else {
        return BTreeMap::new();
    };
    let stem = format!("{}.", stem.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    for path in entries.flatten().map(|e| e.path()) {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let Some(pid) = name
            .strip_prefix(&stem)
            .and_then(|r| r.strip_suffix(".maps"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok((f, _)) = crate::model::input::open_regular(&path) {
            use std::io::Read;
            let mut text = String::new();
            let _ = f.take(16 << 20).read_to_string(&mut text);
            out.insert(pid, Modules::parse(&text));
        }
        // Read once: the report keeps the trace, not a map per process.
        let _ = std::fs::remove_file(&path);
    }
    out
}

/// Names for every code address in `text` (`0x…` words) that lies in one of `pid`'s modules:
/// `0x55d0c0de1234 (worker at fixture.c:42)`. Data addresses (a lock's) are left as they are.
pub fn annotate(text: &str, modules: &Modules) -> String {
    annotate_all(&[text], modules).remove(0)
}

/// [`annotate`] for many texts of one process, asking addr2line once per module for all of
/// them (a run with a finding per cycle has hundreds, each with two sites).
pub fn annotate_all(texts: &[&str], modules: &Modules) -> Vec<String> {
    let mut addrs: Vec<u64> = texts
        .iter()
        .flat_map(|t| hex_words(t))
        .filter(|a| modules.place(*a).is_some())
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    if addrs.is_empty() {
        return texts.iter().map(|t| t.to_string()).collect();
    }
    let names = symbolise(modules, &addrs);
    texts.iter().map(|t| name_addresses(t, &names)).collect()
}

/// `text` with each address that has a name followed by it.
fn name_addresses(text: &str, names: &BTreeMap<u64, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("0x") {
        let end = rest[at + 2..]
            .find(|c: char| !c.is_ascii_hexdigit())
            .map_or(rest.len(), |e| at + 2 + e);
        out.push_str(&rest[..end]);
        let word = &rest[at..end];
        if let Some(name) = u64::from_str_radix(&word[2..], 16)
            .ok()
            .and_then(|a| names.get(&a))
        {
            out.push_str(&format!(" ({name})"));
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Whether one of a process's modules holds Rust's std: its source paths, which even a
/// stripped binary keeps for its panic messages. Such code synchronizes through futexes of its
/// own and lock-free queues, which no syscall trace shows. Each file is read once per run of
/// the harness.
pub fn links_rust_std(modules: &Modules) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashMap<String, bool>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    let mut paths: Vec<&str> = modules.maps.iter().map(|m| m.path.as_str()).collect();
    paths.dedup();
    paths.into_iter().any(|path| {
        if let Some(known) = seen.lock().ok().and_then(|s| s.get(path).copied()) {
            return known;
        }
        let rust = std::fs::read(path)
            .is_ok_and(|bytes| memchr::memmem::find(&bytes, b"library/std/src/").is_some());
        if let Ok(mut s) = seen.lock() {
            s.insert(path.to_string(), rust);
        }
        rust
    })
}

fn hex_words(text: &str) -> impl Iterator<Item = u64> + '_ {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter_map(|w| w.strip_prefix("0x"))
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
}

/// Each address's name, asking addr2line once per module.
fn symbolise(modules: &Modules, addrs: &[u64]) -> BTreeMap<u64, String> {
    let mut by_module: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for &a in addrs {
        if let Some((path, own)) = modules.place(a) {
            by_module
                .entry(path.to_string())
                .or_default()
                .push((a, own));
        }
    }
    let mut out = BTreeMap::new();
    for (path, list) in by_module {
        // A fixed-address executable's addresses are its own: read its ELF type once.
        let fixed = elf_type(Path::new(&path)) == Some(2);
        let list: Vec<(u64, u64)> = list
            .into_iter()
            .map(|(a, rel)| (a, if fixed { a } else { rel }))
            .collect();
        // A return address is just past its call: ask for the call's own line.
        let lines = addr2line(
            Path::new(&path),
            &list
                .iter()
                .map(|(_, o)| o.saturating_sub(1))
                .collect::<Vec<_>>(),
        );
        let module = Path::new(&path)
            .file_name()
            .map_or(path.clone(), |f| f.to_string_lossy().to_string());
        for (k, (a, own)) in list.into_iter().enumerate() {
            let name = match lines.get(k) {
                Some((func, Some(file))) => format!("{func} at {file}"),
                Some((func, None)) if func != "??" => format!("{func} in {module}"),
                _ => format!("{module}+{own:#x}"),
            };
            out.insert(a, name);
        }
    }
    out
}

/// `(function, Some(file:line))` per address from `addr2line -f -C`, or nothing when it is
/// not installed or fails (the address is then named by module and offset).
fn addr2line(module: &Path, own: &[u64]) -> Vec<(String, Option<String>)> {
    let mut cmd = Command::new("addr2line");
    cmd.args(["-f", "-C", "-e"]).arg(module);
    cmd.args(own.iter().map(|o| format!("{o:#x}")));
    let Ok(out) = crate::hosts::child::output_within(&mut cmd, None, Duration::from_secs(20))
    else {
        return vec![];
    };
    if !out.status.success() {
        return vec![];
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|pair| {
            let func = pair.first().copied().unwrap_or("??").to_string();
            let file = pair
                .get(1)
                .map(|l| l.split(" (discriminator").next().unwrap_or(l).trim())
                .filter(|l| !l.starts_with("??") && !l.ends_with(":?"))
                .map(|l| shorten(l).to_string());
            (func, file)
        })
        .collect()
}

/// A source path as a person reads it: the file name and line (the full path is noise).
fn shorten(path_line: &str) -> &str {
    path_line.rsplit('/').next().unwrap_or(path_line)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0de0000-55d0c0de1000 r--p 00000000 08:01 123 /usr/bin/prog
55d0c0de1000-55d0c0de2000 r-xp 00001000 08:01 123 /usr/bin/prog
7f0000000000-7f0000001000 r--p 00000000 08:01 456 /usr/lib/libc.so.6
7f0000001000-7f0000100000 r-xp 00001000 08:01 456 /usr/lib/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn an_address_is_placed_in_its_module_relative_to_its_load_base() {
        let m = Modules::parse(&format!("wringer-sync maps\n{MAPS}"));
        assert_eq!(m.program.as_deref(), Some("/usr/bin/prog"));
        // The files are not on this machine: treated as position independent.
        assert_eq!(m.place(0x55d0c0de1234), Some(("/usr/bin/prog", 0x1234)));
        assert_eq!(
            m.place(0x7f0000001010),
            Some(("/usr/lib/libc.so.6", 0x1010))
        );
        assert_eq!(m.place(0x55d0c0de0010), None, "not executable");
        assert_eq!(m.place(0x7ffd00000010), None, "the stack is no module");
    }

    #[test]
    fn data_addresses_are_left_alone_and_unknown_modules_get_an_offset() {
        let m = Modules::parse(MAPS);
        let text = "lock 0x7ffd00000010 (first taken at 0x55d0c0de1234)";
        let named = annotate(text, &m);
        assert!(named.starts_with("lock 0x7ffd00000010 (first"), "{named}");
        assert!(named.contains("0x55d0c0de1234 (prog+0x1234)"), "{named}");
    }

    #[test]
    fn a_real_binary_s_site_has_its_file_and_line() {
        // This test binary itself: the address of a function in it, through its own maps.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let m = Modules::parse(&maps);
        let f = a_real_binary_s_site_has_its_file_and_line as *const () as u64;
        // As a return address would be: one past (the name is asked for the byte before).
        let named = annotate(&format!("at {:#x}", f + 1), &m);
        assert!(
            named.contains("a_real_binary_s_site_has_its_file_and_line at call_sites.rs:"),
            "{named}"
        );
    }

    #[test]
    fn a_process_with_rust_s_std_is_told_from_one_without() {
        // This test binary is Rust; a C program's maps (its program and libc) are not.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(links_rust_std(&Modules::parse(&maps)));
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("libc.so"))
            .unwrap()
            .to_string();
        let c = format!(
            "5000-6000 r-xp 00000000 fe:00 1 /usr/bin/true\n7000-8000 r-xp 00000000 fe:00 2 {libc}\n"
        );
        let m = Modules::parse(&c);
        assert_eq!(m.maps.len(), 2, "{m:?}");
        assert!(!links_rust_std(&m));
    }
}
