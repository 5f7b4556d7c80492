//! Usage, prices and budgets (docs/design.md): what a call is charged at,
//! what a new job reserves, owners' budgets, the usage report, and the
//! counts of duplicates absorbed kept in memory between flushes.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

use super::{require_admin, App, AppError, AppResult, Job, User};
use crate::contracts::TaskContract;
use crate::domain::ledger::{
    day_start, month_start, most_a_job_can_cost, next_month_start, BudgetLimits, Reservation,
    TallyKind,
};
use crate::domain::{AuditAction, AuditReason, Timestamp, Usage, UserId};
use crate::store::budgets::{self, BudgetRow};
use crate::store::ledger::{self as ledger_store, estimated_tokens, Charge, LedgerEntry, Tally};
use crate::store::operator::{record_audit, Audited};
use crate::store::reports::{self, LedgerSums, UsageFilter, UsageGrouping};
use crate::store::{users, StoreError};

/// The longest range one usage report may cover.
pub const MAX_REPORT_DAYS: i64 = 93;

/// Counts of duplicates absorbed and creations refused, kept in memory and
/// added to the database every `ledger.tally_flush_ms` (a process killed
/// loses at most one interval's counts: they are statistics, not money).
#[derive(Debug, Default)]
pub struct Tallies {
    counts: Mutex<HashMap<TallyKey, i64>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TallyKey {
    owner_id: UserId,
    day: Timestamp,
    task: String,
    provider: String,
    job_id: String,
    kind: TallyKind,
}

impl Tallies {
    fn add(&self, key: TallyKey) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry(key).or_insert(0) += 1;
    }

    fn take(&self) -> Vec<Tally> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts
            .drain()
            .map(|(key, count)| Tally {
                owner_id: key.owner_id,
                day: key.day,
                task: key.task,
                provider: key.provider,
                job_id: key.job_id,
                kind: key.kind.as_str().to_owned(),
                count,
            })
            .collect()
    }

    fn put_back(&self, tallies: Vec<Tally>) {
        for tally in tallies {
            let Some(kind) = TallyKind::parse(&tally.kind) else {
                continue;
            };
            let key = TallyKey {
                owner_id: tally.owner_id,
                day: tally.day,
                task: tally.task,
                provider: tally.provider,
                job_id: tally.job_id,
                kind,
            };
            let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            *counts.entry(key).or_insert(0) += tally.count;
        }
    }
}

/// An owner's budget as the API and the pages show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetState {
    pub owner_id: UserId,
    pub owner: String,
    pub limits: BudgetLimits,
    /// This month's recorded spend and tokens.
    pub spent: Reservation,
    /// What unfinished jobs hold.
    pub reserved: Reservation,
    pub period_start: Timestamp,
    pub resets_at: Timestamp,
    pub currency: String,
}

/// One group of a usage report: the ledger's sums and the tallies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageGroup {
    pub key: String,
    pub ledger: LedgerSums,
    pub replayed: i64,
    pub joined: i64,
    /// What the replays and joined duplicates would have cost, at their
    /// jobs' own price (an estimate).
    pub duplicates_estimate_micros: i64,
    pub refused_budget: i64,
    pub withdrawn: i64,
}

/// A usage report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageReport {
    pub filter: UsageFilter,
    pub grouping: UsageGrouping,
    pub currency: String,
    pub groups: Vec<UsageGroup>,
    pub total: UsageGroup,
}

impl App {
    /// The id of the user named `name`, for a usage filter; `None` when
    /// there is no such user.
    pub async fn user_id_by_name(&self, name: &str) -> AppResult<Option<UserId>> {
        let name = name.to_owned();
        let found = self
            .store()
            .run(move |conn| users::find_by_name(conn, &name))
            .await?;
        Ok(found.map(|user| user.id))
    }

    /// The most a new job of `contract` with `input` can cost: its prompt
    /// estimate plus its `max_tokens` (the request's, else the largest of
    /// its route's providers') at the dearest provider of its route, by
    /// today's prices.
    /// A request's own limit above what the route's providers can produce
    /// (`domain::ledger::check_max_tokens`) is refused: the reservation is
    /// never computed from a number the client chose freely.
    /// `requested` is a chat request's own answer limit, as its input was
    /// read (`app::intake`).
    pub(crate) fn reservation_for(
        &self,
        contract: &TaskContract,
        input: &Value,
        requested: Option<u64>,
    ) -> AppResult<Reservation> {
        let config = self.config();
        let providers: Vec<_> = contract
            .chain()
            .iter()
            .filter_map(|name| config.provider(name))
            .collect();
        if let Some(asked) = requested {
            let ceiling = config.output_token_ceiling(contract);
            crate::domain::ledger::check_max_tokens(asked, ceiling).map_err(|refusal| {
                AppError::InvalidBody {
                    detail: refusal.to_string(),
                    field: Some("max_tokens".to_owned()),
                }
            })?;
        }
        let max_tokens = requested.unwrap_or_else(|| {
            providers
                .iter()
                .map(|p| u64::from(p.max_tokens))
                .max()
                .unwrap_or(0)
        });
        let prompt = estimated_tokens(input.to_string().len());
        let now = Timestamp::now();
        let prices = providers
            .iter()
            .map(|p| config.ledger.prices.at(&p.name, p.model_name(), now));
        Ok(most_a_job_can_cost(prompt, max_tokens, prices))
    }

    /// What a call to `provider` is charged at now.
    pub(crate) fn charge_for(&self, provider: &str, usage: Option<Usage>) -> Charge {
        let config = self.config();
        let model = config
            .provider(provider)
            .map_or(provider, |p| p.model_name())
            .to_owned();
        let price = config
            .ledger
            .prices
            .at(provider, &model, Timestamp::now())
            .cloned();
        Charge {
            usage,
            model,
            price,
            currency: config.ledger.currency.clone(),
        }
    }

    /// Counts a duplicate absorbed: a replay of `job`'s key, or a twin
    /// that joined it.
    pub(crate) fn count_duplicate(&self, job: &Job, kind: TallyKind) {
        self.inner.tallies.add(TallyKey {
            owner_id: job.owner_id.clone(),
            day: day_start(Timestamp::now()),
            task: job.task.clone(),
            provider: job.provider.clone(),
            job_id: job.id.as_str().to_owned(),
            kind,
        });
    }

    /// Counts a creation a budget refused.
    pub(crate) fn count_refused(&self, owner_id: &UserId, task: &str, provider: &str) {
        self.metrics().budget_refusals.inc();
        self.inner.tallies.add(TallyKey {
            owner_id: owner_id.clone(),
            day: day_start(Timestamp::now()),
            task: task.to_owned(),
            provider: provider.to_owned(),
            job_id: String::new(),
            kind: TallyKind::RefusedBudget,
        });
    }

    /// Adds the counts kept in memory to the database; on failure they are
    /// kept for the next flush.
    pub async fn flush_tallies(&self) -> AppResult<usize> {
        let tallies = self.inner.tallies.take();
        if tallies.is_empty() {
            return Ok(0);
        }
        let count = tallies.len();
        // Kept for a flush that never reached a connection.
        let kept = tallies.clone();
        let flushed = self
            .store()
            .run(move |conn| Ok(ledger_store::flush_tallies(conn, tallies)))
            .await;
        match flushed {
            Ok(Ok(())) => Ok(count),
            Ok(Err((error, unstored))) => {
                self.inner.tallies.put_back(unstored);
                Err(error.into())
            }
            Err(error) => {
                self.inner.tallies.put_back(kept);
                Err(error.into())
            }
        }
    }

    /// Records this minute's Unknown backlog (once across processes),
    /// keeping 30 days of samples.
    pub async fn sample_backlog(&self) -> AppResult<()> {
        let now = Timestamp::now();
        let minute = now.floor_to(60_000);
        let keep_from = now - 30 * crate::domain::ledger::DAY_MS;
        Ok(self
            .store()
            .run(move |conn| reports::sample_backlog(conn, minute, keep_from))
            .await?)
    }

    /// Sets `owner`'s monthly limits (admins), audited with `reason`.
    pub async fn set_budget(
        &self,
        actor: &User,
        owner: &str,
        limits: BudgetLimits,
        reason: &str,
    ) -> AppResult<BudgetState> {
        require_admin(actor)?;
        let reason = AuditReason::parse(reason).map_err(AppError::bad_reason)?;
        let (owner, actor_id) = (owner.to_owned(), actor.id.clone());
        let now = Timestamp::now();
        let row = self
            .store()
            .run(move |conn| {
                let user = users::find_by_name(conn, &owner)?.ok_or(StoreError::NotFound)?;
                let filter = UsageFilter {
                    from: month_start(now),
                    to: Timestamp::from_millis(i64::MAX),
                    owner_id: user.id.as_str().to_owned(),
                    ..UsageFilter::default()
                };
                let month = reports::ledger_sums(conn, &filter, UsageGrouping::Provider)?;
                let spent = Reservation {
                    micros: month.iter().map(|s| s.cost_micros).sum(),
                    tokens: month
                        .iter()
                        .map(|s| s.prompt_tokens + s.completion_tokens)
                        .sum(),
                };
                crate::store::connection::write_transaction(conn, |conn| {
                    let row = budgets::set_limits(conn, &user.id, limits, spent, now)?;
                    record_audit(
                        conn,
                        &actor_id,
                        AuditAction::SetBudget,
                        Audited::User(&user.id),
                        &format!("{} ({})", reason.as_str(), describe_limits(&limits)),
                        now,
                    )?;
                    Ok::<_, StoreError>((row, user.name))
                })
            })
            .await?;
        Ok(self.budget_state(row.0, row.1))
    }

    /// Removes `owner`'s budget (admins), audited with `reason`. Whether
    /// there was one.
    pub async fn remove_budget(&self, actor: &User, owner: &str, reason: &str) -> AppResult<bool> {
        require_admin(actor)?;
        let reason = AuditReason::parse(reason).map_err(AppError::bad_reason)?;
        let (owner, actor_id) = (owner.to_owned(), actor.id.clone());
        Ok(self
            .store()
            .run(move |conn| {
                let user = users::find_by_name(conn, &owner)?.ok_or(StoreError::NotFound)?;
                crate::store::connection::write_transaction(conn, |conn| {
                    let removed = budgets::remove(conn, &user.id)?;
                    if removed {
                        record_audit(
                            conn,
                            &actor_id,
                            AuditAction::RemoveBudget,
                            Audited::User(&user.id),
                            reason.as_str(),
                            Timestamp::now(),
                        )?;
                    }
                    Ok::<_, StoreError>(removed)
                })
            })
            .await?)
    }

    /// `owner`'s budget, if any: an admin's for anyone, a user's own.
    pub async fn budget(&self, viewer: &User, owner: &str) -> AppResult<Option<BudgetState>> {
        if viewer.name != owner {
            require_admin(viewer)?;
        }
        let owner = owner.to_owned();
        let found = self
            .store()
            .run(move |conn| {
                let user = users::find_by_name(conn, &owner)?.ok_or(StoreError::NotFound)?;
                Ok(budgets::find(conn, &user.id)?.map(|row| (row, user.name)))
            })
            .await?;
        Ok(found.map(|(row, name)| self.budget_state(row, name)))
    }

    /// Every budget (admins).
    pub async fn budgets(&self, viewer: &User) -> AppResult<Vec<BudgetState>> {
        require_admin(viewer)?;
        let rows = self
            .store()
            .run(move |conn| {
                let rows = budgets::list(conn, 1000)?;
                let mut named = Vec::with_capacity(rows.len());
                for row in rows {
                    let name = users::name_of(conn, &row.owner_id)?;
                    named.push((row, name));
                }
                Ok(named)
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(row, name)| self.budget_state(row, name))
            .collect())
    }

    fn budget_state(&self, row: BudgetRow, owner: String) -> BudgetState {
        let now = Timestamp::now();
        let month = month_start(now);
        let counters = row.counters();
        let spent = if counters.period_start >= month {
            Reservation {
                micros: counters.spent_micros,
                tokens: counters.spent_tokens,
            }
        } else {
            Reservation::default()
        };
        BudgetState {
            owner_id: row.owner_id.clone(),
            owner,
            limits: row.limits(),
            spent,
            reserved: Reservation {
                micros: counters.reserved_micros,
                tokens: counters.reserved_tokens,
            },
            period_start: month,
            resets_at: next_month_start(now),
            currency: self.config().ledger.currency.clone(),
        }
    }

    /// The usage report over `filter`, grouped by `grouping`: an admin's
    /// over anyone, a user's over their own (the owner filter is theirs,
    /// whatever was asked).
    pub async fn usage_report(
        &self,
        viewer: &User,
        mut filter: UsageFilter,
        grouping: UsageGrouping,
    ) -> AppResult<UsageReport> {
        if require_admin(viewer).is_err() {
            filter.owner_id = viewer.id.as_str().to_owned();
        }
        // The callers bound it; held here too.
        filter.from = filter
            .from
            .max(filter.to - MAX_REPORT_DAYS * crate::domain::ledger::DAY_MS)
            .min(filter.to);
        let query = filter.clone();
        let (sums, tallies) = self
            .store()
            .run(move |conn| {
                Ok((
                    reports::ledger_sums(conn, &query, grouping)?,
                    reports::tally_sums(conn, &query, grouping)?,
                ))
            })
            .await?;
        let mut groups: Vec<UsageGroup> = sums
            .into_iter()
            .map(|ledger| UsageGroup {
                key: ledger.grp.clone(),
                ledger,
                ..UsageGroup::default()
            })
            .collect();
        for tally in tallies {
            let index = match groups.iter().position(|g| g.key == tally.grp) {
                Some(index) => index,
                None => {
                    groups.push(UsageGroup {
                        key: tally.grp.clone(),
                        ledger: LedgerSums {
                            grp: tally.grp.clone(),
                            ..LedgerSums::default()
                        },
                        ..UsageGroup::default()
                    });
                    groups.len() - 1
                }
            };
            let group = &mut groups[index];
            match TallyKind::parse(&tally.kind) {
                Some(TallyKind::Replayed) => group.replayed += tally.count,
                Some(TallyKind::Joined) => group.joined += tally.count,
                Some(TallyKind::RefusedBudget) => group.refused_budget += tally.count,
                Some(TallyKind::Withdrawn) => group.withdrawn += tally.count,
                None => {}
            }
            if TallyKind::parse(&tally.kind).is_some_and(TallyKind::is_duplicate) {
                group.duplicates_estimate_micros += tally.estimate_micros;
            }
        }
        groups.sort_by(|a, b| a.key.cmp(&b.key));
        let total = total_of(&groups);
        Ok(UsageReport {
            filter,
            grouping,
            currency: self.config().ledger.currency.clone(),
            groups,
            total,
        })
    }

    /// The ledger rows of a job's calls (its owner, or staff).
    pub async fn job_usage(&self, job: &Job) -> AppResult<Vec<LedgerEntry>> {
        let key = job.key();
        Ok(self
            .store()
            .run(move |conn| ledger_store::entries_of_job(conn, &key.id, &key.owner_id))
            .await?)
    }
}

fn total_of(groups: &[UsageGroup]) -> UsageGroup {
    let mut total = UsageGroup {
        key: "total".into(),
        ..UsageGroup::default()
    };
    for g in groups {
        let (t, l) = (&mut total.ledger, &g.ledger);
        t.calls += l.calls;
        t.prompt_tokens += l.prompt_tokens;
        t.completion_tokens += l.completion_tokens;
        t.cached_tokens += l.cached_tokens;
        t.cost_micros += l.cost_micros;
        t.won_calls += l.won_calls;
        t.lost_calls += l.lost_calls;
        t.lost_micros += l.lost_micros;
        t.late_calls += l.late_calls;
        t.late_micros += l.late_micros;
        t.failed_calls += l.failed_calls;
        t.rate_limited_calls += l.rate_limited_calls;
        t.unpriced_calls += l.unpriced_calls;
        t.estimated_calls += l.estimated_calls;
        total.replayed += g.replayed;
        total.joined += g.joined;
        total.duplicates_estimate_micros += g.duplicates_estimate_micros;
        total.refused_budget += g.refused_budget;
        total.withdrawn += g.withdrawn;
    }
    total
}

/// The limits in words, for the audit log.
pub fn describe_limits(limits: &BudgetLimits) -> String {
    let spend = limits
        .spend_micros
        .map(|m| format!("spend {}", crate::domain::ledger::format_micros(m)));
    let tokens = limits.tokens.map(|t| format!("{t} tokens"));
    [spend, tokens]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ")
        + " a month"
}
