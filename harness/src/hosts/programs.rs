//! Where the programs of exec steps are found on a host: its PATH, with the folder of programs
//! shipped next to wringer in front (`external/` beside the binary, as `deploy` leaves it on
//! remote hosts, or `target/external/` in a build tree, where `just external` builds them).

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// How a missing program is named in its skip or error: `NAME (Debian package PKG)`.
pub fn missing(name: &str, package: Option<&str>) -> String {
    match package {
        Some(p) => format!("{name} (Debian package {p})"),
        None => name.to_string(),
    }
}

/// The folder holding the deployed binary on a remote host.
fn remote_dir(remote_exe: &str) -> String {
    Path::new(remote_exe)
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| ".".into())
}

/// The folder of shipped programs on a remote host, beside the deployed binary.
pub fn remote_folder(remote_exe: &str) -> String {
    format!("{}/external", remote_dir(remote_exe))
}

/// Where a rank on a remote host looks for shipped programs, as a PATH: the same two places as
/// [`shipped_folders`] (a VM runs this machine's build, whose programs lie in `target/external`).
pub fn remote_search_path(remote_exe: &str) -> String {
    let dir = remote_dir(remote_exe);
    format!("{dir}/external:{dir}/../external")
}

/// The folders of shipped programs that exist here, nearest first.
pub fn shipped_folders() -> Vec<PathBuf> {
    let Ok(exe) = std::env::current_exe() else {
        return vec![];
    };
    let Some(dir) = exe.parent() else {
        return vec![];
    };
    [dir.join("external"), dir.join("../external")]
        .into_iter()
        .filter(|d| d.is_dir())
        .collect()
}

/// PATH for exec programs: the shipped folders, then this process's PATH.
pub fn search_path() -> OsString {
    let mut dirs = shipped_folders();
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(dirs).unwrap_or_default()
}

fn executable(p: &Path) -> bool {
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The program `name` resolves to on `path`: itself when it names a path, else the first
/// executable of that name in one of `path`'s folders.
pub fn resolve(name: &str, path: &OsString) -> Option<PathBuf> {
    if name.contains('/') {
        return executable(Path::new(name)).then(|| PathBuf::from(name));
    }
    std::env::split_paths(path)
        .map(|d| d.join(name))
        .find(|p| executable(p))
}

/// Whether `name` runs as a command here (shipped folders and PATH).
pub fn runnable(name: &str) -> bool {
    resolve(name, &search_path()).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_resolve_through_the_given_path_only() {
        let path = OsString::from("/usr/bin:/bin");
        assert!(resolve("sh", &path).is_some_and(|p| p.is_absolute()));
        assert!(resolve("wringer-no-such-program", &path).is_none());
        assert!(resolve("sh", &OsString::from("/nonexistent")).is_none());
        assert_eq!(
            resolve("/bin/sh", &OsString::new()),
            Some(PathBuf::from("/bin/sh"))
        );
        // A folder or a file without execute permission is not a program.
        let plain = std::env::temp_dir().join(format!("wringer-plain-{}", std::process::id()));
        std::fs::write(&plain, "not a program").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(resolve(&plain.display().to_string(), &path).is_none());
        std::fs::remove_file(&plain).unwrap();
        assert!(resolve("/usr", &path).is_none());
    }

    #[test]
    fn the_remote_folder_sits_beside_the_deployed_binary() {
        assert_eq!(
            remote_folder("/root/.cache/wringer/wringer-0.1.0-abcd"),
            "/root/.cache/wringer/external"
        );
        assert_eq!(
            remote_search_path("/work/target/release/wringer"),
            "/work/target/release/external:/work/target/release/../external"
        );
    }
}
