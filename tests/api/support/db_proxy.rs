//! A TCP proxy between onejob and PostgreSQL that reads the frontend side
//! of the wire protocol, so a test can stage the faults a network puts
//! between a process and its database:
//!
//! - [`DbProxy::lose_commit_reply`]: the `COMMIT` of the next transaction
//!   that ran a chosen statement is forwarded, the server's reply to it is
//!   read (so the commit happened) and dropped, and the connection is cut.
//!   onejob sees a broken connection where its commit's answer should be:
//!   the database committed, onejob cannot know it.
//! - [`DbProxy::partition_after_commit`]: the same transaction's commit
//!   goes up and the process is partitioned at once, its reply held with
//!   everything else until the heal.
//! - [`DbProxy::partition`] and [`DbProxy::heal`]: every byte in either
//!   direction, on open and new connections, is held (not lost) until the
//!   partition heals, when it all goes through: the process hangs on its
//!   database calls meanwhile, and its stale writes arrive afterwards. A
//!   session the server ends meanwhile (idle in transaction, say) reaches
//!   the process as closed only at the heal, as across a real partition.
//!
//! The proxy speaks only as much of the protocol as it needs: the startup
//! packet (an `SSLRequest` or `GSSENCRequest` is refused with `N`, as a
//! server without TLS does), then typed messages (`Q` simple queries,
//! `P` parses naming a statement's text, `B` binds naming the statement).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};

/// The startup codes a client sends before its real startup packet.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
/// No protocol message a test sends comes near this (a bound on what a
/// length prefix may ask the proxy to buffer).
const MAX_MESSAGE: usize = 64 << 20;

/// A trap, armed: it trips on the first transaction whose statements
/// include one containing `statement`.
#[derive(Debug, Clone)]
struct CommitTrap {
    statement: String,
    then: AfterCommit,
}

/// What a tripped trap does once the transaction's commit has gone up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterCommit {
    /// Drops the server's reply and cuts the connection.
    LoseReply,
    /// Partitions the process at once: the reply, and everything after
    /// it, waits for [`DbProxy::heal`].
    Partition,
}

#[derive(Default)]
struct TrapState {
    armed: Option<CommitTrap>,
    /// The trapped transaction's statements, from its `COMMIT` going up
    /// until the server's reply to it came (and was dropped).
    committing: Option<Vec<String>>,
    /// The index in `tripped` the last armed trap will take.
    awaited: usize,
    /// The statements of each transaction whose commit reply was dropped,
    /// in order.
    tripped: Vec<Vec<String>>,
}

struct Shared {
    trap: Mutex<TrapState>,
    /// `true` while partitioned.
    held: watch::Sender<bool>,
    tripped: tokio::sync::Notify,
}

impl Shared {
    fn trap(&self) -> std::sync::MutexGuard<'_, TrapState> {
        self.trap.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The trapped transaction's commit is done with: it counts as tripped.
    fn trip(&self) {
        let mut trap = self.trap();
        if let Some(statements) = trap.committing.take() {
            trap.tripped.push(statements);
        }
        drop(trap);
        self.tripped.notify_waiters();
    }
}

/// The proxy, on a free port of 127.0.0.1, for one PostgreSQL server.
pub struct DbProxy {
    /// `host:port` to connect to instead of the server.
    pub address: SocketAddr,
    shared: Arc<Shared>,
    server: AbortHandle,
}

impl DbProxy {
    /// Starts a proxy in front of the server of `url`
    /// (`postgres://user@host:port/db`).
    pub async fn start(url: &str) -> Self {
        let upstream = upstream_of(url);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (held, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            trap: Mutex::default(),
            held,
            tripped: tokio::sync::Notify::new(),
        });
        let accept = {
            let shared = shared.clone();
            async move {
                // Dropping the set (the loop aborted) closes every
                // connection.
                let mut connections = JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    let (shared, upstream) = (shared.clone(), upstream.clone());
                    connections.spawn(async move {
                        let Ok(server) = TcpStream::connect(&upstream).await else {
                            return;
                        };
                        let _ = relay(client, server, shared).await;
                    });
                    while connections.try_join_next().is_some() {}
                }
            }
        };
        let server = tokio::spawn(accept).abort_handle();
        Self {
            address,
            shared,
            server,
        }
    }

    /// `url` with its host and port replaced by the proxy's.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let user = authority
            .rsplit_once('@')
            .map(|(user, _)| format!("{user}@"))
            .unwrap_or_default();
        format!("{scheme}://{user}{}/{path}", self.address)
    }

    /// Arms a lost commit reply: the next transaction that runs a statement
    /// containing `statement` (compared [`normalized`]) commits, and its connection breaks before
    /// the reply to `COMMIT` reaches the client. One transaction only.
    pub fn lose_commit_reply(&self, statement: &str) {
        self.arm(statement, AfterCommit::LoseReply);
    }

    /// Arms a partition that starts the moment the next transaction that
    /// runs a statement containing `statement` sends its commit: the
    /// database commits, and the reply is held with everything else until
    /// [`DbProxy::heal`]. [`DbProxy::tripped`] returns once the commit has
    /// gone up.
    pub fn partition_after_commit(&self, statement: &str) {
        self.arm(statement, AfterCommit::Partition);
    }

    fn arm(&self, statement: &str, then: AfterCommit) {
        let mut trap = self.shared.trap();
        trap.armed = Some(CommitTrap {
            statement: normalized(statement),
            then,
        });
        trap.awaited = trap.tripped.len();
    }

    /// Waits (bounded) until the last armed trap has tripped: its
    /// transaction committed and the reply was dropped. Returns the
    /// transaction's statements.
    pub async fn tripped(&self, within: std::time::Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.shared.tripped.notified();
            {
                let trap = self.shared.trap();
                if let Some(statements) = trap.tripped.get(trap.awaited) {
                    return statements.clone();
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("no transaction committed through the armed trap within {within:?}");
            }
        }
    }

    /// Cuts the process off: from now every byte, either way, on every
    /// connection, is held until [`DbProxy::heal`].
    pub fn partition(&self) {
        self.shared.held.send_replace(true);
    }

    /// Ends the partition: what was held goes through, in order.
    pub fn heal(&self) {
        self.shared.held.send_replace(false);
    }
}

impl Drop for DbProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// `host:port` of a `postgres://` URL.
fn upstream_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    }
}

/// Waits while the proxy holds traffic.
async fn pass_when_open(held: &mut watch::Receiver<bool>) {
    let _ = held.wait_for(|held| !*held).await;
}

/// One client connection: the startup exchange, then both directions.
async fn relay(
    mut client: TcpStream,
    server: TcpStream,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let startup = read_startup(&mut client).await?;
    let (mut server_read, mut server_write) = server.into_split();
    server_write.write_all(&startup).await?;
    let (mut client_read, mut client_write) = client.into_split();
    // Set (before the trapped message goes up) when this connection's
    // commit reply is to be dropped.
    let (cut, mut cut_seen) = watch::channel(false);
    let upstream = {
        let shared = shared.clone();
        async move {
            let mut session = Session::default();
            let mut held = shared.held.subscribe();
            loop {
                let message = read_message(&mut client_read).await?;
                pass_when_open(&mut held).await;
                let trips = session.observe(&message, &shared);
                match trips {
                    Some(AfterCommit::LoseReply) => {
                        cut.send_replace(true);
                        server_write.write_all(&message).await?;
                        // Nothing more goes up this connection.
                        std::future::pending::<()>().await;
                    }
                    Some(AfterCommit::Partition) => {
                        // Held before the commit goes up: its reply too.
                        shared.held.send_replace(true);
                        server_write.write_all(&message).await?;
                        shared.trip();
                    }
                    None => server_write.write_all(&message).await?,
                }
            }
        }
    };
    // The server's messages, whole, through a channel: reading them is
    // never cut off halfway. When the server closes, what it sent before
    // goes down first and then the close, both when no partition holds
    // them: the downstream half ends the connection once the channel is
    // drained and closed.
    let (replies, mut from_server) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let reader = async move {
        while let Ok(message) = read_message(&mut server_read).await {
            if replies.send(message).await.is_err() {
                break;
            }
        }
        drop(replies);
        std::future::pending::<std::io::Result<()>>().await
    };
    let downstream = {
        let shared = shared.clone();
        async move {
            let mut held = shared.held.subscribe();
            loop {
                tokio::select! {
                    biased;
                    _ = async { let _ = cut_seen.wait_for(|cut| *cut).await; } => {
                        // The commit went up: wait for the server's
                        // `ReadyForQuery` after it (the commit is then
                        // durable), and drop the reply.
                        while let Some(message) = from_server.recv().await {
                            if message[0] == b'Z' {
                                break;
                            }
                        }
                        shared.trip();
                        return Ok::<(), std::io::Error>(());
                    }
                    message = from_server.recv() => {
                        let Some(message) = message else {
                            pass_when_open(&mut held).await;
                            return Ok(());
                        };
                        pass_when_open(&mut held).await;
                        client_write.write_all(&message).await?;
                    }
                }
            }
        }
    };
    // Either side ending ends the connection: both halves drop, and the
    // client sees its connection closed.
    tokio::select! {
        result = upstream => result,
        result = reader => result,
        result = downstream => result,
    }
}

/// What the proxy knows of one connection's session: the text of each
/// prepared statement, whether a transaction is open, and the statements
/// run since it began (or, outside one, since the last `Sync`).
#[derive(Default)]
struct Session {
    prepared: HashMap<String, String>,
    in_transaction: bool,
    statements: Vec<String>,
}

impl Session {
    /// Notes one frontend message; `true` when it ends the transaction an
    /// armed trap waits for: an explicit `COMMIT`, or, outside a
    /// transaction, the simple query or `Sync` whose implicit commit makes
    /// the statement durable. The trap is then spent.
    fn observe(&mut self, message: &[u8], shared: &Shared) -> Option<AfterCommit> {
        let body = &message[5..];
        match message[0] {
            b'Q' => {
                let text = c_string(body).0;
                let command = text.trim().trim_end_matches(';').to_ascii_uppercase();
                if command.starts_with("BEGIN") {
                    self.in_transaction = true;
                    self.statements.clear();
                } else if command == "COMMIT" {
                    self.in_transaction = false;
                    return self.end_transaction(shared);
                } else if command == "ROLLBACK" {
                    self.in_transaction = false;
                    self.statements.clear();
                } else {
                    self.statements.push(text);
                    if !self.in_transaction {
                        return self.end_transaction(shared);
                    }
                }
            }
            b'P' => {
                let (name, rest) = c_string(body);
                let (text, _) = c_string(rest);
                self.prepared.insert(name, text);
            }
            b'B' => {
                let (_portal, rest) = c_string(body);
                let (name, _) = c_string(rest);
                if let Some(text) = self.prepared.get(&name) {
                    self.statements.push(text.clone());
                }
            }
            b'S' if !self.in_transaction => return self.end_transaction(shared),
            _ => {}
        }
        None
    }

    /// The transaction's statements are committed by the message being
    /// observed: what the armed trap does, if it takes them.
    fn end_transaction(&mut self, shared: &Shared) -> Option<AfterCommit> {
        let statements = std::mem::take(&mut self.statements);
        let mut trap = shared.trap();
        let armed = trap.armed.as_ref()?;
        if !statements
            .iter()
            .any(|s| normalized(s).contains(&armed.statement))
        {
            return None;
        }
        let then = armed.then;
        trap.armed = None;
        trap.committing = Some(statements);
        Some(then)
    }
}

/// A statement's text as the trap compares it: lower case, without the
/// quotes around identifiers, each run of white space one space.
fn normalized(statement: &str) -> String {
    statement
        .to_lowercase()
        .replace('"', "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A NUL-terminated string at the start of `bytes`, and what follows it.
fn c_string(bytes: &[u8]) -> (String, &[u8]) {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let rest = bytes.get(end + 1..).unwrap_or_default();
    (String::from_utf8_lossy(&bytes[..end]).into_owned(), rest)
}

/// The client's startup packet, after refusing any TLS or GSS encryption
/// request before it.
async fn read_startup(client: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    loop {
        let length = client.read_u32().await? as usize;
        if !(8..=MAX_MESSAGE).contains(&length) {
            return Err(std::io::Error::other(
                "a startup packet of no sensible length",
            ));
        }
        let mut packet = vec![0u8; length];
        packet[..4].copy_from_slice(&(length as u32).to_be_bytes());
        client.read_exact(&mut packet[4..]).await?;
        let code = u32::from_be_bytes(packet[4..8].try_into().unwrap());
        if code == SSL_REQUEST || code == GSSENC_REQUEST {
            client.write_all(b"N").await?;
            continue;
        }
        return Ok(packet);
    }
}

/// One typed message: its type byte, length and body, as read.
async fn read_message(from: &mut tokio::net::tcp::OwnedReadHalf) -> std::io::Result<Vec<u8>> {
    let kind = from.read_u8().await?;
    let length = from.read_u32().await? as usize;
    if !(4..=MAX_MESSAGE).contains(&length) {
        return Err(std::io::Error::other("a message of no sensible length"));
    }
    let mut message = Vec::with_capacity(length + 1);
    message.push(kind);
    message.extend_from_slice(&(length as u32).to_be_bytes());
    message.resize(length + 1, 0);
    from.read_exact(&mut message[5..]).await?;
    Ok(message)
}
