//! Distribution by owner (docs/scaling.md): where each table goes on Citus,
//! the rule every statement keeps so that Citus can route it, and the
//! conversion of a migrated PostgreSQL database into distributed tables.
//!
//! The statement rule, for the tables distributed by `owner_id`:
//!
//! - a statement that reads with a lock (`FOR UPDATE`, `FOR SHARE`),
//!   updates or deletes names its owner with an equality (`owner_id = $n`),
//!   so it runs on one shard: Citus refuses locks across shards;
//! - no volatile function (`clock_timestamp()`, `random()` …) is evaluated
//!   inside an UPDATE or DELETE: Citus refuses them there, since each shard
//!   would evaluate its own; the database's clock is read with
//!   `statement_timestamp()`, which Citus evaluates once, on the
//!   coordinator;
//! - a read that names no owner fans out to every shard, and is allowed
//!   only if it is one of the [`FAN_OUT_READS`], each with its reason.

use std::sync::OnceLock;

/// Where each table goes when the database is distributed.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Distributed by `owner_id` and colocated: one owner's rows together.
    pub distributed: &'static [&'static str],
    /// Small tables with a copy on every node.
    pub reference: &'static [&'static str],
    /// Tables only the coordinator has.
    pub local: &'static [&'static str],
}

/// onejob's layout; a new table must be placed here (the schema rule test
/// fails otherwise) and in docs/scaling.md.
pub const LAYOUT: Layout = Layout {
    distributed: &[
        "jobs",
        "attempts",
        "race_log",
        "audit_log",
        "stream_chunks",
        "webhook_endpoints",
        "webhook_events",
        "webhook_deliveries",
        "usage_ledger",
        "budgets",
        "budget_reservations",
        "usage_tallies",
    ],
    reference: &[
        "users",
        "api_tokens",
        "sessions",
        "sign_in_throttle",
        "qualifications",
    ],
    local: &["__diesel_schema_migrations", "backlog_samples"],
};

/// The column the distributed tables are distributed by.
pub const DISTRIBUTION_COLUMN: &str = "owner_id";

impl Layout {
    pub fn is_distributed(&self, table: &str) -> bool {
        self.distributed.contains(&table)
    }

    /// In how many of the lists `table` is placed (exactly one, or the
    /// layout is wrong).
    pub fn placements(&self, table: &str) -> usize {
        [self.distributed, self.reference, self.local]
            .iter()
            .filter(|list| list.contains(&table))
            .count()
    }
}

/// A read that names no owner and so runs on every shard, by design.
#[derive(Debug, Clone, Copy)]
pub struct FanOutRead {
    /// What it is for (docs/scaling.md lists the same).
    pub purpose: &'static str,
    /// Text that only this statement contains (compared after
    /// [`normalize`]).
    pub marker: &'static str,
}

/// The reads allowed to fan out. Each is a page a few staff members open,
/// a background scan that takes no lock, or a look-up by an id that comes
/// with no owner (a callback URL, a staff action), after which every
/// statement names the owner.
pub const FAN_OUT_READS: &[FanOutRead] = &[
    FanOutRead {
        purpose: "the claim's candidates (no lock; each owner's are then locked and claimed)",
        marker: "attempts.not_before is null or attempts.not_before <=",
    },
    FanOutRead {
        purpose: "the reaper's expired leases (no lock; each is reaped by its owner)",
        marker: "select attempts.id, attempts.job_id, attempts.owner_id from attempts where ((attempts.state = $1) and (attempts.lease_expires_at <",
    },
    FanOutRead {
        purpose: "retention's finished jobs (no lock; each owner's are then locked and deleted)",
        marker: "select j.id, j.owner_id from jobs j where j.id > $1",
    },
    FanOutRead {
        purpose: "retention's old race-log entries (no lock; deleted per owner)",
        marker: "select id, owner_id from race_log where lost_at <",
    },
    FanOutRead {
        purpose: "retention's old audit entries (no lock; deleted per owner)",
        marker: "select id, owner_id from audit_log where at <",
    },
    FanOutRead {
        purpose: "the webhook claim's candidates (no lock; each owner's are then locked and claimed)",
        marker: "select webhook_events.id, webhook_events.owner_id from (webhook_events inner join webhook_endpoints on",
    },
    FanOutRead {
        purpose: "the webhook outbox's oldest undelivered event (a metric)",
        marker: "select webhook_events.window_start_at from (webhook_events inner join webhook_endpoints on",
    },
    FanOutRead {
        purpose: "the count of disabled webhook endpoints (a metric)",
        marker: "from webhook_endpoints where (webhook_endpoints.enabled = $1)",
    },
    FanOutRead {
        purpose: "every owner's webhook endpoints (admins)",
        marker: "from webhook_endpoints order by webhook_endpoints.id desc limit",
    },
    FanOutRead {
        purpose: "an attempt by its id alone (a callback's URL, a staff action)",
        marker: "from attempts where (attempts.id = $1) limit",
    },
    FanOutRead {
        purpose: "a job by its id alone (staff opening any owner's job)",
        marker: "from jobs where (jobs.id = $1) limit",
    },
    FanOutRead {
        purpose: "the console: the unknown queue",
        marker: "where (attempts.state = $1) order by attempts.started_at asc, attempts.id asc",
    },
    FanOutRead {
        purpose: "the console: the counts on its front page",
        marker: "from attempts where (attempts.state = $1)",
    },
    FanOutRead {
        purpose: "the console: the race log",
        marker: "from race_log where (race_log.lost_at >= $1)",
    },
    FanOutRead {
        purpose: "the console: the race log's attempts",
        marker: "from attempts where (attempts.id = any($1))",
    },
    FanOutRead {
        purpose: "the console: the audit log",
        marker: "from (audit_log inner join users on (audit_log.actor_id = users.id)) order by",
    },
    FanOutRead {
        purpose: "the console's chart of jobs by status (a range of job ids, no lock)",
        marker: "from jobs t where t.id >= $1 and t.id < $2 group by",
    },
    FanOutRead {
        purpose: "the console's chart of races per hour (a range of lost_at, no lock)",
        marker: "from race_log t where t.lost_at >= $1 and t.lost_at < $2 group by",
    },
    FanOutRead {
        purpose: "the console's chart of spend per day (a range of recorded_at, no lock)",
        marker: "from usage_ledger t where t.recorded_at >= $1 and t.recorded_at < $2 group by",
    },
    FanOutRead {
        purpose: "the usage report's ledger sums (a range of recorded_at; an owner's own report names them)",
        marker: "from usage_ledger t join users u on u.id = t.owner_id where t.recorded_at >= $1",
    },
    FanOutRead {
        purpose: "the usage report's duplicates and refusals (a range of days; the ledger joined per job and owner)",
        marker: "from usage_tallies t join users u on u.id = t.owner_id left join (",
    },
    FanOutRead {
        purpose: "every owner's budget (admins)",
        marker: "from budgets order by budgets.owner_id asc limit",
    },
    FanOutRead {
        purpose: "the console: job search across owners",
        marker: "from (jobs inner join users on (jobs.owner_id = users.id))",
    },
];

/// What the rule says about one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It touches no distributed table.
    Unrelated,
    /// It names an owner: one shard.
    Routed,
    /// An insert: Citus routes it by the values inserted.
    Insert,
    /// A listed read across every shard.
    FanOut(&'static str),
    /// It breaks the rule.
    Refused(Breach),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breach {
    /// Reads with a lock but names no owner.
    LockAcrossShards,
    /// Updates or deletes but names no owner.
    WriteAcrossShards,
    /// Evaluates a volatile function inside an UPDATE or DELETE.
    VolatileInWrite,
    /// Reads across every shard and is not one of the listed reads.
    UnlistedFanOut,
}

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::LockAcrossShards => "reads with a lock without naming its owner (owner_id = $n)",
            Self::WriteAcrossShards => {
                "updates or deletes without naming its owner (owner_id = $n)"
            }
            Self::VolatileInWrite => "evaluates a volatile function inside an UPDATE or DELETE",
            Self::UnlistedFanOut => {
                "reads across every shard and is not one of store::distribution::FAN_OUT_READS"
            }
        })
    }
}

/// Functions PostgreSQL marks volatile that onejob could reach for.
const VOLATILE: &[&str] = &[
    "clock_timestamp(",
    "timeofday(",
    "random(",
    "gen_random_uuid(",
    "uuid_generate",
    "nextval(",
    "setval(",
    "txid_current(",
];

/// SQL as the rule reads it: lower case, identifiers unquoted, one space
/// for any run of white space, diesel's bind list cut off.
pub fn normalize(sql: &str) -> String {
    let sql = sql.split(" -- binds:").next().unwrap_or(sql);
    let mut out = String::with_capacity(sql.len());
    let mut space = false;
    for c in sql.chars() {
        if c == '"' {
            continue;
        }
        if c.is_whitespace() {
            space = true;
            continue;
        }
        if space && !out.is_empty() {
            out.push(' ');
        }
        space = false;
        out.extend(c.to_lowercase());
    }
    out
}

struct Patterns {
    touches: Vec<String>,
    writes: Vec<String>,
}

fn patterns() -> &'static Patterns {
    static PATTERNS: OnceLock<Patterns> = OnceLock::new();
    PATTERNS.get_or_init(|| Patterns {
        touches: LAYOUT
            .distributed
            .iter()
            .flat_map(|t| {
                [
                    "from ", "from (", "from ((", "from (((", "join ", "update ", "into ",
                ]
                .into_iter()
                .map(move |word| format!("{word}{t}"))
            })
            .collect(),
        writes: LAYOUT
            .distributed
            .iter()
            .flat_map(|t| [format!("update {t}"), format!("delete from {t}")])
            .collect(),
    })
}

/// Whether `sql` contains `pattern` followed by the end of a word.
fn has_word(sql: &str, pattern: &str) -> bool {
    sql.match_indices(pattern).any(|(at, _)| {
        let before = sql[..at].chars().next_back();
        let after = sql[at + pattern.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Whether the statement pins an owner: `owner_id = $n` or `owner_id = '…'`
/// (`= ANY(…)` names several owners and does not count).
fn names_an_owner(sql: &str) -> bool {
    sql.match_indices(DISTRIBUTION_COLUMN).any(|(at, _)| {
        let rest = sql[at + DISTRIBUTION_COLUMN.len()..].trim_start();
        let Some(value) = rest.strip_prefix('=') else {
            return false;
        };
        let value = value.trim_start();
        value.starts_with('$') || value.starts_with('\'') || value.starts_with('?')
    })
}

/// Judges one statement by the rule.
pub fn judge(sql: &str) -> Verdict {
    let sql = normalize(sql);
    let patterns = patterns();
    if !patterns.touches.iter().any(|p| has_word(&sql, p)) {
        return Verdict::Unrelated;
    }
    let writes = patterns.writes.iter().any(|p| has_word(&sql, p));
    let locks = [
        " for update",
        " for share",
        " for no key update",
        " for key share",
    ]
    .iter()
    .any(|p| sql.contains(p));
    let owner = names_an_owner(&sql);
    if writes && VOLATILE.iter().any(|f| sql.contains(f)) {
        return Verdict::Refused(Breach::VolatileInWrite);
    }
    if owner {
        return Verdict::Routed;
    }
    if writes {
        return Verdict::Refused(Breach::WriteAcrossShards);
    }
    if locks {
        return Verdict::Refused(Breach::LockAcrossShards);
    }
    if sql.starts_with("insert ") || sql.starts_with("with ") && sql.contains(" insert into ") {
        return Verdict::Insert;
    }
    match FAN_OUT_READS.iter().find(|read| sql.contains(read.marker)) {
        Some(read) => Verdict::FanOut(read.purpose),
        None => Verdict::Refused(Breach::UnlistedFanOut),
    }
}

/// Whether an `ALTER TABLE` statement on a distributed table has more than
/// one subcommand, which Citus refuses (`cannot execute ADD CONSTRAINT
/// command with other subcommands`).
pub fn alters_with_several_subcommands(statement: &str) -> bool {
    let sql = normalize(statement);
    let Some(rest) = sql.strip_prefix("alter table ") else {
        return false;
    };
    let rest = rest
        .trim_start_matches("if exists ")
        .trim_start_matches("only ");
    let table = rest.split([' ', '(']).next().unwrap_or_default();
    if !LAYOUT.is_distributed(table) {
        return false;
    }
    // Commas outside parentheses separate subcommands.
    let mut depth = 0usize;
    rest.chars().any(|c| {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => return true,
            _ => {}
        }
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_or_a_write_must_name_its_owner() {
        assert_eq!(
            judge(r#"SELECT "jobs"."id" FROM "jobs" WHERE "jobs"."id" = $1 FOR UPDATE"#),
            Verdict::Refused(Breach::LockAcrossShards)
        );
        assert_eq!(
            judge(
                r#"SELECT "jobs"."id" FROM "jobs" WHERE "jobs"."id" = $1 AND "jobs"."owner_id" = $2 FOR UPDATE"#
            ),
            Verdict::Routed
        );
        assert_eq!(
            judge(r#"UPDATE "attempts" SET "state" = $1 WHERE "attempts"."id" = $2"#),
            Verdict::Refused(Breach::WriteAcrossShards)
        );
        assert_eq!(
            judge("DELETE FROM attempts WHERE owner_id = ANY($1)"),
            Verdict::Refused(Breach::WriteAcrossShards)
        );
        assert_eq!(
            judge("DELETE FROM race_log WHERE owner_id = $1 AND id = ANY($2)"),
            Verdict::Routed
        );
    }

    #[test]
    fn a_volatile_function_may_not_be_evaluated_in_a_write() {
        assert_eq!(
            judge(
                "UPDATE attempts SET lease_expires_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT WHERE owner_id = $1"
            ),
            Verdict::Refused(Breach::VolatileInWrite)
        );
        assert_eq!(
            judge(
                "UPDATE attempts SET lease_expires_at = (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT WHERE owner_id = $1"
            ),
            Verdict::Routed
        );
    }

    #[test]
    fn group_commits_multi_row_creation_names_its_owner() {
        assert_eq!(
            judge(&crate::store::jobs::multi_row_creation_statement()),
            Verdict::Routed
        );
    }

    #[test]
    fn other_tables_and_inserts_pass_and_unlisted_fan_outs_do_not() {
        assert_eq!(
            judge("SELECT * FROM users WHERE id = $1 FOR UPDATE"),
            Verdict::Unrelated
        );
        assert_eq!(judge("BEGIN"), Verdict::Unrelated);
        assert_eq!(judge("SELECT * FROM jobsx"), Verdict::Unrelated);
        assert_eq!(
            judge("SELECT 1 FROM ((audit_log INNER JOIN users ON x) INNER JOIN y ON z) FOR UPDATE"),
            Verdict::Refused(Breach::LockAcrossShards)
        );
        assert_eq!(
            judge("INSERT INTO race_log (id) VALUES ($1)"),
            Verdict::Insert
        );
        assert_eq!(
            judge("SELECT * FROM attempts WHERE state = $1"),
            Verdict::Refused(Breach::UnlistedFanOut)
        );
    }

    #[test]
    fn alter_table_takes_one_subcommand_on_distributed_tables() {
        assert!(alters_with_several_subcommands(
            "ALTER TABLE jobs ADD COLUMN a TEXT, ADD CONSTRAINT c CHECK (a IN ('x', 'y'))"
        ));
        assert!(!alters_with_several_subcommands(
            "ALTER TABLE jobs ADD CONSTRAINT c CHECK (a IN ('x', 'y'))"
        ));
        assert!(!alters_with_several_subcommands(
            "ALTER TABLE users ADD COLUMN a TEXT, ADD COLUMN b TEXT"
        ));
    }
}

/// Why a database cannot be distributed.
#[derive(Debug, thiserror::Error)]
pub enum DistributeError {
    #[error("Citus runs on PostgreSQL; this database is SQLite")]
    NotPostgres,
    #[error(
        "the Citus extension is not installed and preloaded on this server (`pg_available_extensions` \
         and `shared_preload_libraries` name no `citus`): install it and add it to \
         shared_preload_libraries first"
    )]
    NoCitus,
    #[error("this server is not a Citus coordinator (citus_is_coordinator() is false): run this against the coordinator")]
    NotCoordinator,
    #[error("{0} must be HOST:PORT")]
    BadNode(String),
    #[error("{0}")]
    Database(#[from] diesel::result::Error),
}

/// A Citus node, as `HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub host: String,
    pub port: i32,
}

impl Node {
    pub fn parse(text: &str) -> Result<Self, DistributeError> {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| DistributeError::BadNode(text.to_owned()))?;
        let port = port
            .parse()
            .map_err(|_| DistributeError::BadNode(text.to_owned()))?;
        if host.is_empty() {
            return Err(DistributeError::BadNode(text.to_owned()));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

#[derive(diesel::QueryableByName)]
struct Flag {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    flag: bool,
}

#[derive(diesel::QueryableByName)]
struct Placement {
    #[diesel(sql_type = diesel::sql_types::Text)]
    table_name: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    method: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    replication: String,
}

#[derive(diesel::QueryableByName)]
struct ForeignKey {
    #[diesel(sql_type = diesel::sql_types::Text)]
    table_name: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    definition: String,
}

/// Refuses a server that cannot run Citus: the extension must be
/// installed and preloaded (checked before anything else is done to the
/// database, migrations included).
pub fn require_citus(conn: &mut diesel::PgConnection) -> Result<(), DistributeError> {
    use diesel::prelude::*;
    let ready: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM pg_available_extensions, pg_settings \
          WHERE pg_available_extensions.name = 'citus' \
            AND pg_settings.name = 'shared_preload_libraries' \
            AND pg_settings.setting LIKE '%citus%'",
    )
    .get_result(conn)?;
    if ready.n == 0 {
        return Err(DistributeError::NoCitus);
    }
    // A database with the extension already may be a worker's.
    let created: Count =
        diesel::sql_query("SELECT count(*) AS n FROM pg_extension WHERE extname = 'citus'")
            .get_result(conn)?;
    if created.n > 0 {
        let coordinator: Flag =
            diesel::sql_query("SELECT citus_is_coordinator() AS flag").get_result(conn)?;
        if !coordinator.flag {
            return Err(DistributeError::NotCoordinator);
        }
    }
    Ok(())
}

/// Turns a migrated PostgreSQL database on a Citus coordinator into
/// onejob's layout, in one transaction: the coordinator and `workers` are
/// registered (each worker needs the same database, with `CREATE
/// EXTENSION citus`, made by hand: Citus does not propagate `CREATE
/// DATABASE`); the foreign keys among the distributed tables are dropped,
/// the reference tables made, the owner tables distributed and colocated,
/// and the keys added back one `ALTER TABLE` each. Running it again
/// changes nothing. Returns what it did, step by step.
pub fn distribute(
    conn: &mut diesel::PgConnection,
    coordinator: Option<&Node>,
    workers: &[Node],
) -> Result<Vec<String>, DistributeError> {
    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use diesel::sql_types::{Integer, Text};

    require_citus(conn)?;
    conn.transaction(|conn| {
        let mut done = Vec::new();
        conn.batch_execute("CREATE EXTENSION IF NOT EXISTS citus")?;
        if let Some(node) = coordinator {
            diesel::sql_query("SELECT citus_set_coordinator_host($1, $2)")
                .bind::<Text, _>(&node.host)
                .bind::<Integer, _>(node.port)
                .execute(conn)?;
            done.push(format!(
                "coordinator registered as {}:{}",
                node.host, node.port
            ));
        }
        let is_coordinator: Flag =
            diesel::sql_query("SELECT citus_is_coordinator() AS flag").get_result(conn)?;
        if !is_coordinator.flag {
            return Err(DistributeError::NotCoordinator);
        }
        for node in workers {
            let known: Count = diesel::sql_query(
                "SELECT count(*) AS n FROM pg_dist_node WHERE nodename = $1 AND nodeport = $2",
            )
            .bind::<Text, _>(&node.host)
            .bind::<Integer, _>(node.port)
            .get_result(conn)?;
            if known.n == 0 {
                diesel::sql_query("SELECT citus_add_node($1, $2)")
                    .bind::<Text, _>(&node.host)
                    .bind::<Integer, _>(node.port)
                    .execute(conn)?;
                done.push(format!("worker {}:{} added", node.host, node.port));
            }
        }
        let placed: Vec<Placement> = diesel::sql_query(
            "SELECT logicalrelid::regclass::text AS table_name, partmethod::text AS method, \
                    repmodel::text AS replication FROM pg_dist_partition",
        )
        .load(conn)?;
        let is = |table: &str, method: &str, replication: &str| {
            placed.iter().any(|p| {
                p.table_name == table && p.method == method && p.replication == replication
            })
        };
        let to_distribute: Vec<&str> = LAYOUT
            .distributed
            .iter()
            .copied()
            .filter(|t| !is(t, "h", "s"))
            .collect();
        // Citus refuses foreign keys among tables it is distributing: they
        // go, and come back once every table is in place.
        let keys: Vec<ForeignKey> = if to_distribute.is_empty() {
            Vec::new()
        } else {
            diesel::sql_query(
                "SELECT conrelid::regclass::text AS table_name, conname::text AS name, \
                        pg_get_constraintdef(oid) AS definition
                   FROM pg_constraint
                  WHERE contype = 'f'
                    AND conrelid::regclass::text = ANY($1)
                    AND confrelid::regclass::text = ANY($1)
                  ORDER BY conname",
            )
            .bind::<diesel::sql_types::Array<Text>, _>(LAYOUT.distributed)
            .load(conn)?
        };
        for key in &keys {
            conn.batch_execute(&format!(
                "ALTER TABLE {} DROP CONSTRAINT {}",
                key.table_name, key.name
            ))?;
        }
        if !keys.is_empty() {
            done.push(format!(
                "{} foreign keys among the owner tables dropped for the conversion",
                keys.len()
            ));
        }
        for table in LAYOUT.reference {
            if !is(table, "n", "t") {
                diesel::sql_query("SELECT create_reference_table($1)")
                    .bind::<Text, _>(table)
                    .execute(conn)?;
                done.push(format!("{table}: reference table"));
            }
        }
        let anchor = LAYOUT.distributed[0];
        for table in &to_distribute {
            let statement = if *table == anchor {
                "SELECT create_distributed_table($1, $2)".to_owned()
            } else {
                format!("SELECT create_distributed_table($1, $2, colocate_with => '{anchor}')")
            };
            diesel::sql_query(statement)
                .bind::<Text, _>(*table)
                .bind::<Text, _>(DISTRIBUTION_COLUMN)
                .execute(conn)?;
            done.push(format!(
                "{table}: distributed by {DISTRIBUTION_COLUMN}, colocated with {anchor}"
            ));
        }
        // One subcommand per ALTER TABLE: Citus refuses more.
        for key in &keys {
            conn.batch_execute(&format!(
                "ALTER TABLE {} ADD CONSTRAINT {} {}",
                key.table_name, key.name, key.definition
            ))?;
        }
        if !keys.is_empty() {
            done.push(format!("{} foreign keys added back", keys.len()));
        }
        if done.is_empty() {
            done.push("already distributed: nothing to do".to_owned());
        }
        Ok(done)
    })
}
