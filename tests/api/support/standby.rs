//! A PostgreSQL primary and its synchronous standby on this machine, made
//! with the installed Debian binaries as user `postgres` in a temp dir, on
//! free ports of 127.0.0.1 (the server the rest of the suite uses is not
//! touched): `initdb`, then `pg_basebackup` for the standby, which streams
//! from the primary under its own `application_name`, the name the
//! primary's `synchronous_standby_names` gives.
//!
//! Each postmaster is a child of the test process, so a `kill -9` is
//! reaped at once and nothing is left when the pair drops (even when the
//! test fails). Per-node settings (port, addresses) are on the command
//! line; the settings of a node's role (`synchronous_standby_names`,
//! `primary_conninfo`) are in its `postgresql.auto.conf`, rewritten at
//! each start (`pg_basebackup` and `pg_rewind` copy the source's) and
//! changed at run time with `ALTER SYSTEM`.
//!
//! The clusters run with `fsync = off`: the faults here are processes
//! dying, after which the kernel still holds what they wrote, and startup
//! skips syncing the whole data directory (seconds on a busy disk). What a
//! power loss does is not tested here.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

use crate::server_process::free_port;
use crate::support::harness::in_ci;

/// The longest one step on a cluster (a start, a promotion, a rewind) may
/// take before the test fails.
const STEP: Duration = Duration::from_secs(20);

/// The installed binaries and the `postgres` user they run as.
#[derive(Clone, Debug)]
pub struct Tools {
    bin: PathBuf,
    uid: u32,
    gid: u32,
}

/// The tools, when this machine can make clusters: root (to run them as
/// `postgres`), a `postgres` user, and `/usr/lib/postgresql/*/bin` with
/// `initdb`, `pg_basebackup`, `pg_ctl` and `pg_rewind`. In CI anything
/// missing fails the test; elsewhere it is skipped with a loud line.
pub fn tools() -> Option<Tools> {
    static FOUND: OnceLock<Result<Tools, String>> = OnceLock::new();
    match FOUND.get_or_init(find_tools) {
        Ok(tools) => Some(tools.clone()),
        Err(why) if in_ci() => panic!("the failover test needs its own clusters in CI: {why}"),
        Err(why) => {
            let _ = writeln!(
                std::io::stderr(),
                "\n!!!!!!!!\n!!! SKIPPING THE FAILOVER TEST: {why}. CI never skips.\n!!!!!!!!\n"
            );
            None
        }
    }
}

fn find_tools() -> Result<Tools, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    let uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .unwrap_or("?");
    if uid != "0" {
        return Err(format!(
            "not root (uid {uid}): initdb refuses root, so the clusters run as `postgres`"
        ));
    }
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| e.to_string())?;
    let (uid, gid) = passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&"postgres") && fields.len() > 3)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
                .flatten()
        })
        .ok_or("no `postgres` user")?;
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("no /usr/lib/postgresql: {e}"))?
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|bin| {
            ["initdb", "postgres", "pg_basebackup", "pg_ctl", "pg_rewind"]
                .iter()
                .all(|tool| bin.join(tool).is_file())
        })
        .collect();
    versions.sort_by_key(|bin| {
        let version = bin.parent().and_then(|v| v.file_name());
        version.and_then(|v| v.to_str()?.parse::<u32>().ok())
    });
    let bin = versions
        .pop()
        .ok_or("no /usr/lib/postgresql/*/bin with initdb, pg_basebackup and pg_rewind")?;
    Ok(Tools { bin, uid, gid })
}

impl Tools {
    /// `program` of the binaries, to run as `postgres` in `dir`.
    fn command(&self, program: &str, dir: &Path) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command
            .uid(self.uid)
            .gid(self.gid)
            .current_dir(dir)
            .env_clear()
            .env("LC_ALL", "C")
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null());
        command
    }

    /// Runs `command` to its end within `STEP`; its output (stdout and
    /// stderr, kept in a file of `dir`), or a panic naming `what`.
    fn run(&self, mut command: Command, dir: &Path, what: &str) -> String {
        let log = dir.join(format!("{}.out", what.replace(' ', "-")));
        let file = std::fs::File::create(&log).unwrap();
        let mut child = command
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = wait_bounded(&mut child, what);
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(status.success(), "{what} failed ({status}):\n{output}");
        output
    }
}

/// Waits for `child` to end, at most `STEP` (then kills it and panics).
fn wait_bounded(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + STEP;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {STEP:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a node is when it starts.
#[derive(Clone, Copy, Debug)]
pub enum Role {
    /// Takes writes, alone until [`Node::make_synchronous`] names its
    /// synchronous standby.
    Primary,
    /// Replays what the primary on port `upstream` streams to it, under
    /// the node's own name; with no upstream, only the WAL it holds (a
    /// read-only look at what it has).
    Standby { upstream: Option<u16> },
}

/// One cluster: its data directory, port and (while running) postmaster.
pub struct Node {
    /// Its `application_name` as a standby, and `cluster_name`.
    pub name: &'static str,
    pub port: u16,
    data: PathBuf,
    dir: PathBuf,
    tools: Tools,
    postmaster: Option<Child>,
    starts: usize,
}

impl Node {
    fn new(name: &'static str, dir: &Path, tools: &Tools) -> Self {
        Self {
            name,
            port: free_port(),
            data: dir.join(name),
            dir: dir.to_owned(),
            tools: tools.clone(),
            postmaster: None,
            starts: 0,
        }
    }

    /// The URL of `database` on this node alone.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    pub fn connect(&self, database: &str) -> PgConnection {
        PgConnection::establish(&self.url(database))
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.name))
    }

    /// Runs `sql` (statements without results) on `database`.
    pub fn execute(&self, database: &str, sql: &str) {
        self.connect(database)
            .batch_execute(sql)
            .unwrap_or_else(|e| panic!("{sql} on {}: {e}", self.name));
    }

    /// Starts the postmaster as `role` and waits until it takes
    /// connections (a standby: once its replay is consistent).
    pub fn start(&mut self, role: Role) {
        assert!(self.postmaster.is_none(), "{} is running", self.name);
        self.write_role(role);
        self.starts += 1;
        let log = self.dir.join(format!("{}-{}.log", self.name, self.starts));
        let settings = [
            "listen_addresses=127.0.0.1".to_owned(),
            format!("port={}", self.port),
            "unix_socket_directories=".to_owned(),
            format!("cluster_name={}", self.name),
            "fsync=off".to_owned(),
            "wal_level=replica".to_owned(),
            // pg_rewind needs hint bits logged (or data checksums), and
            // the WAL back to the last checkpoint the two had in common.
            "wal_log_hints=on".to_owned(),
            "wal_keep_size=256MB".to_owned(),
            "synchronous_commit=on".to_owned(),
            "max_connections=60".to_owned(),
            "shared_buffers=16MB".to_owned(),
        ];
        let mut command = self.tools.command("postgres", &self.dir);
        command.arg("-D").arg(&self.data);
        for setting in &settings {
            command.arg("-c").arg(setting);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start postgres");
        self.postmaster = Some(child);
        self.wait_accepting(&log);
    }

    /// Writes the settings of `role` where the next start reads them.
    fn write_role(&self, role: Role) {
        let (upstream, signal) = match role {
            Role::Primary => (None, false),
            Role::Standby { upstream } => (upstream, true),
        };
        let mut conf = "synchronous_standby_names = ''\n".to_owned();
        if let Some(port) = upstream {
            conf.push_str(&format!(
                "primary_conninfo = 'host=127.0.0.1 port={port} user=postgres application_name={}'\n",
                self.name
            ));
        }
        self.write_owned("postgresql.auto.conf", &conf);
        let signal_file = self.data.join("standby.signal");
        if signal {
            self.write_owned("standby.signal", "");
        } else if signal_file.exists() {
            std::fs::remove_file(signal_file).unwrap();
        }
    }

    fn write_owned(&self, name: &str, text: &str) {
        let path = self.data.join(name);
        std::fs::write(&path, text).unwrap();
        std::os::unix::fs::chown(&path, Some(self.tools.uid), Some(self.tools.gid)).unwrap();
    }

    fn wait_accepting(&mut self, log: &Path) {
        let deadline = Instant::now() + STEP;
        loop {
            if PgConnection::establish(&self.url("postgres")).is_ok() {
                return;
            }
            let exited = self.postmaster.as_mut().unwrap().try_wait().unwrap();
            if exited.is_some() || Instant::now() > deadline {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                panic!(
                    "{} did not take connections (exit: {exited:?}):\n{log}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// `kill -9` of the postmaster (reaped at once); its backends notice
    /// and exit on their own, without answering what they were doing.
    pub fn kill_postmaster(&mut self) {
        let mut postmaster = self.postmaster.take().expect("running");
        postmaster.kill().unwrap();
        postmaster.wait().unwrap();
    }

    /// Waits until no process is left in this node's data directory (the
    /// backends a killed postmaster left behind), so it can start again.
    pub fn wait_until_gone(&self) {
        let data = self.data.canonicalize().unwrap();
        let deadline = Instant::now() + STEP;
        loop {
            let left = std::fs::read_dir("/proc")
                .unwrap()
                .filter_map(|entry| std::fs::read_link(entry.ok()?.path().join("cwd")).ok())
                .filter(|cwd| *cwd == data)
                .count();
            if left == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{left} processes of {} outlived its postmaster",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A fast shutdown (SIGINT), waited for.
    pub fn stop(&mut self) {
        let mut postmaster = self.postmaster.take().expect("running");
        signal(postmaster.id(), "INT");
        wait_bounded(&mut postmaster, &format!("the shutdown of {}", self.name));
    }

    /// `pg_ctl promote`: the standby ends recovery and takes writes.
    pub fn promote(&self) {
        let mut command = self.tools.command("pg_ctl", &self.dir);
        command
            .args(["promote", "-w", "-t", "20", "-D"])
            .arg(&self.data);
        self.tools.run(command, &self.dir, "pg_ctl promote");
    }

    /// `pg_rewind` from `source` (running): this node's data directory,
    /// stopped, is made a copy of the source's history, dropping what it
    /// wrote that the source never had. What pg_rewind said of the
    /// divergence.
    pub fn rewind_from(&self, source: &Node) -> String {
        let mut command = self.tools.command("pg_rewind", &self.dir);
        command
            .arg("-D")
            .arg(&self.data)
            .arg(format!(
                "--source-server=host=127.0.0.1 port={} user=postgres dbname=postgres",
                source.port
            ))
            .arg("--no-sync");
        let output = self.tools.run(command, &self.dir, "pg_rewind");
        output
            .lines()
            .filter(|line| {
                line.contains("diverged") || line.contains("no rewind") || line.contains("Done")
            })
            .map(|line| line.trim_start_matches("pg_rewind: "))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The pid of the WAL sender streaming to the standby called `name`.
    pub fn wal_sender_pid(&self, name: &str) -> u32 {
        let pid: Option<i32> = diesel::select(diesel::dsl::sql::<
            diesel::sql_types::Nullable<diesel::sql_types::Integer>,
        >(&format!(
            "(SELECT pid FROM pg_stat_replication WHERE application_name = '{name}')"
        )))
        .get_result(&mut self.connect("postgres"))
        .unwrap();
        pid.unwrap_or_else(|| panic!("{} streams to no {name}", self.name)) as u32
    }

    /// Makes the standby called `name` this primary's synchronous standby
    /// (`synchronous_standby_names`, set with `ALTER SYSTEM` and reloaded),
    /// and waits until it is.
    pub fn make_synchronous(&self, name: &str) {
        self.execute(
            "postgres",
            &format!("ALTER SYSTEM SET synchronous_standby_names = '{name}'"),
        );
        self.execute("postgres", "SELECT pg_reload_conf()");
        self.wait_for_synchronous(name);
    }

    /// Waits until the standby called `name` is this primary's
    /// synchronous standby.
    fn wait_for_synchronous(&self, name: &str) {
        let deadline = Instant::now() + STEP;
        let query = format!(
            "EXISTS (SELECT 1 FROM pg_stat_replication \
             WHERE application_name = '{name}' AND sync_state = 'sync' AND state = 'streaming')"
        );
        while !diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(&query))
            .get_result::<bool>(&mut self.connect("postgres"))
            .unwrap()
        {
            assert!(
                Instant::now() < deadline,
                "{name} never became {}'s synchronous standby",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Sends `kill -SIGNAL pid`.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

impl Drop for Node {
    /// An immediate shutdown (SIGQUIT), then SIGKILL if it lingers.
    fn drop(&mut self) {
        if let Some(mut postmaster) = self.postmaster.take() {
            // Not `signal`: a panic while the test unwinds would abort.
            let _ = Command::new("kill")
                .args(["-QUIT", &postmaster.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while postmaster.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = postmaster.kill();
            let _ = postmaster.wait();
        }
    }
}

/// Two nodes: `node1` made by `initdb` and started as the primary, with
/// `database` in it; `node2` made from it by `pg_basebackup` and started
/// as its synchronous standby (`synchronous_standby_names = 'node2'`).
pub struct Pair {
    pub node1: Node,
    pub node2: Node,
    /// Dropped after the nodes: their postmasters stop first.
    _dir: tempfile::TempDir,
}

impl Pair {
    pub fn start(tools: &Tools, database: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("onejob-failover-")
            .tempdir()
            .unwrap();
        std::os::unix::fs::chown(dir.path(), Some(tools.uid), Some(tools.gid)).unwrap();
        let mut node1 = Node::new("node1", dir.path(), tools);
        let mut node2 = Node::new("node2", dir.path(), tools);
        let mut initdb = tools.command("initdb", dir.path());
        initdb
            .arg("-D")
            .arg(&node1.data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .arg("--locale=C");
        tools.run(initdb, dir.path(), "initdb");
        // Alone at first: with a synchronous standby named and none there
        // yet, every commit would wait.
        node1.start(Role::Primary);
        node1.execute("postgres", &format!("CREATE DATABASE {database}"));
        let mut backup = tools.command("pg_basebackup", dir.path());
        backup
            .args(["-h", "127.0.0.1", "-p", &node1.port.to_string()])
            .args([
                "-U",
                "postgres",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
                "-D",
            ])
            .arg(&node2.data);
        tools.run(backup, dir.path(), "pg_basebackup");
        node2.start(Role::Standby {
            upstream: Some(node1.port),
        });
        node1.make_synchronous(node2.name);
        Self {
            node1,
            node2,
            _dir: dir,
        }
    }
}
