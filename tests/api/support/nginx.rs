//! A real nginx (Debian's `nginx-light`) running `deploy/nginx.conf` as
//! shipped, but for what only a deployment fills in: the upstream
//! addresses become the test's processes, and the two public servers listen
//! on free ports of 127.0.0.1 in plain HTTP (no `[::]`, no certificate).
//! Every location, upstream, map and proxy directive is the file's own.
//!
//! The file is an http-context snippet; the test wraps it in a minimal
//! `nginx.conf` of its own (temp paths and logs in a temp dir, one process
//! in the foreground), which adds one thing: `X-Served-By`, the address of
//! the process that answered (`$upstream_addr`), on every response.

use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::server_process::free_port;
use crate::support::harness::in_ci;

/// The header the test's wrapper adds: which upstream answered.
pub const SERVED_BY: &str = "x-served-by";

/// The shipped file's placeholder addresses, in the order of its upstreams.
const PLACEHOLDER_UPSTREAMS: [&str; 3] = ["10.0.0.11:8080", "10.0.0.12:8080", "10.0.0.13:8080"];

/// The nginx binary: on `PATH`, or where Debian installs it.
fn nginx_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
}

/// The nginx binary, if there is one. In CI a missing nginx fails the
/// test; elsewhere the test is skipped with a loud line on stderr.
pub fn nginx_available() -> Option<PathBuf> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = FOUND.get_or_init(nginx_binary);
    match found {
        Some(path) => Some(path.clone()),
        None if in_ci() => panic!(
            "nginx is required in CI for the load balancer tests but is not installed \
             (Debian: apt-get install nginx-light; .ci/run installs it)"
        ),
        None => {
            static WARNED: OnceLock<()> = OnceLock::new();
            WARNED.get_or_init(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "\n!!!!!!!!\n!!! SKIPPING THE LOAD BALANCER TESTS: nginx is not installed \
                     (apt-get install nginx-light). CI never skips.\n!!!!!!!!\n"
                );
            });
            None
        }
    }
}

/// `deploy/nginx.conf` as shipped.
pub fn shipped_config() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nginx.conf");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Replaces every `from` in `text`, insisting that there is one: a test
/// copy that silently kept a placeholder would test something else.
fn replace_all(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "deploy/nginx.conf no longer has {from:?}; update tests/api/support/nginx.rs"
    );
    text.replace(from, to)
}

/// Drops every line that is `line` once trimmed (at least one).
fn drop_lines(text: &str, line: &str) -> String {
    let kept: Vec<&str> = text.lines().filter(|l| l.trim() != line).collect();
    assert!(
        kept.len() < text.lines().count(),
        "deploy/nginx.conf no longer has the line {line:?}; update tests/api/support/nginx.rs"
    );
    kept.join("\n") + "\n"
}

/// The test copy of `shipped`: the upstreams are `upstreams`, the HTTPS
/// server listens in plain HTTP on `127.0.0.1:port`, the redirecting one
/// on `127.0.0.1:redirect_port`.
pub fn test_copy(shipped: &str, upstreams: &[String; 3], port: u16, redirect_port: u16) -> String {
    let mut text = shipped.to_owned();
    for (placeholder, address) in PLACEHOLDER_UPSTREAMS.iter().zip(upstreams) {
        text = replace_all(&text, placeholder, address);
    }
    text = replace_all(
        &text,
        "listen 443 ssl;",
        &format!("listen 127.0.0.1:{port};"),
    );
    text = replace_all(
        &text,
        "listen 80;",
        &format!("listen 127.0.0.1:{redirect_port};"),
    );
    for line in ["listen [::]:443 ssl;", "listen [::]:80;"] {
        text = drop_lines(&text, line);
    }
    let certificates: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("ssl_certificate"))
        .collect();
    assert_eq!(certificates.len(), 2, "the certificate and its key");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("ssl_certificate"))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The wrapper around the snippet: what Debian's `/etc/nginx/nginx.conf`
/// would be, kept to the test's temp dir, plus [`SERVED_BY`].
fn main_config(dir: &Path) -> String {
    let dir = dir.display();
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{
    worker_connections 1024;
}}
http {{
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    access_log {dir}/access.log;
    # The test's own: which process answered (the last one tried).
    add_header X-Served-By $upstream_addr always;
    include {dir}/onejob.conf;
}}
"#
    )
}

/// nginx with the test copy of `deploy/nginx.conf`, written to a temp dir.
pub struct Nginx {
    /// `http://127.0.0.1:PORT`: the HTTPS server of the file, in plain HTTP.
    pub base: String,
    binary: PathBuf,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Nginx {
    /// Writes the configuration for `upstreams` (`127.0.0.1:PORT` each);
    /// starts nothing.
    pub fn configure(binary: PathBuf, upstreams: &[String; 3]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // Readable by whatever user nginx's process may take.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let port = free_port();
        let snippet = test_copy(&shipped_config(), upstreams, port, free_port());
        std::fs::write(dir.path().join("onejob.conf"), snippet).unwrap();
        std::fs::write(dir.path().join("nginx.conf"), main_config(dir.path())).unwrap();
        Self {
            base: format!("http://127.0.0.1:{port}"),
            binary,
            dir,
            child: None,
        }
    }

    /// The command line every run shares: prefix, configuration, error log.
    fn command(&self) -> Command {
        let dir = self.dir.path();
        let mut command = Command::new(&self.binary);
        command
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(dir.join("error.log"));
        command
    }

    /// `nginx -t` on the configuration: whether it passed, and what nginx
    /// said.
    pub fn check(&self) -> (bool, String) {
        let output = self.command().arg("-t").output().expect("run nginx -t");
        let said = String::from_utf8_lossy(&output.stderr).into_owned()
            + &String::from_utf8_lossy(&output.stdout);
        (output.status.success(), said)
    }

    /// Starts nginx and waits (at most 10 s) until it accepts connections.
    pub fn start(&mut self) {
        let child = self
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        self.child = Some(child);
        let address = self.base.trim_start_matches("http://").to_owned();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&address).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("nginx exited with {status}:\n{}", self.error_log());
            }
            assert!(
                Instant::now() < deadline,
                "nginx did not listen in 10 s:\n{}",
                self.error_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// nginx's error log so far.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// The URL of `path` through nginx.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// The upstream that answered `response` (`127.0.0.1:PORT`): the last
/// address of [`SERVED_BY`], which lists every one tried.
pub fn served_by(response: &reqwest::Response) -> String {
    let tried = response
        .headers()
        .get(SERVED_BY)
        .unwrap_or_else(|| panic!("no {SERVED_BY} on {response:?}"))
        .to_str()
        .unwrap();
    tried.rsplit(", ").next().unwrap().trim().to_owned()
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
