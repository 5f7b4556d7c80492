//! Distribution by owner (docs/scaling.md): where each table goes on Citus,
//! and the conversion of a migrated PostgreSQL database into distributed
//! tables. The rule every statement keeps so that Citus can route it is
//! judged by the tests, on recorded statements
//! (`tests/api/support/statement_rule.rs`), never by the server.

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
        "webhook_subscriptions",
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
    local: &[
        "__diesel_schema_migrations",
        "backlog_samples",
        "credential_changes",
    ],
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

    require_citus(conn)?;
    conn.transaction(|conn| {
        let mut done = Vec::new();
        conn.batch_execute("CREATE EXTENSION IF NOT EXISTS citus")?;
        register_nodes(conn, coordinator, workers, &mut done)?;
        place_tables(conn, &mut done)?;
        if done.is_empty() {
            done.push("already distributed: nothing to do".to_owned());
        }
        Ok(done)
    })
}

/// Registers the coordinator (when given) and each worker not registered
/// yet, and checks that this database is the coordinator.
fn register_nodes(
    conn: &mut diesel::PgConnection,
    coordinator: Option<&Node>,
    workers: &[Node],
    done: &mut Vec<String>,
) -> Result<(), DistributeError> {
    use diesel::prelude::*;
    use diesel::sql_types::{Integer, Text};

    if let Some(node) = coordinator {
        // Registered as given already: nothing to say on a second run.
        let registered: Count = diesel::sql_query(
            "SELECT count(*) AS n FROM pg_dist_node \
              WHERE groupid = 0 AND nodename = $1 AND nodeport = $2",
        )
        .bind::<Text, _>(&node.host)
        .bind::<Integer, _>(node.port)
        .get_result(conn)?;
        if registered.n == 0 {
            diesel::sql_query("SELECT citus_set_coordinator_host($1, $2)")
                .bind::<Text, _>(&node.host)
                .bind::<Integer, _>(node.port)
                .execute(conn)?;
            done.push(format!(
                "coordinator registered as {}:{}",
                node.host, node.port
            ));
        }
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
    Ok(())
}

/// Makes the reference tables and distributes the owner tables not placed
/// yet, with the foreign keys among them dropped for the conversion (Citus
/// refuses them there) and added back after.
fn place_tables(
    conn: &mut diesel::PgConnection,
    done: &mut Vec<String>,
) -> Result<(), DistributeError> {
    use diesel::prelude::*;
    use diesel::sql_types::Text;

    let placed: Vec<Placement> = diesel::sql_query(
        "SELECT logicalrelid::regclass::text AS table_name, partmethod::text AS method, \
                repmodel::text AS replication FROM pg_dist_partition",
    )
    .load(conn)?;
    let is = |table: &str, method: &str, replication: &str| {
        placed
            .iter()
            .any(|p| p.table_name == table && p.method == method && p.replication == replication)
    };
    let to_distribute: Vec<&str> = LAYOUT
        .distributed
        .iter()
        .copied()
        .filter(|t| !is(t, "h", "s"))
        .collect();
    let keys = if to_distribute.is_empty() {
        Vec::new()
    } else {
        drop_foreign_keys(conn, done)?
    };
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
    add_foreign_keys(conn, &keys, done)
}

/// Drops the foreign keys among the owner tables; returns them, to be
/// added back.
fn drop_foreign_keys(
    conn: &mut diesel::PgConnection,
    done: &mut Vec<String>,
) -> Result<Vec<ForeignKey>, DistributeError> {
    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use diesel::sql_types::Text;

    let keys: Vec<ForeignKey> = diesel::sql_query(
        "SELECT conrelid::regclass::text AS table_name, conname::text AS name, \
                pg_get_constraintdef(oid) AS definition
           FROM pg_constraint
          WHERE contype = 'f'
            AND conrelid::regclass::text = ANY($1)
            AND confrelid::regclass::text = ANY($1)
          ORDER BY conname",
    )
    .bind::<diesel::sql_types::Array<Text>, _>(LAYOUT.distributed)
    .load(conn)?;
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
    Ok(keys)
}

/// Adds `keys` back, one `ALTER TABLE` each: Citus refuses more
/// subcommands in one.
fn add_foreign_keys(
    conn: &mut diesel::PgConnection,
    keys: &[ForeignKey],
    done: &mut Vec<String>,
) -> Result<(), DistributeError> {
    use diesel::connection::SimpleConnection;
    for key in keys {
        conn.batch_execute(&format!(
            "ALTER TABLE {} ADD CONSTRAINT {} {}",
            key.table_name, key.name, key.definition
        ))?;
    }
    if !keys.is_empty() {
        done.push(format!("{} foreign keys added back", keys.len()));
    }
    Ok(())
}
