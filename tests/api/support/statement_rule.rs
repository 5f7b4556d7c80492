//! The statement rule a database distributed by owner needs (Citus; see
//! docs/scaling.md), judged on recorded statements: the tests record every
//! statement of a lifecycle on plain PostgreSQL and hold each one, and each
//! transaction, to it. It lives with the tests: the server never judges
//! its own SQL.
//!
//! For the tables distributed by `owner_id` (`store::distribution::LAYOUT`):
//!
//! - a statement that reads with a lock (`FOR UPDATE`, `FOR SHARE`),
//!   updates or deletes names its owner with an equality to a value
//!   (`owner_id = $n` or a constant), so it runs on one shard: Citus
//!   refuses locks across shards;
//! - so does every subquery of such a statement, and of an insert, that
//!   reads a distributed table: Citus routes a subquery by a value only,
//!   never through another table's column (`jobs.owner_id =
//!   attempts.owner_id` alone sends it to every shard);
//! - no UPDATE (nor an upsert's `DO UPDATE`) sets the distribution column,
//!   even to the value it has: Citus refuses it (`modifying the partition
//!   value of rows is not allowed`);
//! - no volatile function (`clock_timestamp()`, `random()` …) is evaluated
//!   inside an UPDATE or DELETE: Citus refuses them there, since each shard
//!   would evaluate its own; the database's clock is read with
//!   `statement_timestamp()`, which Citus evaluates once, on the
//!   coordinator;
//! - a read that names no owner fans out to every shard, and is allowed
//!   only if it is one of the [`FAN_OUT_READS`], each with its reason;
//! - a transaction touches one owner's rows of the distributed tables
//!   (one shard: no commit across nodes), unless it is one of the
//!   [`SEVERAL_OWNER_TRANSACTIONS`], each with its reason.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use crate::support::statement_log::Sent;
use onejob::store::distribution::{DISTRIBUTION_COLUMN, LAYOUT};

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
        marker: "select webhook_events.id, webhook_events.owner_id, webhook_events.endpoint_id from (webhook_events inner join webhook_endpoints on",
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
        purpose: "the subscriptions of every owner's webhook endpoints (admins)",
        marker: "from webhook_subscriptions where (webhook_subscriptions.endpoint_id = any($1))",
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

/// A transaction allowed to touch several owners' rows (on Citus, a commit
/// across nodes when the owners' shards are on different workers).
#[derive(Debug, Clone, Copy)]
pub struct SeveralOwners {
    /// Why it must (docs/scaling.md lists the same).
    pub purpose: &'static str,
    /// Text that only a statement of this transaction contains (compared
    /// after [`normalize`]).
    pub marker: &'static str,
}

/// The transactions allowed to touch several owners. None today: the
/// claim, the tally flush, retention and the webhook claim each take one
/// owner per transaction.
pub const SEVERAL_OWNER_TRANSACTIONS: &[SeveralOwners] = &[];

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Breach {
    /// Reads with a lock but names no owner.
    LockAcrossShards,
    /// Updates or deletes but names no owner.
    WriteAcrossShards,
    /// Evaluates a volatile function inside an UPDATE or DELETE.
    VolatileInWrite,
    /// Reads across every shard and is not one of the listed reads.
    UnlistedFanOut,
    /// Sets the distribution column in an UPDATE.
    SetsDistributionColumn,
    /// A subquery on a distributed table names its owner through another
    /// column, or not at all.
    SubqueryNotRouted,
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
                "reads across every shard and is not one of statement_rule::FAN_OUT_READS"
            }
            Self::SetsDistributionColumn => {
                "sets the distribution column (owner_id) in an UPDATE, which Citus refuses"
            }
            Self::SubqueryNotRouted => {
                "has a subquery on a distributed table that names its owner through another \
                 column or not at all (Citus routes a subquery only by a value: owner_id = $n)"
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
        if c == '"' || c == '`' {
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

fn touches_distributed(sql: &str) -> bool {
    patterns().touches.iter().any(|p| has_word(sql, p))
}

/// What each `owner_id =` in `sql` is compared with: the text after the
/// sign, up to the next space or parenthesis.
fn owner_comparisons(sql: &str) -> impl Iterator<Item = &str> {
    sql.match_indices(DISTRIBUTION_COLUMN)
        .filter_map(|(at, _)| {
            let before = sql[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                return None;
            }
            let rest = sql[at + DISTRIBUTION_COLUMN.len()..].trim_start();
            let value = rest.strip_prefix('=')?.trim_start();
            let end = value.find([' ', ')', ',']).unwrap_or(value.len());
            Some(&value[..end])
        })
}

fn is_value(operand: &str) -> bool {
    operand.starts_with('$') || operand.starts_with('\'') || operand.starts_with('?')
}

/// Whether the statement pins an owner: `owner_id = $n` or `owner_id = '…'`
/// (`= ANY(…)` names several owners and does not count).
fn names_an_owner(sql: &str) -> bool {
    owner_comparisons(sql).any(is_value)
}

/// The statement's scopes, each as its own text: the statement itself and
/// every parenthesized subquery or data-modifying `WITH` part (a group
/// that begins with SELECT, WITH, INSERT, UPDATE or DELETE), each with its
/// own subqueries cut out (`(…)`). Other parentheses (conditions, joins)
/// stay in the scope they are written in. The first is the statement.
fn scopes(sql: &str) -> Vec<String> {
    const OPENERS: [&str; 5] = ["select ", "with ", "insert ", "update ", "delete "];
    let mut found: Vec<String> = Vec::new();
    let mut open: Vec<String> = vec![String::new()];
    let mut in_string = false;
    for c in sql.chars() {
        let nested = open.len() > 1;
        let top = open.last_mut().expect("the statement's own scope");
        if in_string {
            top.push(c);
            in_string = c != '\'';
            continue;
        }
        match c {
            '\'' => {
                in_string = true;
                top.push(c);
            }
            '(' => open.push(String::new()),
            ')' if nested => {
                let group = open.pop().expect("more than one");
                let parent = open.last_mut().expect("the statement's own scope");
                if OPENERS.iter().any(|o| group.trim_start().starts_with(o)) {
                    found.push(group);
                    parent.push_str("(…)");
                } else {
                    parent.push('(');
                    parent.push_str(&group);
                    parent.push(')');
                }
            }
            _ => top.push(c),
        }
    }
    // Unbalanced text closes what it opened.
    while open.len() > 1 {
        let group = open.pop().expect("more than one");
        open.last_mut().expect("the statement").push_str(&group);
    }
    found.insert(0, open.pop().expect("the statement"));
    found
}

/// Whether an UPDATE of a distributed table, or an upsert's `DO UPDATE`,
/// sets the distribution column.
fn sets_distribution_column(scope: &str) -> bool {
    let starts_update = LAYOUT
        .distributed
        .iter()
        .any(|t| has_word(scope, &format!("update {t} set")));
    let set_at = if starts_update {
        scope.find(" set ")
    } else if touches_distributed(scope) {
        scope
            .find(" do update set ")
            .map(|at| at + " do update".len())
    } else {
        None
    };
    let Some(at) = set_at else {
        return false;
    };
    let clause = &scope[at + " set ".len()..];
    let end = [" where ", " returning ", " from "]
        .iter()
        .filter_map(|word| clause.find(word))
        .min()
        .unwrap_or(clause.len());
    clause[..end].split(',').any(|assignment| {
        let column = assignment.split('=').next().unwrap_or("").trim();
        let column = column.rsplit('.').next().unwrap_or(column);
        column == DISTRIBUTION_COLUMN
    })
}

/// Judges one statement by the rule.
pub fn judge(sql: &str) -> Verdict {
    let sql = normalize(sql);
    if !touches_distributed(&sql) {
        return Verdict::Unrelated;
    }
    let writes = patterns().writes.iter().any(|p| has_word(&sql, p));
    if writes && VOLATILE.iter().any(|f| sql.contains(f)) {
        return Verdict::Refused(Breach::VolatileInWrite);
    }
    let scopes = scopes(&sql);
    if scopes.iter().any(|scope| sets_distribution_column(scope)) {
        return Verdict::Refused(Breach::SetsDistributionColumn);
    }
    // An insert is routed by the values it inserts; every other scope on a
    // distributed table must name its owner by value.
    let inserts = |scope: &str| scope.contains("insert into ");
    let unrouted: Vec<usize> = (0..scopes.len())
        .filter(|&i| {
            let scope = &scopes[i];
            touches_distributed(scope) && !inserts(scope) && !names_an_owner(scope)
        })
        .collect();
    if unrouted.is_empty() {
        return if inserts(&sql) && !names_an_owner(&sql) {
            Verdict::Insert
        } else {
            Verdict::Routed
        };
    }
    let locks = [
        " for update",
        " for share",
        " for no key update",
        " for key share",
    ]
    .iter()
    .any(|p| sql.contains(p));
    // A listed read may fan out, whatever it names (a report's optional
    // owner filter, `$3 = '' OR owner_id = $3`, routes nothing).
    let listed = FAN_OUT_READS.iter().find(|read| sql.contains(read.marker));
    match listed {
        Some(read) if !writes && !locks => Verdict::FanOut(read.purpose),
        _ if !unrouted.contains(&0) => Verdict::Refused(Breach::SubqueryNotRouted),
        // The statement itself names no owner: it runs on every shard.
        _ if writes => Verdict::Refused(Breach::WriteAcrossShards),
        _ if locks => Verdict::Refused(Breach::LockAcrossShards),
        _ => Verdict::Refused(Breach::UnlistedFanOut),
    }
}

/// The values diesel bound to a statement, as written in its debug text
/// (`… -- binds: ["a", UserId("…"), 3]`), each as the first quoted text in
/// it (or the whole item when it has none).
fn binds(sql: &str) -> Vec<String> {
    let Some((_, list)) = sql.split_once(" -- binds: ") else {
        return Vec::new();
    };
    let list = list.trim();
    let list = list
        .strip_prefix('[')
        .and_then(|l| l.strip_suffix(']'))
        .unwrap_or(list);
    let mut items: Vec<String> = Vec::new();
    let (mut item, mut depth, mut in_string, mut escaped) = (String::new(), 0i32, false, false);
    for c in list.chars() {
        if in_string {
            item.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                item.push(c);
            }
            '[' | '(' | '{' => {
                depth += 1;
                item.push(c);
            }
            ']' | ')' | '}' => {
                depth -= 1;
                item.push(c);
            }
            ',' if depth == 0 => items.push(std::mem::take(&mut item)),
            _ => item.push(c),
        }
    }
    if !item.trim().is_empty() {
        items.push(item);
    }
    items
        .into_iter()
        .map(|item| {
            let item = item.trim();
            match item.split_once('"') {
                Some((_, rest)) => rest.split('"').next().unwrap_or("").to_owned(),
                None => item.to_owned(),
            }
        })
        .collect()
}

/// The owners a statement of a distributed table names by value: each
/// `owner_id = $n` (its bound value) or `owner_id = '…'`, and the
/// `owner_id` column of a `VALUES` or `SELECT` insert.
pub fn owners_named(sql: &str) -> BTreeSet<String> {
    let normal = normalize(sql);
    let bound = binds(sql);
    let value_of = |operand: &str| -> Option<String> {
        if let Some(n) = operand.strip_prefix('$') {
            let n: usize = n.parse().ok()?;
            return bound.get(n.checked_sub(1)?).cloned();
        }
        operand
            .strip_prefix('\'')
            .and_then(|o| o.strip_suffix('\''))
            .map(str::to_owned)
    };
    let mut owners: BTreeSet<String> = owner_comparisons(&normal).filter_map(value_of).collect();
    owners.extend(
        inserted_owners(&normal)
            .into_iter()
            .filter_map(|o| value_of(&o)),
    );
    owners
}

/// The operands an insert gives its `owner_id` column: `INSERT INTO t (…,
/// owner_id, …) VALUES (…), (…)` or `… SELECT …, $2, …`.
fn inserted_owners(sql: &str) -> Vec<String> {
    let Some(at) = sql.find("insert into ") else {
        return Vec::new();
    };
    let rest = &sql[at..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else {
        return Vec::new();
    };
    let columns: Vec<&str> = rest[open + 1..close].split(',').map(str::trim).collect();
    let Some(index) = columns.iter().position(|c| *c == DISTRIBUTION_COLUMN) else {
        return Vec::new();
    };
    let after = rest[close + 1..].trim_start();
    let tuple_item = |tuple: &str| tuple.split(',').nth(index).map(|v| v.trim().to_owned());
    if let Some(values) = after.strip_prefix("values ") {
        values
            .split("),")
            .filter_map(|tuple| tuple_item(tuple.trim().trim_start_matches('(')))
            .collect()
    } else if let Some(select) = after.strip_prefix("select ") {
        tuple_item(select.split(" from ").next().unwrap_or(select))
            .into_iter()
            .collect()
    } else {
        Vec::new()
    }
}

/// A transaction that touched several owners' rows.
#[derive(Debug, Clone)]
pub struct MixedTransaction {
    pub owners: BTreeSet<String>,
    pub statements: Vec<String>,
}

/// What the rule says about the transactions of a recording.
#[derive(Debug, Default)]
pub struct Transactions {
    /// Those that touched distributed tables.
    pub touching: usize,
    /// Listed ones that touched several owners, by purpose.
    pub allowed: BTreeMap<&'static str, usize>,
    /// Unlisted ones that touched several owners.
    pub mixed: Vec<MixedTransaction>,
}

/// Judges the transactions among `sent`: one that touches more than one
/// owner's rows of the distributed tables must be one of the
/// [`SEVERAL_OWNER_TRANSACTIONS`].
pub fn judge_transactions(sent: &[Sent]) -> Transactions {
    let mut transactions: BTreeMap<(u64, u64), Vec<&Sent>> = BTreeMap::new();
    for statement in sent {
        if let Some(transaction) = statement.transaction {
            transactions
                .entry((statement.connection, transaction))
                .or_default()
                .push(statement);
        }
    }
    let mut verdicts = Transactions::default();
    for statements in transactions.values() {
        let distributed: Vec<&&Sent> = statements
            .iter()
            .filter(|s| touches_distributed(&normalize(&s.sql)))
            .collect();
        if distributed.is_empty() {
            continue;
        }
        verdicts.touching += 1;
        let owners: BTreeSet<String> = distributed
            .iter()
            .flat_map(|s| owners_named(&s.sql))
            .collect();
        if owners.len() < 2 {
            continue;
        }
        let listed = SEVERAL_OWNER_TRANSACTIONS.iter().find(|allowed| {
            distributed
                .iter()
                .any(|s| normalize(&s.sql).contains(allowed.marker))
        });
        match listed {
            Some(allowed) => *verdicts.allowed.entry(allowed.purpose).or_default() += 1,
            None => verdicts.mixed.push(MixedTransaction {
                owners,
                statements: distributed.iter().map(|s| normalize(&s.sql)).collect(),
            }),
        }
    }
    verdicts
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

    /// The budget write Citus refused on a real cluster.
    #[test]
    fn an_update_may_not_set_the_distribution_column() {
        assert_eq!(
            judge(
                r#"UPDATE "budgets" SET "owner_id" = $1, "spend_limit_micros" = $2 WHERE ("budgets"."owner_id" = $3) RETURNING "budgets"."owner_id""#
            ),
            Verdict::Refused(Breach::SetsDistributionColumn)
        );
        assert_eq!(
            judge(
                r#"UPDATE "budgets" SET "spend_limit_micros" = $1 WHERE ("budgets"."owner_id" = $2) RETURNING "budgets"."owner_id""#
            ),
            Verdict::Routed
        );
        assert_eq!(
            judge(
                "INSERT INTO usage_tallies (owner_id, count) VALUES ($1, $2) ON CONFLICT (owner_id) DO UPDATE SET owner_id = excluded.owner_id"
            ),
            Verdict::Refused(Breach::SetsDistributionColumn)
        );
        assert_eq!(
            judge(
                "INSERT INTO usage_tallies (owner_id, count) VALUES ($1, $2) ON CONFLICT (owner_id) DO UPDATE SET count = usage_tallies.count + excluded.count"
            ),
            Verdict::Insert
        );
    }

    /// The claim's subquery that sent every claim to all 32 shards.
    #[test]
    fn a_subquery_names_its_owner_by_value() {
        assert_eq!(
            judge(
                r#"UPDATE "attempts" SET "version_read" = (SELECT jobs.version FROM jobs WHERE jobs.id = attempts.job_id AND jobs.owner_id = attempts.owner_id) WHERE ("attempts"."owner_id" = $1)"#
            ),
            Verdict::Refused(Breach::SubqueryNotRouted)
        );
        assert_eq!(
            judge(
                r#"UPDATE "attempts" SET "version_read" = (SELECT jobs.version FROM jobs WHERE jobs.id = attempts.job_id AND jobs.owner_id = $1) WHERE ("attempts"."owner_id" = $2)"#
            ),
            Verdict::Routed
        );
        // A join on the owner inside a scope that names it by value is fine.
        assert_eq!(
            judge(
                "SELECT 1 FROM jobs j WHERE j.owner_id = $1 AND NOT EXISTS (SELECT 1 FROM attempts a JOIN audit_log l ON l.owner_id = a.owner_id WHERE a.owner_id = $1)"
            ),
            Verdict::Routed
        );
        assert_eq!(
            judge(
                "INSERT INTO jobs (id, owner_id) SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM budgets b WHERE b.owner_id = jobs.owner_id)"
            ),
            Verdict::Refused(Breach::SubqueryNotRouted)
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
    fn group_commits_multi_row_creation_names_its_owner() {
        assert_eq!(
            judge(onejob::store::jobs::multi_row_creation_statement()),
            Verdict::Routed
        );
    }

    #[test]
    fn the_owners_a_statement_names_are_read_from_its_binds() {
        let named = owners_named(
            r#"UPDATE "jobs" SET "x" = $1 WHERE ("jobs"."owner_id" = $2) -- binds: [Some("a, b"), UserId("alice")]"#,
        );
        assert_eq!(named, BTreeSet::from(["alice".to_owned()]));
        let inserted = owners_named(
            r#"INSERT INTO "usage_tallies" ("owner_id", "day") VALUES ($1, $2), ($3, $4) -- binds: ["alice", 1, "bob", 2]"#,
        );
        assert_eq!(
            inserted,
            BTreeSet::from(["alice".to_owned(), "bob".to_owned()])
        );
        let selected = owners_named(
            r#"INSERT INTO jobs (id, owner_id) SELECT $1, $2 -- binds: ["j", "carol"]"#,
        );
        assert_eq!(selected, BTreeSet::from(["carol".to_owned()]));
    }

    /// The tally flush that deadlocked across processes on a real cluster:
    /// several owners' rows in one transaction.
    #[test]
    fn a_transaction_touches_one_owner() {
        let sent = |sql: &str, transaction| Sent {
            sql: sql.to_owned(),
            connection: 1,
            transaction: Some(transaction),
        };
        let upsert = r#"INSERT INTO "usage_tallies" ("owner_id", "count") VALUES ($1, $2) ON CONFLICT DO UPDATE SET "count" = "usage_tallies"."count" + excluded."count" -- binds: "#;
        let verdicts = judge_transactions(&[
            sent(&format!(r#"{upsert}["alice", 1]"#), 1),
            sent(&format!(r#"{upsert}["bob", 1]"#), 1),
            sent(&format!(r#"{upsert}["alice", 1]"#), 2),
            sent(&format!(r#"{upsert}["alice", 2]"#), 2),
            sent("SELECT 1 FROM users -- binds: []", 3),
        ]);
        assert_eq!(verdicts.touching, 2);
        assert_eq!(verdicts.mixed.len(), 1);
        assert_eq!(
            verdicts.mixed[0].owners,
            BTreeSet::from(["alice".to_owned(), "bob".to_owned()])
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
