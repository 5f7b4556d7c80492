//! Completion webhooks in the database (docs/design.md, "Webhook outbox"):
//! endpoints, the outbox of events (one row per event and endpoint, written
//! in the transaction that changes the job's state), and the log of
//! delivery attempts. Every statement that locks or writes names the
//! owner; the reads that do not are listed in docs/scaling.md ("The
//! statement rule").
//!
//! Public functions (names are stable; new ones are added, none renamed):
//!
//! | function | what |
//! |---|---|
//! | [`create_endpoint`] | a new endpoint of an owner |
//! | [`get_endpoint`] | one endpoint by its key |
//! | [`list_endpoints`] | an owner's endpoints, newest first |
//! | [`list_all_endpoints`] | every owner's endpoints (admins), newest first |
//! | [`update_endpoint`] | change url / events / retry window / enabled |
//! | [`delete_endpoint`] | remove an endpoint, its events and deliveries |
//! | [`rotate_secret`] | next secret generation, with an overlap window |
//! | [`record_event`] | the outbox rows of a job's state change (inside its transaction) |
//! | [`get_event`] | one outbox row by its key |
//! | [`events_of_job`] | a job's outbox rows (every endpoint), oldest first |
//! | [`events_of_endpoint`] | an endpoint's outbox rows, newest first |
//! | [`events_of_endpoint_page`] | a page of them, older than an event |
//! | [`deliveries_of_event`] | an event's delivery attempts, in order |
//! | [`deliveries_of_endpoint`] | an endpoint's delivery attempts, newest first |
//! | [`deliveries_of_job`] | a job's delivery attempts (every endpoint), in order |
//! | [`resend`] | queue a delivered or dead event again (same webhook-id, same body) |
//! | [`claim_due`] | the delivery loop's claim, with a lease |
//! | [`record_delivery`] | a delivery attempt's result: delivered, retry later, dead; disabling |
//! | [`oldest_pending`] | when the oldest undelivered, not dead event started waiting |
//! | [`disabled_endpoints`] | how many endpoints are disabled |

use diesel::prelude::*;

use super::connection::{db_clock, per_backend, write_transaction};
use super::reads::get_job;
use super::rows::JobKey;
use super::schema::{
    attempts, webhook_deliveries, webhook_endpoints, webhook_events, webhook_subscriptions,
};
use super::{DbConnection, StoreError, StoreResult};
use crate::domain::webhook::{
    disabled_reason, event_body, new_webhook_id, next_attempt_at, should_disable, subscription,
    take_turns, DeliveryCaps, DeliveryOutcome, DisableRule, EventData, EventKind, EventState,
    InFlight, RetrySchedule,
};
use crate::domain::{AttemptState, Timestamp, UserId};

/// The most rows one listing returns.
pub const LIST_LIMIT: i64 = 200;

/// An endpoint named by its whole key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    pub id: String,
    pub owner_id: UserId,
}

/// An outbox row named by its whole key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventKey {
    pub id: String,
    pub owner_id: UserId,
}

/// A webhook endpoint's row. Its secret is not here: it is derived from
/// the server's webhook key, `id` and `generation`. What it is subscribed
/// to is in rows of its own ([`Endpoint`] has both).
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = webhook_endpoints)]
pub struct EndpointRow {
    pub id: String,
    pub owner_id: UserId,
    pub url: String,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub disabled_at: Option<Timestamp>,
    pub generation: i64,
    pub previous_generation_valid_until: Option<Timestamp>,
    /// 8 hex digits of the current secret's SHA-256.
    pub secret_fingerprint: String,
    pub retry_for_ms: i64,
    pub consecutive_failures: i32,
    pub failing_since: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl EndpointRow {
    pub fn key(&self) -> EndpointKey {
        EndpointKey {
            id: self.id.clone(),
            owner_id: self.owner_id.clone(),
        }
    }
}

/// A webhook endpoint with its subscription: its row, and the kinds of its
/// `webhook_subscriptions` rows. It reads as its row (`endpoint.url`).
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub row: EndpointRow,
    /// The kinds it is subscribed to, sorted (`domain::webhook::subscription`).
    pub events: Vec<EventKind>,
}

impl std::ops::Deref for Endpoint {
    type Target = EndpointRow;

    fn deref(&self) -> &EndpointRow {
        &self.row
    }
}

impl Endpoint {
    /// The kinds it is subscribed to.
    pub fn kinds(&self) -> &[EventKind] {
        &self.events
    }
}

/// Writes `kinds` as `key`'s subscription rows (one per kind, each once).
fn insert_subscriptions(
    conn: &mut DbConnection,
    key: &EndpointKey,
    kinds: &[EventKind],
) -> StoreResult<()> {
    // At most four rows: one statement each, the same on both backends.
    for kind in subscription(kinds) {
        diesel::insert_into(webhook_subscriptions::table)
            .values((
                webhook_subscriptions::owner_id.eq(&key.owner_id),
                webhook_subscriptions::endpoint_id.eq(&key.id),
                webhook_subscriptions::kind.eq(kind),
            ))
            .execute(conn)?;
    }
    Ok(())
}

/// Replaces `key`'s subscription rows by `kinds`.
fn replace_subscriptions(
    conn: &mut DbConnection,
    key: &EndpointKey,
    kinds: &[EventKind],
) -> StoreResult<()> {
    diesel::delete(
        webhook_subscriptions::table
            .filter(webhook_subscriptions::owner_id.eq(&key.owner_id))
            .filter(webhook_subscriptions::endpoint_id.eq(&key.id)),
    )
    .execute(conn)?;
    insert_subscriptions(conn, key, kinds)
}

/// `rows` with their subscriptions, given every subscription row of them
/// as (endpoint id, kind) (others are ignored).
fn with_subscriptions(rows: Vec<EndpointRow>, kinds: Vec<(String, EventKind)>) -> Vec<Endpoint> {
    rows.into_iter()
        .map(|row| {
            let mine: Vec<EventKind> = kinds
                .iter()
                .filter(|(endpoint, _)| *endpoint == row.id)
                .map(|(_, kind)| *kind)
                .collect();
            Endpoint {
                events: subscription(&mine),
                row,
            }
        })
        .collect()
}

/// The subscription rows of an owner's endpoints, as (endpoint id, kind).
fn subscriptions_of_owner(
    conn: &mut DbConnection,
    owner_id: &UserId,
) -> StoreResult<Vec<(String, EventKind)>> {
    Ok(webhook_subscriptions::table
        .filter(webhook_subscriptions::owner_id.eq(owner_id))
        .select((
            webhook_subscriptions::endpoint_id,
            webhook_subscriptions::kind,
        ))
        .load(conn)?)
}

/// An outbox row: one event for one endpoint.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = webhook_events)]
pub struct Event {
    pub id: String,
    pub owner_id: UserId,
    pub endpoint_id: String,
    pub job_id: String,
    /// `domain::webhook::EventKind` as text.
    pub kind: String,
    pub subject: String,
    /// `msg_<uuid>`: the `webhook-id` header, the same on every retry and
    /// resend.
    pub webhook_id: String,
    /// The exact bytes sent.
    pub body: String,
    /// `domain::webhook::EventState` as text.
    pub state: String,
    /// Delivery attempts made (claims), over its life.
    pub attempts: i32,
    pub next_attempt_at: Timestamp,
    pub window_start_at: Timestamp,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<Timestamp>,
    pub delivered_at: Option<Timestamp>,
    pub created_at: Timestamp,
    /// Its job's trace (`domain::TraceContext::to_column`), which each
    /// delivery continues.
    pub trace_context: Option<String>,
}

impl Event {
    pub fn key(&self) -> EventKey {
        EventKey {
            id: self.id.clone(),
            owner_id: self.owner_id.clone(),
        }
    }

    pub fn event_state(&self) -> Option<EventState> {
        EventState::parse(&self.state)
    }

    pub fn endpoint_key(&self) -> EndpointKey {
        EndpointKey {
            id: self.endpoint_id.clone(),
            owner_id: self.owner_id.clone(),
        }
    }
}

/// One delivery attempt.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Insertable)]
#[diesel(table_name = webhook_deliveries)]
pub struct Delivery {
    pub id: String,
    pub owner_id: UserId,
    pub event_id: String,
    pub endpoint_id: String,
    /// The event's attempt number, from 1.
    pub number: i32,
    /// `domain::webhook::DeliveryOutcome` as text.
    pub outcome: String,
    pub status_code: Option<i32>,
    pub error: Option<String>,
    pub latency_ms: i64,
    /// At most 1 KiB of the answer's body.
    pub response_body: Option<String>,
    pub at: Timestamp,
}

/// A new endpoint, checked by the caller (`domain::webhook::check_url`,
/// `parse_events`).
#[derive(Debug, Clone)]
pub struct NewEndpoint {
    pub id: String,
    pub owner_id: UserId,
    pub url: String,
    pub events: Vec<EventKind>,
    pub retry_for_ms: i64,
    /// The fingerprint of generation 1's secret.
    pub secret_fingerprint: String,
}

/// Inserts an endpoint (enabled, generation 1).
/// A registration the owner's endpoint cap refused: how many it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtEndpointCap(pub usize);

/// Registers `new`, unless its owner already has `cap` endpoints
/// (`domain::webhook::may_register_endpoint`). The count and the insert are
/// one owner's turn: on PostgreSQL under a transaction-scoped advisory lock
/// on the owner, so two registrations at once cannot both see room for one;
/// on SQLite under the write transaction's lock.
pub fn create_endpoint(
    conn: &mut DbConnection,
    new: &NewEndpoint,
    cap: usize,
    now: Timestamp,
) -> StoreResult<Result<Endpoint, AtEndpointCap>> {
    write_transaction(conn, |conn| {
        if let DbConnection::Postgresql(pg) = conn {
            diesel::sql_query("SELECT pg_advisory_xact_lock(hashtextextended($1, 77))")
                .bind::<diesel::sql_types::Text, _>(new.owner_id.as_str())
                .execute(pg)?;
        }
        let existing: i64 = webhook_endpoints::table
            .filter(webhook_endpoints::owner_id.eq(&new.owner_id))
            .count()
            .get_result(conn)?;
        let existing = usize::try_from(existing).unwrap_or(usize::MAX);
        if !crate::domain::webhook::may_register_endpoint(existing, cap) {
            return Ok(Err(AtEndpointCap(existing)));
        }
        diesel::insert_into(webhook_endpoints::table)
            .values((
                webhook_endpoints::id.eq(&new.id),
                webhook_endpoints::owner_id.eq(&new.owner_id),
                webhook_endpoints::url.eq(&new.url),
                webhook_endpoints::enabled.eq(true),
                webhook_endpoints::generation.eq(1i64),
                webhook_endpoints::secret_fingerprint.eq(&new.secret_fingerprint),
                webhook_endpoints::retry_for_ms.eq(new.retry_for_ms),
                webhook_endpoints::consecutive_failures.eq(0),
                webhook_endpoints::created_at.eq(now),
                webhook_endpoints::updated_at.eq(now),
            ))
            .execute(conn)?;
        let key = EndpointKey {
            id: new.id.clone(),
            owner_id: new.owner_id.clone(),
        };
        insert_subscriptions(conn, &key, &new.events)?;
        get_endpoint(conn, &key)?
            .ok_or(StoreError::NotFound)
            .map(Ok)
    })
}

pub fn get_endpoint(conn: &mut DbConnection, key: &EndpointKey) -> StoreResult<Option<Endpoint>> {
    let Some(row) = get_endpoint_row(conn, key)? else {
        return Ok(None);
    };
    let kinds: Vec<EventKind> = webhook_subscriptions::table
        .filter(webhook_subscriptions::owner_id.eq(&key.owner_id))
        .filter(webhook_subscriptions::endpoint_id.eq(&key.id))
        .select(webhook_subscriptions::kind)
        .load(conn)?;
    Ok(Some(Endpoint {
        row,
        events: subscription(&kinds),
    }))
}

/// An endpoint's row, without its subscription.
fn get_endpoint_row(
    conn: &mut DbConnection,
    key: &EndpointKey,
) -> StoreResult<Option<EndpointRow>> {
    Ok(webhook_endpoints::table
        .filter(webhook_endpoints::id.eq(&key.id))
        .filter(webhook_endpoints::owner_id.eq(&key.owner_id))
        .select(EndpointRow::as_select())
        .first(conn)
        .optional()?)
}

/// On PostgreSQL, locks the endpoint row until the transaction ends.
fn lock_endpoint(conn: &mut DbConnection, key: &EndpointKey) -> StoreResult<Option<EndpointRow>> {
    match conn {
        DbConnection::Postgresql(pg) => Ok(webhook_endpoints::table
            .filter(webhook_endpoints::id.eq(&key.id))
            .filter(webhook_endpoints::owner_id.eq(&key.owner_id))
            .select(EndpointRow::as_select())
            .for_update()
            .first(pg)
            .optional()?),
        DbConnection::Sqlite(_) => get_endpoint_row(conn, key),
    }
}

/// An owner's endpoints, newest first (at most [`LIST_LIMIT`]).
pub fn list_endpoints(conn: &mut DbConnection, owner_id: &UserId) -> StoreResult<Vec<Endpoint>> {
    let rows = webhook_endpoints::table
        .filter(webhook_endpoints::owner_id.eq(owner_id))
        .order(webhook_endpoints::id.desc())
        .limit(LIST_LIMIT)
        .select(EndpointRow::as_select())
        .load(conn)?;
    let kinds = subscriptions_of_owner(conn, owner_id)?;
    Ok(with_subscriptions(rows, kinds))
}

/// Every owner's endpoints, newest first (at most [`LIST_LIMIT`]): for
/// admins. On a distributed database these reads ask every shard.
pub fn list_all_endpoints(conn: &mut DbConnection) -> StoreResult<Vec<Endpoint>> {
    let rows: Vec<EndpointRow> = webhook_endpoints::table
        .order(webhook_endpoints::id.desc())
        .limit(LIST_LIMIT)
        .select(EndpointRow::as_select())
        .load(conn)?;
    let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let kinds = webhook_subscriptions::table
        .filter(webhook_subscriptions::endpoint_id.eq_any(ids))
        .select((
            webhook_subscriptions::endpoint_id,
            webhook_subscriptions::kind,
        ))
        .load(conn)?;
    Ok(with_subscriptions(rows, kinds))
}

/// What an update changes; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct EndpointChange {
    pub url: Option<String>,
    pub events: Option<Vec<EventKind>>,
    pub retry_for_ms: Option<i64>,
    /// `Some(true)` enables it again (clearing why it was disabled and its
    /// failure count); `Some(false)` disables it by hand.
    pub enabled: Option<bool>,
}

/// Applies `change`; `None` if there is no such endpoint.
pub fn update_endpoint(
    conn: &mut DbConnection,
    key: &EndpointKey,
    change: &EndpointChange,
    now: Timestamp,
) -> StoreResult<Option<Endpoint>> {
    write_transaction(conn, |conn| {
        let Some(endpoint) = lock_endpoint(conn, key)? else {
            return Ok(None);
        };
        let url = change.url.clone().unwrap_or(endpoint.url.clone());
        if let Some(events) = &change.events {
            replace_subscriptions(conn, key, events)?;
        }
        let retry_for_ms = change.retry_for_ms.unwrap_or(endpoint.retry_for_ms);
        let target = diesel::update(
            webhook_endpoints::table
                .filter(webhook_endpoints::id.eq(&key.id))
                .filter(webhook_endpoints::owner_id.eq(&key.owner_id)),
        );
        match change.enabled {
            Some(true) if !endpoint.enabled => target
                .set((
                    webhook_endpoints::url.eq(url),
                    webhook_endpoints::retry_for_ms.eq(retry_for_ms),
                    webhook_endpoints::enabled.eq(true),
                    webhook_endpoints::disabled_reason.eq(None::<String>),
                    webhook_endpoints::disabled_at.eq(None::<i64>),
                    webhook_endpoints::consecutive_failures.eq(0),
                    webhook_endpoints::failing_since.eq(None::<Timestamp>),
                    webhook_endpoints::updated_at.eq(now),
                ))
                .execute(conn)?,
            Some(false) if endpoint.enabled => target
                .set((
                    webhook_endpoints::url.eq(url),
                    webhook_endpoints::retry_for_ms.eq(retry_for_ms),
                    webhook_endpoints::enabled.eq(false),
                    webhook_endpoints::disabled_reason.eq("disabled by its owner"),
                    webhook_endpoints::disabled_at.eq(now),
                    webhook_endpoints::updated_at.eq(now),
                ))
                .execute(conn)?,
            _ => target
                .set((
                    webhook_endpoints::url.eq(url),
                    webhook_endpoints::retry_for_ms.eq(retry_for_ms),
                    webhook_endpoints::updated_at.eq(now),
                ))
                .execute(conn)?,
        };
        get_endpoint(conn, key)
    })
}

/// Removes an endpoint with its outbox rows and their deliveries. Whether
/// there was one.
pub fn delete_endpoint(conn: &mut DbConnection, key: &EndpointKey) -> StoreResult<bool> {
    write_transaction(conn, |conn| {
        let removed = diesel::delete(
            webhook_endpoints::table
                .filter(webhook_endpoints::id.eq(&key.id))
                .filter(webhook_endpoints::owner_id.eq(&key.owner_id)),
        )
        .execute(conn)?;
        Ok(removed == 1)
    })
}

/// Moves the endpoint to its next secret generation: the previous one
/// still signs deliveries until `now + overlap_ms`. `fingerprint` gives
/// the new generation's secret fingerprint. `None` if there is no such
/// endpoint.
pub fn rotate_secret(
    conn: &mut DbConnection,
    key: &EndpointKey,
    overlap_ms: i64,
    fingerprint: &dyn Fn(i64) -> String,
    now: Timestamp,
) -> StoreResult<Option<Endpoint>> {
    write_transaction(conn, |conn| {
        let Some(endpoint) = lock_endpoint(conn, key)? else {
            return Ok(None);
        };
        let generation = endpoint.generation + 1;
        diesel::update(
            webhook_endpoints::table
                .filter(webhook_endpoints::id.eq(&key.id))
                .filter(webhook_endpoints::owner_id.eq(&key.owner_id))
                .filter(webhook_endpoints::generation.eq(endpoint.generation)),
        )
        .set((
            webhook_endpoints::generation.eq(generation),
            webhook_endpoints::previous_generation_valid_until.eq(now + overlap_ms),
            webhook_endpoints::secret_fingerprint.eq(fingerprint(generation)),
            webhook_endpoints::updated_at.eq(now),
        ))
        .execute(conn)?;
        get_endpoint(conn, key)
    })
}

/// Writes the outbox rows of `kind` for the job: one per enabled endpoint
/// of the job's owner subscribed to `kind`, each with a fresh `webhook-id`
/// and the body fixed now. Call it inside the transaction that changes the
/// job's state, after the change: the rows commit or roll back with it.
/// For [`EventKind::JobUnknown`] the subject is the job's unknown attempt;
/// an occurrence already recorded (same endpoint, job, kind and subject)
/// is left as it is. Returns how many rows it wrote.
/// [`record_event`]'s look-up of the endpoints an event goes to, as a SQL
/// condition for a statement that already runs in the same transaction
/// (PostgreSQL's compare-and-swap answers it, a round trip fewer when it
/// is false): `owner` and `kind` are the statement's placeholders for the
/// owner and for the event's kind (its text).
pub(super) fn any_endpoint_subscribed_sql(owner: &str, kind: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM webhook_subscriptions s JOIN webhook_endpoints e \
         ON e.id = s.endpoint_id AND e.owner_id = s.owner_id \
         WHERE s.owner_id = {owner} AND e.owner_id = {owner} AND s.kind = {kind} \
         AND e.enabled = TRUE)"
    )
}

pub fn record_event(
    conn: &mut DbConnection,
    job_key: &JobKey,
    kind: EventKind,
    now: Timestamp,
) -> StoreResult<usize> {
    // On the concrete connection, whose cache finds the statement by its
    // type: it runs on every finished job, most often to find nothing.
    let subscribed = webhook_endpoints::table
        .inner_join(
            webhook_subscriptions::table.on(webhook_subscriptions::endpoint_id
                .eq(webhook_endpoints::id)
                .and(webhook_subscriptions::owner_id.eq(webhook_endpoints::owner_id))),
        )
        .filter(webhook_endpoints::owner_id.eq(&job_key.owner_id))
        .filter(webhook_subscriptions::owner_id.eq(&job_key.owner_id))
        .filter(webhook_subscriptions::kind.eq(kind))
        .filter(webhook_endpoints::enabled.eq(true))
        .select(webhook_endpoints::id);
    let endpoints: Vec<String> = per_backend!(&mut *conn, |c| subscribed.load(c))?;
    if endpoints.is_empty() {
        return Ok(0);
    }
    let job = get_job(conn, job_key)?;
    let attempt_id: Option<String> = match kind {
        EventKind::JobUnknown => attempts::table
            .filter(attempts::job_id.eq(&job_key.id))
            .filter(attempts::owner_id.eq(&job_key.owner_id))
            .filter(attempts::state.eq(AttemptState::Unknown))
            .select(attempts::id)
            .first::<crate::domain::AttemptId>(conn)
            .optional()?
            .map(|id| id.to_string()),
        _ => None,
    };
    let result = job.result.as_ref().map(|r| r.as_str().to_owned());
    let completed_by = job.completed_by.as_ref().map(|a| a.to_string());
    let failure_reason = job.failure().map(|r| r.for_staff());
    let data = EventData {
        job_id: job.id.as_str(),
        owner_id: job.owner_id.as_str(),
        status: job.status.as_str(),
        idempotency_key: &job.idempotency_key,
        task: &job.task,
        provider: &job.provider,
        completed_by: completed_by.as_deref(),
        failure_reason: failure_reason.as_deref(),
        result: result.as_deref(),
        attempt_id: attempt_id.as_deref(),
        created_at: job.created_at,
        updated_at: job.updated_at,
    };
    let body = event_body(kind, &data, now);
    let subject = attempt_id.unwrap_or_default();
    let mut written = 0;
    for endpoint_id in endpoints {
        let row = (
            webhook_events::id.eq(uuid::Uuid::now_v7().to_string()),
            webhook_events::owner_id.eq(&job_key.owner_id),
            webhook_events::endpoint_id.eq(endpoint_id),
            webhook_events::job_id.eq(job_key.id.as_str()),
            webhook_events::kind.eq(kind.as_str()),
            webhook_events::subject.eq(&subject),
            webhook_events::webhook_id.eq(new_webhook_id()),
            webhook_events::body.eq(&body),
            webhook_events::state.eq(EventState::Pending.as_str()),
            webhook_events::attempts.eq(0),
            webhook_events::next_attempt_at.eq(now),
            webhook_events::window_start_at.eq(now),
            webhook_events::created_at.eq(now),
            webhook_events::trace_context.eq(job.trace_context.as_deref()),
        );
        let insert = diesel::insert_into(webhook_events::table).values(row);
        written += per_backend!(conn, |c| insert.on_conflict_do_nothing().execute(c)?);
    }
    Ok(written)
}

pub fn get_event(conn: &mut DbConnection, key: &EventKey) -> StoreResult<Option<Event>> {
    Ok(webhook_events::table
        .filter(webhook_events::id.eq(&key.id))
        .filter(webhook_events::owner_id.eq(&key.owner_id))
        .select(Event::as_select())
        .first(conn)
        .optional()?)
}

/// A job's outbox rows, for every endpoint, oldest first.
pub fn events_of_job(conn: &mut DbConnection, job: &JobKey) -> StoreResult<Vec<Event>> {
    Ok(webhook_events::table
        .filter(webhook_events::job_id.eq(job.id.as_str()))
        .filter(webhook_events::owner_id.eq(&job.owner_id))
        .order(webhook_events::id.asc())
        .limit(LIST_LIMIT)
        .select(Event::as_select())
        .load(conn)?)
}

/// An endpoint's outbox rows, newest first (at most [`LIST_LIMIT`]).
pub fn events_of_endpoint(conn: &mut DbConnection, key: &EndpointKey) -> StoreResult<Vec<Event>> {
    Ok(webhook_events::table
        .filter(webhook_events::endpoint_id.eq(&key.id))
        .filter(webhook_events::owner_id.eq(&key.owner_id))
        .order(webhook_events::id.desc())
        .limit(LIST_LIMIT)
        .select(Event::as_select())
        .load(conn)?)
}

/// A page of an endpoint's outbox rows, newest first (ids are
/// time-ordered): at most `limit` (the caller bounds it), those older
/// than the event `before` when given.
pub fn events_of_endpoint_page(
    conn: &mut DbConnection,
    key: &EndpointKey,
    before: Option<&str>,
    limit: i64,
) -> StoreResult<Vec<Event>> {
    let mut query = webhook_events::table
        .filter(webhook_events::endpoint_id.eq(&key.id))
        .filter(webhook_events::owner_id.eq(&key.owner_id))
        .order(webhook_events::id.desc())
        .limit(limit.max(1))
        .select(Event::as_select())
        .into_boxed();
    if let Some(before) = before {
        query = query.filter(webhook_events::id.lt(before.to_owned()));
    }
    Ok(query.load(conn)?)
}

/// An event's delivery attempts, in order.
pub fn deliveries_of_event(conn: &mut DbConnection, key: &EventKey) -> StoreResult<Vec<Delivery>> {
    Ok(webhook_deliveries::table
        .filter(webhook_deliveries::event_id.eq(&key.id))
        .filter(webhook_deliveries::owner_id.eq(&key.owner_id))
        .order(webhook_deliveries::number.asc())
        .limit(LIST_LIMIT)
        .select(Delivery::as_select())
        .load(conn)?)
}

/// A page of an endpoint's delivery attempts, newest first (by time, then
/// id): at most `limit` (capped at [`LIST_LIMIT`]), those after the
/// delivery `before` in that order when given. A `before` that is not one
/// of the endpoint's deliveries gives an empty page.
pub fn deliveries_of_endpoint(
    conn: &mut DbConnection,
    key: &EndpointKey,
    before: Option<&str>,
    limit: i64,
) -> StoreResult<Vec<Delivery>> {
    use webhook_deliveries::dsl as d;
    let mut query = d::webhook_deliveries
        .filter(d::endpoint_id.eq(&key.id))
        .filter(d::owner_id.eq(&key.owner_id))
        .order((d::at.desc(), d::id.desc()))
        .limit(limit.clamp(1, LIST_LIMIT))
        .select(Delivery::as_select())
        .into_boxed();
    if let Some(before) = before {
        let cursor: Option<Timestamp> = d::webhook_deliveries
            .filter(d::id.eq(before))
            .filter(d::endpoint_id.eq(&key.id))
            .filter(d::owner_id.eq(&key.owner_id))
            .select(d::at)
            .first(conn)
            .optional()?;
        let Some(at) = cursor else {
            return Ok(Vec::new());
        };
        query = query.filter(
            d::at
                .lt(at)
                .or(d::at.eq(at).and(d::id.lt(before.to_owned()))),
        );
    }
    Ok(query.load(conn)?)
}

/// A job's delivery attempts, for every endpoint, in the order they were
/// made (at most [`LIST_LIMIT`]).
pub fn deliveries_of_job(conn: &mut DbConnection, job: &JobKey) -> StoreResult<Vec<Delivery>> {
    let events: Vec<String> = events_of_job(conn, job)?
        .into_iter()
        .map(|e| e.id)
        .collect();
    if events.is_empty() {
        return Ok(Vec::new());
    }
    Ok(webhook_deliveries::table
        .filter(webhook_deliveries::owner_id.eq(&job.owner_id))
        .filter(webhook_deliveries::event_id.eq_any(events))
        .order((webhook_deliveries::at.asc(), webhook_deliveries::id.asc()))
        .limit(LIST_LIMIT)
        .select(Delivery::as_select())
        .load(conn)?)
}

/// What [`resend`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Resent {
    /// Queued again: same `webhook-id`, same body, a fresh retry window.
    Queued(Event),
    /// It is still pending: its next attempt is coming anyway.
    StillPending(Event),
    NotFound,
}

/// Queues a delivered or dead event again, due now, with the same
/// `webhook-id` and body, and a fresh retry window.
pub fn resend(conn: &mut DbConnection, key: &EventKey, now: Timestamp) -> StoreResult<Resent> {
    write_transaction(conn, |conn| {
        let changed = diesel::update(
            webhook_events::table
                .filter(webhook_events::id.eq(&key.id))
                .filter(webhook_events::owner_id.eq(&key.owner_id))
                .filter(
                    webhook_events::state
                        .eq_any([EventState::Delivered.as_str(), EventState::Dead.as_str()]),
                ),
        )
        .set((
            webhook_events::state.eq(EventState::Pending.as_str()),
            webhook_events::delivered_at.eq(None::<i64>),
            webhook_events::next_attempt_at.eq(now),
            webhook_events::window_start_at.eq(now),
            webhook_events::lease_owner.eq(None::<String>),
            webhook_events::lease_expires_at.eq(None::<i64>),
        ))
        .execute(conn)?;
        Ok(match (changed, get_event(conn, key)?) {
            (_, None) => Resent::NotFound,
            (1, Some(event)) => Resent::Queued(event),
            (_, Some(event)) => Resent::StillPending(event),
        })
    })
}

/// An event this process now holds for delivery, with its endpoint as it
/// was when claimed.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub event: Event,
    pub endpoint: EndpointRow,
}

/// Claims up to `limit` due events for `lease_owner` until the database's
/// clock plus `lease_ms`, counting the attempt (`attempts + 1` is this
/// delivery's number). An event is due when it is pending, its
/// `next_attempt_at` has come (database clock), no other lease on it is
/// running and its endpoint is enabled.
///
/// As `store::queue::claim_batch`: candidates are read without a lock
/// (one read across owners, a listed fan-out read of docs/scaling.md),
/// then each owner's are locked (PostgreSQL `FOR UPDATE SKIP LOCKED`, so
/// processes never both claim one; SQLite: the write transaction's lock)
/// and claimed by a guarded `UPDATE` naming the owner, the final guard.
/// On PostgreSQL each owner's claim is a transaction of its own (on Citus,
/// one shard: no commit across nodes); what committed before an owner's
/// failure is returned, to be sent. On SQLite the whole claim is one
/// transaction.
pub fn claim_due(
    conn: &mut DbConnection,
    lease_owner: &str,
    lease_ms: i64,
    limit: i64,
) -> StoreResult<Vec<Claimed>> {
    let caps = DeliveryCaps {
        total: usize::try_from(limit).unwrap_or(0),
        per_owner: usize::MAX,
        per_endpoint: usize::MAX,
    };
    claim_due_in_turns(conn, lease_owner, lease_ms, caps, &InFlight::default())
}

/// [`claim_due`] in turns between owners (`domain::webhook::take_turns`):
/// at most the free slots of `caps` given what is `busy`, no owner or
/// endpoint past its cap. Owners and endpoints at their cap are not even
/// read, so that one owner's backlog never hides another's due events.
pub fn claim_due_in_turns(
    conn: &mut DbConnection,
    lease_owner: &str,
    lease_ms: i64,
    caps: DeliveryCaps,
    busy: &InFlight,
) -> StoreResult<Vec<Claimed>> {
    if caps.total <= busy.total() {
        return Ok(Vec::new());
    }
    match conn {
        DbConnection::Sqlite(_) => write_transaction(conn, |conn| {
            claim_owner_by_owner(conn, lease_owner, lease_ms, caps, busy)
        }),
        DbConnection::Postgresql(_) => {
            claim_owner_by_owner(conn, lease_owner, lease_ms, caps, busy)
        }
    }
}

fn claim_owner_by_owner(
    conn: &mut DbConnection,
    lease_owner: &str,
    lease_ms: i64,
    caps: DeliveryCaps,
    busy: &InFlight,
) -> StoreResult<Vec<Claimed>> {
    let now = db_clock(conn)?;
    let one_transaction = matches!(conn, DbConnection::Sqlite(_));
    let room = caps.total.saturating_sub(busy.total());
    let mut claimed: Vec<Claimed> = Vec::new();
    for (owner_id, ids) in due_candidates(conn, now, room, caps, busy)? {
        let owners = if one_transaction {
            claim_of_owner(conn, &owner_id, &ids, lease_owner, lease_ms, now)
        } else {
            write_transaction(conn, |conn| {
                claim_of_owner(conn, &owner_id, &ids, lease_owner, lease_ms, now)
            })
        };
        match owners {
            Ok(owners) => claimed.extend(owners),
            Err(error) if !one_transaction && !claimed.is_empty() => {
                tracing::warn!(%error, owner = %owner_id, "one owner's webhook claim failed; the others' are sent");
                break;
            }
            Err(error) => return Err(error),
        }
    }
    claimed.sort_by(|a, b| {
        (a.event.next_attempt_at, &a.event.id).cmp(&(b.event.next_attempt_at, &b.event.id))
    });
    Ok(claimed)
}

/// Due events, read without a lock, oldest first: four times the free
/// slots (rows another process is claiming leave others; turns need a
/// choice), of owners and endpoints with room only. Those a claim takes,
/// by turns, grouped by owner.
fn due_candidates(
    conn: &mut DbConnection,
    now: Timestamp,
    room: usize,
    caps: DeliveryCaps,
    busy: &InFlight,
) -> StoreResult<Vec<(UserId, Vec<String>)>> {
    let (full_owners, full_endpoints) = busy.full(caps);
    let rows: Vec<(String, UserId, String)> = webhook_events::table
        .inner_join(
            webhook_endpoints::table.on(webhook_endpoints::id
                .eq(webhook_events::endpoint_id)
                .and(webhook_endpoints::owner_id.eq(webhook_events::owner_id))),
        )
        .filter(webhook_events::state.eq(EventState::Pending.as_str()))
        .filter(webhook_events::next_attempt_at.le(now))
        .filter(
            webhook_events::lease_expires_at
                .is_null()
                .or(webhook_events::lease_expires_at.lt(now)),
        )
        .filter(webhook_endpoints::enabled.eq(true))
        .filter(webhook_events::owner_id.ne_all(full_owners))
        .filter(webhook_events::endpoint_id.ne_all(full_endpoints))
        .order((
            webhook_events::next_attempt_at.asc(),
            webhook_events::id.asc(),
        ))
        .select((
            webhook_events::id,
            webhook_events::owner_id,
            webhook_events::endpoint_id,
        ))
        .limit(i64::try_from(room.saturating_mul(4)).unwrap_or(i64::MAX))
        .load(conn)?;
    let due: Vec<(&str, &str)> = rows
        .iter()
        .map(|(_, owner, endpoint)| (owner.as_str(), endpoint.as_str()))
        .collect();
    let mut owners: Vec<(UserId, Vec<String>)> = Vec::new();
    for index in take_turns(&due, caps, busy) {
        let (id, owner, _) = &rows[index];
        match owners.iter_mut().find(|(o, _)| o == owner) {
            Some((_, ids)) => ids.push(id.clone()),
            None => owners.push((owner.clone(), vec![id.clone()])),
        }
    }
    Ok(owners)
}

/// One owner's part of a claim: its candidates locked, claimed by the
/// guarded update, each with its endpoint. Every statement names the owner.
fn claim_of_owner(
    conn: &mut DbConnection,
    owner_id: &UserId,
    ids: &[String],
    lease_owner: &str,
    lease_ms: i64,
    now: Timestamp,
) -> StoreResult<Vec<Claimed>> {
    let ids: Vec<String> = match conn {
        DbConnection::Postgresql(pg) => webhook_events::table
            .filter(webhook_events::owner_id.eq(owner_id))
            .filter(webhook_events::id.eq_any(ids))
            .filter(webhook_events::state.eq(EventState::Pending.as_str()))
            .select(webhook_events::id)
            .for_update()
            .skip_locked()
            .load(pg)?,
        DbConnection::Sqlite(_) => ids.to_vec(),
    };
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let claim = diesel::update(
        webhook_events::table
            .filter(webhook_events::owner_id.eq(owner_id))
            .filter(webhook_events::id.eq_any(&ids))
            .filter(webhook_events::state.eq(EventState::Pending.as_str()))
            .filter(webhook_events::next_attempt_at.le(now))
            .filter(
                webhook_events::lease_expires_at
                    .is_null()
                    .or(webhook_events::lease_expires_at.lt(now)),
            ),
    )
    .set((
        webhook_events::lease_owner.eq(lease_owner),
        webhook_events::lease_expires_at.eq(now + lease_ms),
        webhook_events::attempts.eq(webhook_events::attempts + 1),
    ));
    let events: Vec<Event> =
        per_backend!(conn, |c| claim.returning(Event::as_returning()).load(c)?);
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let endpoint_ids: Vec<&str> = events.iter().map(|e| e.endpoint_id.as_str()).collect();
    let endpoints: Vec<EndpointRow> = webhook_endpoints::table
        .filter(webhook_endpoints::owner_id.eq(owner_id))
        .filter(webhook_endpoints::id.eq_any(endpoint_ids))
        .select(EndpointRow::as_select())
        .load(conn)?;
    events
        .into_iter()
        .map(|event| {
            let endpoint = endpoints
                .iter()
                .find(|e| e.id == event.endpoint_id)
                .cloned()
                .ok_or_else(|| {
                    StoreError::corrupt(format!("webhook event {} has no endpoint", event.id))
                })?;
            Ok(Claimed { event, endpoint })
        })
        .collect()
}

/// What one delivery attempt found.
#[derive(Debug, Clone)]
pub struct Attempted {
    pub outcome: DeliveryOutcome,
    pub status_code: Option<i32>,
    /// Why it failed (never a secret).
    pub error: Option<String>,
    pub latency_ms: i64,
    /// At most 1 KiB (`domain::webhook::truncate_response`).
    pub response_body: Option<String>,
}

/// How failures are followed up.
#[derive(Debug, Clone, Copy)]
pub struct FollowUp {
    pub schedule: RetrySchedule,
    pub disable: DisableRule,
    /// Uniform in [0, 1): the retry's jitter.
    pub jitter: f64,
}

/// What [`record_delivery`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Recorded {
    Delivered,
    /// Tried again at this time.
    RetryAt(Timestamp),
    /// Its retry window is over.
    Dead,
    /// The lease had passed to another process (or the event was
    /// resent, or removed): nothing recorded.
    LeaseLost,
}

/// Records the result of `claimed`'s delivery attempt, in one transaction,
/// only while `lease_owner` still holds it: the delivery row; the event
/// delivered, or scheduled again by `domain::webhook::next_attempt_at`, or
/// dead; the endpoint's run of failures reset by a success, or grown, and
/// the endpoint disabled once `domain::webhook::should_disable` says so.
/// Returns what happened and whether this attempt disabled the endpoint.
pub fn record_delivery(
    conn: &mut DbConnection,
    claimed: &Claimed,
    lease_owner: &str,
    attempted: &Attempted,
    follow_up: FollowUp,
    now: Timestamp,
) -> StoreResult<(Recorded, bool)> {
    write_transaction(conn, |conn| {
        // The endpoint first, then the event: the order every writer keeps.
        let endpoint = lock_endpoint(conn, &claimed.endpoint.key())?;
        let event = held_event(conn, claimed, lease_owner)?;
        let (Some(event), Some(endpoint)) = (event, endpoint) else {
            return Ok((Recorded::LeaseLost, false));
        };
        diesel::insert_into(webhook_deliveries::table)
            .values(&delivery_row(&event, attempted, now))
            .execute(conn)?;
        let this_endpoint = diesel::update(
            webhook_endpoints::table
                .filter(webhook_endpoints::id.eq(&endpoint.id))
                .filter(webhook_endpoints::owner_id.eq(&endpoint.owner_id)),
        );
        if attempted.outcome == DeliveryOutcome::Delivered {
            write_event(conn, &event, lease_owner, Recorded::Delivered, now)?;
            if endpoint.consecutive_failures != 0 || endpoint.failing_since.is_some() {
                this_endpoint
                    .set((
                        webhook_endpoints::consecutive_failures.eq(0),
                        webhook_endpoints::failing_since.eq(None::<Timestamp>),
                    ))
                    .execute(conn)?;
            }
            return Ok((Recorded::Delivered, false));
        }
        let recorded = match retry_at(conn, &event, &endpoint, follow_up, now)? {
            Some(at) => Recorded::RetryAt(at),
            None => Recorded::Dead,
        };
        write_event(conn, &event, lease_owner, recorded, now)?;
        // The endpoint's run of failures grown by one, and the endpoint
        // disabled once `domain::webhook::should_disable` says so.
        let failures = (endpoint.consecutive_failures.max(0) as u32).saturating_add(1);
        let since = endpoint.failing_since.unwrap_or(now);
        let disable = endpoint.enabled && should_disable(follow_up.disable, failures, since, now);
        let run = (
            webhook_endpoints::consecutive_failures.eq(failures.min(i32::MAX as u32) as i32),
            webhook_endpoints::failing_since.eq(since),
        );
        if disable {
            this_endpoint
                .set((
                    run,
                    webhook_endpoints::enabled.eq(false),
                    webhook_endpoints::disabled_reason.eq(disabled_reason(failures, since, now)),
                    webhook_endpoints::disabled_at.eq(now),
                    webhook_endpoints::updated_at.eq(now),
                ))
                .execute(conn)?;
        } else {
            this_endpoint.set(run).execute(conn)?;
        }
        Ok((recorded, disable))
    })
}

/// `claimed`'s event, locked on PostgreSQL, while `lease_owner` still holds
/// it at the attempt it claimed; `None` once it does not.
fn held_event(
    conn: &mut DbConnection,
    claimed: &Claimed,
    lease_owner: &str,
) -> StoreResult<Option<Event>> {
    let key = claimed.event.key();
    macro_rules! held {
        () => {
            webhook_events::table
                .filter(webhook_events::id.eq(&key.id))
                .filter(webhook_events::owner_id.eq(&key.owner_id))
                .filter(webhook_events::state.eq(EventState::Pending.as_str()))
                .filter(webhook_events::lease_owner.eq(lease_owner))
                .filter(webhook_events::attempts.eq(claimed.event.attempts))
                .select(Event::as_select())
        };
    }
    Ok(match conn {
        DbConnection::Postgresql(pg) => held!().for_update().first(pg).optional()?,
        DbConnection::Sqlite(_) => held!().first(conn).optional()?,
    })
}

/// The row of one delivery attempt of `event`.
fn delivery_row(event: &Event, attempted: &Attempted, now: Timestamp) -> Delivery {
    Delivery {
        id: uuid::Uuid::now_v7().to_string(),
        owner_id: event.owner_id.clone(),
        event_id: event.id.clone(),
        endpoint_id: event.endpoint_id.clone(),
        number: event.attempts.max(1),
        outcome: attempted.outcome.as_str().to_owned(),
        status_code: attempted.status_code,
        error: attempted.error.clone(),
        latency_ms: attempted.latency_ms.max(0),
        response_body: attempted.response_body.clone(),
        at: now,
    }
}

/// When a failed event is tried again (`domain::webhook::next_attempt_at`
/// over the failed attempts of its current window, this one included), or
/// `None`: its window has no retry left.
fn retry_at(
    conn: &mut DbConnection,
    event: &Event,
    endpoint: &EndpointRow,
    follow_up: FollowUp,
    now: Timestamp,
) -> StoreResult<Option<Timestamp>> {
    let failed_in_window: i64 = webhook_deliveries::table
        .filter(webhook_deliveries::event_id.eq(&event.id))
        .filter(webhook_deliveries::owner_id.eq(&event.owner_id))
        .filter(webhook_deliveries::at.ge(event.window_start_at))
        .filter(webhook_deliveries::outcome.ne(DeliveryOutcome::Delivered.as_str()))
        .count()
        .get_result(conn)?;
    Ok(next_attempt_at(
        follow_up.schedule,
        failed_in_window.clamp(1, u32::MAX as i64) as u32,
        now,
        event.window_start_at,
        endpoint.retry_for_ms,
        follow_up.jitter,
    ))
}

/// The held event as its attempt left it (`recorded`), its lease released.
fn write_event(
    conn: &mut DbConnection,
    event: &Event,
    lease_owner: &str,
    recorded: Recorded,
    now: Timestamp,
) -> StoreResult<()> {
    let this_event = diesel::update(
        webhook_events::table
            .filter(webhook_events::id.eq(&event.id))
            .filter(webhook_events::owner_id.eq(&event.owner_id))
            .filter(webhook_events::lease_owner.eq(lease_owner)),
    );
    let released = (
        webhook_events::lease_owner.eq(None::<String>),
        webhook_events::lease_expires_at.eq(None::<i64>),
    );
    match recorded {
        Recorded::Delivered => this_event
            .set((
                webhook_events::state.eq(EventState::Delivered.as_str()),
                webhook_events::delivered_at.eq(now),
                released,
            ))
            .execute(conn)?,
        Recorded::RetryAt(at) => this_event
            .set((webhook_events::next_attempt_at.eq(at), released))
            .execute(conn)?,
        Recorded::Dead => this_event
            .set((
                webhook_events::state.eq(EventState::Dead.as_str()),
                released,
            ))
            .execute(conn)?,
        Recorded::LeaseLost => 0,
    };
    Ok(())
}

/// When the oldest pending event of an enabled endpoint started waiting
/// (its creation or latest resend), if any. On a distributed
/// database this read asks every shard.
pub fn oldest_pending(conn: &mut DbConnection) -> StoreResult<Option<Timestamp>> {
    Ok(webhook_events::table
        .inner_join(
            webhook_endpoints::table.on(webhook_endpoints::id
                .eq(webhook_events::endpoint_id)
                .and(webhook_endpoints::owner_id.eq(webhook_events::owner_id))),
        )
        .filter(webhook_events::state.eq(EventState::Pending.as_str()))
        .filter(webhook_endpoints::enabled.eq(true))
        .order(webhook_events::window_start_at.asc())
        .select(webhook_events::window_start_at)
        .first::<Timestamp>(conn)
        .optional()?)
}

/// How many endpoints are disabled (by their owner or for failing). On a
/// distributed database this read asks every shard.
pub fn disabled_endpoints(conn: &mut DbConnection) -> StoreResult<i64> {
    Ok(webhook_endpoints::table
        .filter(webhook_endpoints::enabled.eq(false))
        .count()
        .get_result(conn)?)
}
