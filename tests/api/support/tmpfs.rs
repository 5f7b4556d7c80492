//! A size-limited tmpfs, mounted for one test and unmounted when its guard
//! drops (even if the test fails), and a filler file that takes its free
//! space: a disk that fills, on demand, without touching the machine's own.
//!
//! Mounting needs root. [`Tmpfs::mount`] answers `None` outside CI when it
//! cannot mount (with a loud line on stderr: the test skips); in CI, where
//! nothing may skip, it panics.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::harness::in_ci;

pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// A tmpfs of `bytes` on a fresh directory, owned by `owner` (a user
    /// name) when given. `None` (skip) only outside CI.
    pub fn mount(bytes: u64, owner: Option<&str>) -> Option<Self> {
        let dir = tempfile::Builder::new()
            .prefix("onejob-tmpfs-")
            .tempdir()
            .unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0755")])
            .arg("tmpfs")
            .arg(dir.path())
            .output();
        let refusal = match mounted {
            Ok(output) if output.status.success() => None,
            Ok(output) => Some(
                String::from_utf8_lossy(&output.stderr)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            ),
            Err(error) => Some(error.to_string()),
        };
        if let Some(refusal) = refusal {
            skip_or_fail(&format!(
                "mount -t tmpfs failed ({refusal}); the full-disk tests need root"
            ));
            return None;
        }
        let tmpfs = Self { dir };
        if let Some(owner) = owner {
            let chowned = Command::new("chown")
                .arg(format!("{owner}:{owner}"))
                .arg(tmpfs.path())
                .status()
                .expect("run chown");
            assert!(
                chowned.success(),
                "chown {owner} {}",
                tmpfs.path().display()
            );
        }
        Some(tmpfs)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes a writer may still take, as `stat -f` reports them.
    pub fn free_bytes(&self) -> u64 {
        let output = Command::new("stat")
            .args(["-f", "-c", "%a %S"])
            .arg(self.path())
            .output()
            .expect("run stat -f");
        let text = String::from_utf8_lossy(&output.stdout);
        let mut numbers = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
        numbers.next().unwrap() * numbers.next().unwrap()
    }

    /// Writes a filler file until at most `leave` bytes are free (0: until
    /// the disk refuses a byte more); its path, for [`Tmpfs::free_filler`].
    pub fn fill_leaving(&self, leave: u64) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let chunk = vec![0x5a_u8; 64 * 1024];
        loop {
            let free = self.free_bytes();
            if free <= leave {
                break;
            }
            let take = (free - leave).min(chunk.len() as u64) as usize;
            match file.write(&chunk[..take]) {
                Ok(0) => break,
                Ok(_) => {}
                Err(error) if error.raw_os_error() == Some(28) => break,
                Err(error) => panic!("filling {}: {error}", path.display()),
            }
        }
        file.sync_all().ok();
        path
    }

    /// Deletes the filler: the space an operator frees.
    pub fn free_filler(&self) {
        std::fs::remove_file(self.path().join("filler")).expect("delete the filler");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // A process still holding a file open makes the plain unmount
        // fail; the lazy one detaches the mount all the same.
        let plain = Command::new("umount").arg(self.path()).status();
        if !plain.is_ok_and(|status| status.success()) {
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

/// Whether this process runs as root (CI's machines do).
pub fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
}

/// Fails the test in CI; elsewhere says loudly (past the harness's output
/// capture) that it is skipped.
pub fn skip_or_fail(why: &str) {
    assert!(!in_ci(), "{why}; CI never skips");
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!!!!!\n!!! SKIPPING A FULL-DISK TEST: {why}.\n!!! Run it as root; CI never skips.\n!!!!!!!!\n"
    );
}
