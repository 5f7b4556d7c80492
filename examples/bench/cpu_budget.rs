//! A CPU budget for a serving process: a cgroup CPU quota, standing in for
//! the machine of its own that each process of a scaled-out deployment has.
//!
//! On one shared machine, more processes only divide the same cores; held
//! to a budget each, three processes get three budgets, as three machines
//! would, while the database and the load generator stay unlimited. Needs a
//! writable cgroup CPU controller (cgroup v2 with `cpu` enabled, or v1's
//! `cpu` hierarchy), which a root shell on Linux normally has.

use std::path::{Path, PathBuf};

/// Quotas are granted per period; a short period keeps a budgeted process
/// from stalling for long once its share is spent.
const PERIOD_MICROS: u64 = 10_000;

/// One cgroup with a CPU quota; removed when dropped (after its processes
/// have exited).
pub struct CpuBudget {
    dir: PathBuf,
}

impl CpuBudget {
    /// A new cgroup named `name` whose processes together may use `cores`
    /// of CPU time.
    pub fn new(name: &str, cores: f64) -> Result<Self, String> {
        let quota = (cores * PERIOD_MICROS as f64).round() as u64;
        let (dir, limits): (PathBuf, Vec<(&str, String)>) = if cgroup_v2_has_cpu() {
            (
                Path::new("/sys/fs/cgroup").join(name),
                vec![("cpu.max", format!("{quota} {PERIOD_MICROS}"))],
            )
        } else {
            (
                Path::new("/sys/fs/cgroup/cpu").join(name),
                vec![
                    ("cpu.cfs_period_us", PERIOD_MICROS.to_string()),
                    ("cpu.cfs_quota_us", quota.to_string()),
                ],
            )
        };
        if !dir.exists() {
            std::fs::create_dir(&dir)
                .map_err(|e| format!("cannot create the cgroup {}: {e}", dir.display()))?;
        }
        let budget = Self { dir };
        for (file, value) in limits {
            budget.write(file, &value)?;
        }
        Ok(budget)
    }

    /// Moves the process `pid` (all its threads) into the budget.
    pub fn admit(&self, pid: u32) -> Result<(), String> {
        self.write("cgroup.procs", &pid.to_string())
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

impl Drop for CpuBudget {
    fn drop(&mut self) {
        // The kernel refuses to remove a cgroup until its last task is gone,
        // which can trail the process's reaping by a moment.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

fn cgroup_v2_has_cpu() -> bool {
    std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "cpu"))
}
