//! Where the CPU went during a timed run, per job: the `onejob` servers',
//! the load generator's (this process, less the fake upstream's threads),
//! the fake upstream's, and PostgreSQL's (every `postgres` process, and
//! what the postmaster's ended children used).
//!
//! Linux counts CPU time in ticks of 10 ms; over a run of seconds and
//! thousands of jobs that is fine enough for microseconds per job.
//!
//! Beside the servers' CPU, how often their threads went to sleep (their
//! voluntary context switches): each is a hand-off between threads, a wait
//! for the disk or for the network, and each wake-up that ends one costs
//! the kernel's time as well as the thread's.

use std::time::Duration;

/// The threads of this process that serve the fake upstream: the thread
/// that runs its system, named so by `upstream`, and actix-web's workers
/// and the arbiter thread actix-rt names after itself (only the
/// upstreams run actix-web here).
const UPSTREAM_THREADS: [&str; 3] = ["bench-upstream", "actix-server", "actix-rt"];

/// CPU counters at one moment.
#[derive(Clone, Copy, Default)]
struct Sample {
    servers: Option<Duration>,
    server_sleeps: Option<u64>,
    own: Option<Duration>,
    upstream: Duration,
    database: Option<Duration>,
}

impl Sample {
    fn now(pids: &[u32]) -> Self {
        let servers = pids
            .iter()
            .map(|pid| cpu_time_of(&pid.to_string()))
            .sum::<Option<Duration>>();
        Self {
            servers,
            server_sleeps: servers_sleeps(pids),
            own: cpu_time_of("self"),
            upstream: upstream_threads(),
            database: postgres_cpu(),
        }
    }
}

/// A run's CPU, from [`CpuMeter::start`] to [`CpuMeter::stop`].
pub struct CpuMeter {
    servers: Vec<u32>,
    start: Sample,
}

/// What a run spent.
#[derive(Clone, Copy, Default)]
pub struct CpuSpent {
    pub server: Option<Duration>,
    /// The servers' threads' voluntary context switches.
    pub server_sleeps: Option<u64>,
    pub load: Option<Duration>,
    pub upstream: Duration,
    pub database: Option<Duration>,
}

impl CpuMeter {
    /// Starts counting for the processes `servers` (pids).
    pub fn start(servers: Vec<u32>) -> Self {
        let start = Sample::now(&servers);
        Self { servers, start }
    }

    pub fn stop(&self) -> CpuSpent {
        let end = Sample::now(&self.servers);
        let minus = |a: Option<Duration>, b: Option<Duration>| Some(a?.saturating_sub(b?));
        let upstream = end.upstream.saturating_sub(self.start.upstream);
        CpuSpent {
            server: minus(end.servers, self.start.servers),
            server_sleeps: end
                .server_sleeps
                .zip(self.start.server_sleeps)
                .map(|(end, start)| end.saturating_sub(start)),
            load: minus(end.own, self.start.own).map(|own| own.saturating_sub(upstream)),
            upstream,
            database: minus(end.database, self.start.database),
        }
    }
}

impl CpuSpent {
    /// The server's CPU per job, in µs.
    pub fn server_per_job(&self, jobs: usize) -> Option<f64> {
        self.server.map(|spent| per_job(spent, jobs))
    }

    pub fn database_per_job(&self, jobs: usize) -> Option<f64> {
        self.database.map(|spent| per_job(spent, jobs))
    }

    /// One line: each side's CPU over the run and per job.
    pub fn line(&self, jobs: usize) -> String {
        let part = |name: &str, spent: Option<Duration>| match spent {
            Some(spent) => format!(
                "{name} {:.2} s = {:.1} µs per job",
                spent.as_secs_f64(),
                per_job(spent, jobs)
            ),
            None => format!("{name} ?"),
        };
        let mut parts = Vec::new();
        if self.server.is_some() {
            let mut server = part("server", self.server);
            if let Some(sleeps) = self.server_sleeps {
                let each = sleeps as f64 / jobs.max(1) as f64;
                server.push_str(&format!(" (its threads slept {each:.1} times a job)"));
            }
            parts.push(server);
        }
        parts.push(part("load generator", self.load));
        if !self.upstream.is_zero() {
            parts.push(part("fake upstream", Some(self.upstream)));
        }
        if self.database.is_some_and(|d| !d.is_zero()) {
            parts.push(part("PostgreSQL", self.database));
        }
        format!("CPU over the run: {}", parts.join("; "))
    }
}

pub fn per_job(spent: Duration, jobs: usize) -> f64 {
    spent.as_secs_f64() * 1e6 / jobs.max(1) as f64
}

/// The CPU time process `pid` (or `self`) has used so far, user and
/// system, from `/proc/<pid>/stat`.
pub fn cpu_time_of(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_times(&stat).map(|(own, _)| own)
}

/// How many times the threads of processes `pids` have gone to sleep so
/// far (voluntary context switches, from each thread's `status`). A thread
/// that ended between two readings takes its count with it: the blocking
/// threads that come and go do so after seconds idle, not in a busy run.
fn servers_sleeps(pids: &[u32]) -> Option<u64> {
    let mut total = 0;
    for pid in pids {
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
        {
            let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
                continue;
            };
            total += status
                .lines()
                .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|count| count.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Some(total)
}

/// A `stat` line's own CPU time and its ended children's, in ticks of 10 ms.
fn stat_times(stat: &str) -> Option<(Duration, Duration)> {
    // The fields after the command's name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |n: usize| fields.get(n)?.parse::<u64>().ok();
    let ticks = |a, b| Some(Duration::from_millis((field(a)? + field(b)?) * 10));
    Some((ticks(11, 12)?, ticks(13, 14)?))
}

/// The command name in a `stat` line.
fn stat_name(stat: &str) -> Option<&str> {
    Some(stat.split_once('(')?.1.rsplit_once(')')?.0)
}

/// The CPU the fake upstream's threads have used so far.
fn upstream_threads() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
        .filter(|stat| {
            stat_name(stat).is_some_and(|name| UPSTREAM_THREADS.iter().any(|t| name.starts_with(t)))
        })
        .filter_map(|stat| stat_times(&stat).map(|(own, _)| own))
        .sum()
}

/// The CPU PostgreSQL on this machine has used so far: every `postgres`
/// process's own, and the postmaster's ended children's (a backend whose
/// connection closed). `None` when no such process is visible.
fn postgres_cpu() -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut seen = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if stat_name(&stat) != Some("postgres") {
            continue;
        }
        if let Some((own, children)) = stat_times(&stat) {
            seen = true;
            total += own + children;
        }
    }
    seen.then_some(total)
}

/// Pins this process's threads (the load generator, and the fake
/// upstreams it starts) to `cpus`, a list as `taskset -c` takes it.
pub fn pin_self(cpus: &str) {
    let pid = std::process::id().to_string();
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("running taskset (util-linux)");
    assert!(status.success(), "taskset -c {cpus} refused");
}
