//! Creating a job under an idempotency key.
//!
//! 1. The intent is fingerprinted from the exact text sent (RFC 8785, see
//!    `domain::jcs`); a number no double holds exactly is refused (422).
//! 2. A key that already made a job is answered from that job's row (200
//!    replay, or 409 for another payload) before anything is checked against
//!    today's configuration, so a retry after a configuration change or
//!    during a rolling deploy gets the answer its first request got. A twin
//!    of a request this process is still creating waits for it and answers
//!    from the job it commits, without a database round trip (`singleflight`).
//! 3. A new request is validated against the task's contract, then inserted
//!    under (owner, key); a concurrent twin that won the key is answered as in 2.
//! 4. The job's first attempt is queued; or, when this process's worker has
//!    a free slot and nothing queued ahead of it, it starts in the creating
//!    transaction (claimed and confirmed, as a claim would leave it) and is
//!    handed to the worker once that commits: one transaction fewer per job.
//!
//! A refusal stores nothing, so it never reserves the key.

use serde_json::Value;
use tracing::Instrument;

use super::singleflight::{Call, Leader, Shared};
use super::{App, AppError, AppResult, Attempt, Claim, Credential, Job, User};
use crate::contracts::TaskContract;
use crate::domain::ledger::TallyKind;
use crate::domain::{AttemptState, Fingerprint, IdempotencyKey, JobIntent, JsonText};
use crate::store::group_commit::{AfterCommit, Created};
use crate::store::jobs::{self as job_store, CreateOutcome, NewJob};
use crate::store::StoreError;

/// What a client asks for; `input` and `params` as the JSON text it sent.
#[derive(Debug, Clone)]
pub struct JobRequest {
    pub task: String,
    pub input: JsonText,
    /// A provider of the task's chain to try first.
    pub provider: Option<String>,
    pub params: Option<JsonText>,
    /// It came as a chat completion: a new job's task must be a chat route
    /// (checked with the rest of today's configuration, after the key's
    /// job, if any, has answered).
    pub chat_route: bool,
}

/// What a twin took from the leader it followed.
enum Followed {
    Job {
        job: Box<Job>,
        attempts: Vec<Attempt>,
    },
    Unavailable(String),
}

/// A job as creation left it.
#[derive(Debug)]
pub struct JobCreation {
    pub job: Job,
    pub attempts: Vec<Attempt>,
    /// True when the key had already made this job with the same payload.
    pub replayed: bool,
    /// True when the transaction that stored or found the job checked the
    /// caller's token as it stood then (`credentials`).
    confirmed: bool,
}

/// Checks the input against the task's rules: a JSON object whose required
/// fields are non-empty strings, valid against the input schema; a chat
/// route's, a Chat Completions request its codec reads. Returns a chat
/// request's own answer limit.
fn check_input(contract: &TaskContract, input: &Value) -> AppResult<Option<u64>> {
    let object = input
        .as_object()
        .ok_or_else(|| AppError::invalid_input("`input` must be a JSON object"))?;
    for field in &contract.definition.input_fields {
        match object.get(field) {
            Some(Value::String(s)) if !s.trim().is_empty() => {}
            _ => {
                return Err(AppError::InvalidInput {
                    detail: format!(
                        "task {:?} needs `input.{field}` as a non-empty string",
                        contract.name()
                    ),
                    field: Some(format!("input.{field}")),
                })
            }
        }
    }
    if contract.is_chat() {
        // Read once here: the limit it asks for is the reservation's.
        let read = crate::chat::openai_chat::read_request(input).map_err(|refused| {
            AppError::InvalidInput {
                detail: refused.message,
                field: Some(format!("input.{}", refused.param)),
            }
        })?;
        return Ok(read.request.sampling.max_tokens);
    }
    contract
        .check_input(input)
        .map_err(AppError::invalid_input)?;
    Ok(None)
}

/// A provider named by a client must belong to the task's chain.
pub fn require_in_chain(contract: &TaskContract, provider: Option<&str>) -> AppResult<()> {
    match provider {
        Some(p) if !contract.chain().iter().any(|c| c == p) => Err(AppError::UnknownProvider {
            provider: p.to_owned(),
            task: contract.name().to_owned(),
            chain: contract.chain().to_vec(),
        }),
        _ => Ok(()),
    }
}

/// The fingerprint of a request, or why its payload cannot have one.
fn fingerprint(
    task: &str,
    input: &JsonText,
    params: &JsonText,
    provider: Option<&str>,
) -> AppResult<Fingerprint> {
    Fingerprint::of(&JobIntent {
        task,
        input: input.as_str(),
        params: params.as_str(),
        provider,
    })
    .map_err(|e| AppError::InvalidBody {
        detail: e.to_string(),
        field: Some(e.field.to_owned()),
    })
}

/// Whether a stored job is the same intent as a request (`sent`, with its
/// `fingerprint`). The stored fingerprint decides; a row written under an
/// earlier way of fingerprinting is judged by its stored intent,
/// fingerprinted today's way; a request through a door of another wire
/// format is judged by its body as sent, whatever input an earlier release
/// derived from it.
fn same_intent(job: &Job, fingerprint: &Fingerprint, sent: &JobIntent<'_>) -> bool {
    if crate::domain::guards::is_replay(&job.fingerprint, fingerprint) {
        return true;
    }
    let stored = JobIntent {
        task: &job.task,
        input: job.input.as_str(),
        params: job.params.as_str(),
        provider: job.requested_provider.as_deref(),
    };
    Fingerprint::of(&stored).is_ok_and(|stored| &stored == fingerprint)
        || crate::domain::fingerprint::same_door_request(&stored, sent)
}

impl App {
    /// Creates the job `owner`'s key names, or returns the one it already
    /// made (same payload), or refuses (different payload: `KeyReused`).
    /// A token check taken from the kept grants (`credentials`) is
    /// confirmed by the creating transaction, or read again before
    /// anything else is answered.
    pub async fn create_job(
        &self,
        owner: &User,
        credential: &Credential,
        key: IdempotencyKey,
        request: JobRequest,
    ) -> AppResult<JobCreation> {
        let outcome = self.create_job_as(owner, credential, key, request).await;
        // Answered without the creating transaction's check (a twin's job,
        // a refused request's replay, a refusal): the token is read first.
        // A 401 was decided by such a read already.
        let unconfirmed = !matches!(&outcome, Ok(creation) if creation.confirmed)
            && !matches!(&outcome, Err(AppError::TokenRevoked));
        if unconfirmed {
            self.confirm_now(owner, credential).await?;
        }
        if let Ok(creation) = &outcome {
            trace_request(creation);
        }
        outcome
    }

    /// [`App::create_job`], its token check confirmed only where the
    /// creating transaction ran.
    async fn create_job_as(
        &self,
        owner: &User,
        credential: &Credential,
        key: IdempotencyKey,
        request: JobRequest,
    ) -> AppResult<JobCreation> {
        let params = self.checked_params(&request)?;
        let fingerprint = fingerprint(
            &request.task,
            &request.input,
            &params,
            request.provider.as_deref(),
        )?;
        // What the request was, to judge a key's job made by an earlier
        // release (`same_intent`); a door's input is derived from its
        // params, and is not compared there.
        let (sent_task, sent_params, sent_provider) = (
            request.task.clone(),
            params.clone(),
            request.provider.clone(),
        );
        let sent = JobIntent {
            task: &sent_task,
            input: "",
            params: sent_params.as_str(),
            provider: sent_provider.as_deref(),
        };
        let leader = match self.lead_or_follow(owner, &key).await {
            Ok(leader) => leader,
            Err(Followed::Job { job, attempts }) => {
                return self.replay_or_conflict(
                    *job,
                    attempts,
                    (&fingerprint, &sent),
                    TallyKind::Joined,
                )
            }
            Err(Followed::Unavailable(detail)) => return Err(AppError::Unavailable(detail)),
        };
        // A request that today's configuration refuses may still be the
        // retry of one it accepted: its key is looked up before the refusal
        // (a replay never depends on today's configuration). One that passes
        // goes straight to the insert, which finds an existing key itself.
        let validated =
            self.validate_new_job(owner, key.clone(), request, params, fingerprint.clone());
        let found = match &validated {
            Ok(new_job) => self
                .insert_confirmed(owner, credential, new_job)
                .await
                .map(Some),
            Err(_) => self.find_by_key(owner, &key).await,
        }
        .inspect_err(|error| {
            if let AppError::Unavailable(detail) = error {
                leader.share_unavailable(detail);
            }
        })?;
        let Some((outcome, attempts)) = found else {
            return Err(validated.expect_err("only a refused request looks its key up alone"));
        };
        let (CreateOutcome::Created(job) | CreateOutcome::Existing(job)) = &outcome;
        leader.share(job, &attempts);
        // Did the creating write confirm a kept token check? (A refused
        // request's key was only read.)
        let stored = matches!(outcome, CreateOutcome::Created(_));
        let confirmed = validated.is_ok() && credential.confirmed_by_creation(stored);
        let mut creation = match outcome {
            CreateOutcome::Created(job) => Ok(self.created(job, attempts)),
            // The key had made a job already (perhaps a concurrent request
            // with the same key won the insert).
            CreateOutcome::Existing(job) => {
                self.replay_or_conflict(job, attempts, (&fingerprint, &sent), TallyKind::Replayed)
            }
        };
        if let Ok(creation) = &mut creation {
            creation.confirmed = confirmed;
        }
        creation
    }

    /// The request's `params` (`{}` when it sent none), once it and its
    /// input are known to nest no deeper than allowed: before anything
    /// walks them (the fingerprint, the contract's checks).
    fn checked_params(&self, request: &JobRequest) -> AppResult<JsonText> {
        let params = request
            .params
            .clone()
            .unwrap_or_else(JsonText::empty_object);
        let max_depth = self.config().server.max_json_depth;
        for text in [&request.input, &params] {
            crate::domain::json_depth::check_nesting(text.as_str().as_bytes(), max_depth)?;
        }
        if !params.is_object() {
            return Err(AppError::InvalidBody {
                detail: "`params` must be a JSON object".into(),
                field: Some("params".into()),
            });
        }
        Ok(params)
    }

    /// Leads the creation under `owner`'s key, or waits for the twin
    /// already creating it in this process and takes what it shares
    /// (`Err`: the answer comes from there).
    async fn lead_or_follow(
        &self,
        owner: &User,
        key: &IdempotencyKey,
    ) -> Result<Leader<'_>, Followed> {
        loop {
            match self.inner.creations.join(&owner.id, key.as_str()) {
                Call::Leader(leader) => return Ok(leader),
                Call::Follower(follower) => match follower.wait().await.as_deref() {
                    Some(Shared::Job { job, attempts }) => {
                        self.metrics().twins_joined.inc();
                        tracing::debug!(job_id = %job.id, "answered from a twin in flight");
                        return Err(Followed::Job {
                            job: job.clone(),
                            attempts: attempts.clone(),
                        });
                    }
                    Some(Shared::Unavailable(detail)) => {
                        return Err(Followed::Unavailable(detail.clone()))
                    }
                    // The twin ended with nothing to share: join again.
                    None => continue,
                },
            }
        }
    }

    /// [`App::insert_job`] with the caller's token check: a kept one is
    /// confirmed by the creating transaction; if tokens or users changed
    /// since, the token is read again and the job inserted on that read
    /// (or the request refused with 401).
    async fn insert_confirmed(
        &self,
        owner: &User,
        credential: &Credential,
        new_job: &NewJob,
    ) -> AppResult<Created> {
        let mut kept_job = new_job.clone();
        kept_job.kept_grant = credential.grant_to_check();
        match self
            .insert_job(owner, kept_job, credential.kept_counter())
            .await
        {
            Err(AppError::TokenRevoked) if credential.is_kept() => {
                self.confirm_now(owner, credential).await?;
                self.insert_job(owner, new_job.clone(), None).await
            }
            other => other,
        }
    }

    /// Inserts a new job under its key (or finds the job the key already
    /// made). With a worker slot free, its first attempt starts in the
    /// creating transaction and goes to the worker once that commits (on
    /// the committing thread, even if this request is gone by then).
    async fn insert_job(
        &self,
        owner: &User,
        mut new_job: NewJob,
        kept_counter: Option<i64>,
    ) -> AppResult<Created> {
        let start = self
            .reserve_start(&new_job.provider)
            .inspect(|slot| new_job.start = Some(slot.start.clone()));
        let (task, provider) = (new_job.task.clone(), new_job.provider.clone());
        let after_commit = start.map(|start| -> AfterCommit {
            Box::new(move |(outcome, attempts): &Created| {
                if let (CreateOutcome::Created(job), [attempt]) = (outcome, attempts.as_slice()) {
                    start.run(Claim {
                        attempt: attempt.clone(),
                        job: job.clone(),
                    });
                }
            })
        });
        let span = tracing::info_span!(
            target: "onejob::trace",
            "job.create",
            onejob.job.id = %new_job.id,
            onejob.job.created = tracing::field::Empty,
        );
        self.store()
            .create_job(new_job, kept_counter, after_commit)
            .instrument(span.clone())
            .await
            .inspect(|(outcome, _)| {
                span.record(
                    "onejob.job.created",
                    matches!(outcome, CreateOutcome::Created(_)),
                );
            })
            .map_err(|error| match error {
                // Tokens or users changed since the caller's token was
                // checked: `create_job` reads it again.
                StoreError::CredentialsChanged => AppError::TokenRevoked,
                StoreError::BudgetExceeded(refused) => {
                    self.count_refused(&owner.id, &task, &provider);
                    AppError::budget_exceeded(&refused, &self.config().ledger.currency)
                }
                other => AppError::from(other),
            })
    }

    /// The job `owner`'s key already made, if any, with its attempts.
    async fn find_by_key(&self, owner: &User, key: &IdempotencyKey) -> AppResult<Option<Created>> {
        let (owner_id, key) = (owner.id.clone(), key.as_str().to_owned());
        Ok(self
            .store()
            .run(move |conn| {
                let found = job_store::job_of_key(conn, &owner_id, &key)?;
                Ok(found.map(|(job, attempts)| (CreateOutcome::Existing(job), attempts)))
            })
            .await?)
    }

    /// A job this request created: the worker woken for its queued
    /// attempt, and counted. Its line is at debug, as are each attempt's
    /// sending and winning: at info, those three lines were 7 % of the
    /// server's CPU per job (docs/benchmarks.md, "CPU per job"); the
    /// console, the metrics and the traces tell each job's story.
    fn created(&self, job: Job, attempts: Vec<Attempt>) -> JobCreation {
        if attempts.iter().any(|a| a.state == AttemptState::Queued) {
            self.notify_queued();
        }
        self.metrics().jobs_created.inc();
        tracing::debug!(job_id = %job.id, "job created");
        JobCreation {
            job,
            attempts,
            replayed: false,
            confirmed: false,
        }
    }

    fn replay_or_conflict(
        &self,
        job: Job,
        attempts: Vec<Attempt>,
        (fingerprint, sent): (&Fingerprint, &JobIntent<'_>),
        duplicate: TallyKind,
    ) -> AppResult<JobCreation> {
        if same_intent(&job, fingerprint, sent) {
            self.metrics().jobs_replayed.inc();
            self.count_duplicate(&job, duplicate);
            Ok(JobCreation {
                job,
                attempts,
                replayed: true,
                confirmed: false,
            })
        } else {
            self.metrics().key_conflicts.inc();
            Err(AppError::KeyReused { job_id: job.id })
        }
    }

    /// Keys this process is creating jobs for right now, and the twins
    /// waiting on them (for tests and diagnostics).
    pub fn creations_in_flight(&self) -> (usize, usize) {
        self.inner.creations.counts()
    }

    /// Checks a new request against today's configuration.
    fn validate_new_job(
        &self,
        owner: &User,
        key: IdempotencyKey,
        request: JobRequest,
        params: JsonText,
        fingerprint: Fingerprint,
    ) -> AppResult<NewJob> {
        let contracts = &self.config().contracts;
        let contract = contracts
            .get(&request.task)
            .ok_or_else(|| AppError::UnknownTask {
                task: request.task.clone(),
                tasks: contracts.names(),
            })?;
        if request.chat_route && !contract.is_chat() {
            return Err(AppError::UnknownTask {
                task: request.task.clone(),
                tasks: contracts
                    .iter()
                    .filter(|c| c.is_chat())
                    .map(|c| c.name().to_owned())
                    .collect(),
            });
        }
        require_in_chain(&contract, request.provider.as_deref())?;
        let input = request.input.value();
        let requested = check_input(&contract, &input)?;
        let reservation = self.reservation_for(&contract, &input, requested)?;
        Ok(NewJob {
            id: crate::domain::JobId::new(),
            reservation,
            owner_id: owner.id.clone(),
            key,
            task: contract.name().to_owned(),
            provider: request
                .provider
                .clone()
                .unwrap_or_else(|| contract.chain()[0].clone()),
            requested_provider: request.provider,
            input: request.input,
            params,
            fingerprint: fingerprint.as_str().to_owned(),
            start: None,
            // The request's span: the job's work continues its trace.
            trace_context: crate::telemetry::trace::current(),
            // Set by `insert_confirmed`, for a kept token check.
            kept_grant: None,
        })
    }
}

/// Names the job on the request's span; a request that joined a job made
/// by another is linked to that job's trace (docs/tracing.md).
fn trace_request(creation: &JobCreation) {
    if !crate::telemetry::enabled() {
        return;
    }
    let span = tracing::Span::current();
    let job = &creation.job;
    crate::telemetry::trace::attribute(&span, "onejob.job.id", job.id.to_string());
    crate::telemetry::trace::attribute(&span, "onejob.replayed", creation.replayed);
    if creation.replayed {
        crate::telemetry::trace::link_to_job(&span, job.trace().as_ref());
    }
}
