//! The ledger's rules: what a call cost at the price in force when its
//! answer was recorded, how an answer is filed, and an owner's monthly
//! budget (docs/design.md, "Usage, prices and budgets").
//!
//! Money is kept in whole **micro-units** of the configured currency
//! (1 USD = 1 000 000), so sums are exact and never rounded twice. A price
//! is written per million tokens, which makes it, read as micro-units, the
//! price of one token: $2.50 per million tokens is 2.5 micro-dollars a
//! token. [`Rate`] keeps that in millionths of a micro-unit, so a price
//! with up to six decimals is held exactly; a call's cost is rounded to a
//! micro-unit once.

use super::ids::text_enum;
use super::{Timestamp, Usage};

text_enum! {
    /// Which of an owner's monthly limits a creation met, named as the API
    /// names it.
    pub enum BudgetLimit {
        /// Money, in micro-units of the ledger's currency.
        Spend = "spend_limit",
        /// Tokens.
        Tokens = "token_limit",
    }
}

/// A price per million tokens, in millionths of a micro-unit of currency
/// per token (which is the same number as micro-units per million tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rate(i64);

/// Why a written price is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("a price must be a number of at least 0, not {0}")]
    Negative(String),
    #[error(
        "a price has at most 6 decimals (a millionth of the currency per million tokens), not {0}"
    )]
    TooPrecise(String),
    #[error("a price must be below 1 000 000 per million tokens, not {0}")]
    TooLarge(String),
}

impl Rate {
    /// The largest price per million tokens accepted.
    const MAX_PER_MILLION: f64 = 1_000_000.0;

    /// A price as written: currency units per million tokens.
    pub fn per_million(price: f64) -> Result<Self, RateError> {
        if !price.is_finite() || price < 0.0 {
            return Err(RateError::Negative(price.to_string()));
        }
        if price >= Self::MAX_PER_MILLION {
            return Err(RateError::TooLarge(price.to_string()));
        }
        let scaled = price * 1_000_000.0;
        let whole = scaled.round();
        if (scaled - whole).abs() > 1e-6 * scaled.max(1.0) {
            return Err(RateError::TooPrecise(price.to_string()));
        }
        Ok(Self(whole as i64))
    }

    /// The same number of millionths (what the database keeps).
    pub fn from_millionths(millionths: i64) -> Self {
        Self(millionths.max(0))
    }

    pub fn millionths(self) -> i64 {
        self.0
    }

    /// As written: currency units per million tokens.
    pub fn per_million_tokens(self) -> f64 {
        self.0 as f64 / 1_000_000.0
    }
}

/// What one provider's model costs from a moment on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Price {
    pub provider: String,
    pub model: String,
    pub input: Rate,
    pub output: Rate,
    /// Prompt tokens read from the provider's cache.
    pub cached: Rate,
    /// In force from this moment until a later price of the same provider
    /// and model.
    pub effective_from: Timestamp,
}

impl Price {
    /// What a call with this usage costs, in micro-units, rounded half up
    /// once.
    pub fn cost_micros(&self, usage: &Usage) -> i64 {
        let millionths = i128::from(usage.uncached_prompt_tokens()) * i128::from(self.input.0)
            + i128::from(usage.cached_tokens.min(usage.prompt_tokens)) * i128::from(self.cached.0)
            + i128::from(usage.completion_tokens) * i128::from(self.output.0);
        let micros = (millionths + 500_000) / 1_000_000;
        i64::try_from(micros).unwrap_or(i64::MAX)
    }
}

/// Every configured price, each provider and model with its history.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceTable {
    /// Sorted by provider, model, then effective date.
    prices: Vec<Price>,
}

impl PriceTable {
    pub fn new(mut prices: Vec<Price>) -> Self {
        prices.sort_by(|a, b| {
            (&a.provider, &a.model, a.effective_from).cmp(&(
                &b.provider,
                &b.model,
                b.effective_from,
            ))
        });
        Self { prices }
    }

    pub fn is_empty(&self) -> bool {
        self.prices.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Price> {
        self.prices.iter()
    }

    /// The price of `provider`'s `model` in force at `at`: the latest that
    /// took effect by then. `None`: the call is not priced.
    pub fn at(&self, provider: &str, model: &str, at: Timestamp) -> Option<&Price> {
        self.prices
            .iter()
            .filter(|p| p.provider == provider && p.model == model)
            .take_while(|p| p.effective_from <= at)
            .last()
    }
}

/// What a call's answer came to, for the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnswerKind {
    /// Its answer became the job's result.
    Won,
    /// An answer that was not applied: it lost the compare-and-swap, or
    /// came for an attempt already finished (race-logged either way).
    Lost,
    /// A definite failure: the provider did no work (an error), or
    /// answered something onejob refused (invalid output).
    Failed,
    /// Refused as rate-limited or overloaded (`429`, `529`): nothing was
    /// done and nothing billed.
    RateLimited,
}

impl AnswerKind {
    pub const ALL: [AnswerKind; 4] = [
        AnswerKind::Won,
        AnswerKind::Lost,
        AnswerKind::Failed,
        AnswerKind::RateLimited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AnswerKind::Won => "won",
            AnswerKind::Lost => "lost",
            AnswerKind::Failed => "failed",
            AnswerKind::RateLimited => "rate_limited",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

/// Counts kept beside the ledger: duplicates absorbed (a replay of a
/// job's key, a twin that joined a job in flight) and requests never sent
/// (a creation a budget refused, a queued attempt withdrawn unsent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TallyKind {
    Replayed,
    Joined,
    RefusedBudget,
    Withdrawn,
}

impl TallyKind {
    pub const ALL: [TallyKind; 4] = [
        TallyKind::Replayed,
        TallyKind::Joined,
        TallyKind::RefusedBudget,
        TallyKind::Withdrawn,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TallyKind::Replayed => "replayed",
            TallyKind::Joined => "joined",
            TallyKind::RefusedBudget => "refused_budget",
            TallyKind::Withdrawn => "withdrawn",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// A duplicate absorbed (its cost is estimated at the job's own).
    pub fn is_duplicate(self) -> bool {
        matches!(self, TallyKind::Replayed | TallyKind::Joined)
    }
}

/// Whether an answer is late: it came for an attempt already `unknown`
/// (its soft timeout passed, or its process died) or abandoned by
/// support. A late answer was billed like any other.
pub fn is_late(state: super::AttemptState) -> bool {
    matches!(
        state,
        super::AttemptState::Unknown | super::AttemptState::Abandoned
    )
}

/// What is known of an attempt's usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageStatus {
    /// Its call answered and is in the ledger.
    Recorded,
    /// Its call is out, not answered yet.
    Pending,
    /// Its outcome is unknown (or it was abandoned unanswered): the call may
    /// have run and been billed. Never shown as zero.
    Unknown,
    /// It was never sent (queued, withdrawn, skipped): it used nothing.
    NotSent,
}

impl UsageStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            UsageStatus::Recorded => "recorded",
            UsageStatus::Pending => "pending",
            UsageStatus::Unknown => "unknown",
            UsageStatus::NotSent => "not_sent",
        }
    }
}

/// What is known of the usage of an attempt in `state`: `sent` when its
/// call went out, `recorded` when the ledger holds it.
pub fn usage_status(state: super::AttemptState, sent: bool, recorded: bool) -> UsageStatus {
    use super::AttemptState as S;
    match (recorded, sent, state) {
        (true, _, _) => UsageStatus::Recorded,
        (false, false, _) => UsageStatus::NotSent,
        (false, true, S::Running | S::Queued) => UsageStatus::Pending,
        // Unknown or abandoned; or a definite outcome whose call predates
        // the ledger.
        (false, true, _) => UsageStatus::Unknown,
    }
}

/// The most a job can cost, reserved against its owner's budget when it
/// is created: its prompt estimate plus `max_tokens` of answer, at the
/// dearest provider of its route (`prices`: each provider's price now,
/// `None` for one that is not priced, which counts as free).
pub fn most_a_job_can_cost<'a>(
    prompt_tokens: u64,
    max_tokens: u64,
    prices: impl IntoIterator<Item = Option<&'a Price>>,
) -> Reservation {
    let usage = Usage::estimated(prompt_tokens, max_tokens);
    let micros = prices
        .into_iter()
        .flatten()
        .map(|price| price.cost_micros(&usage))
        .max()
        .unwrap_or(0);
    Reservation {
        micros,
        tokens: i64::try_from(usage.total()).unwrap_or(i64::MAX),
    }
}

/// What a job holds of its owner's budget until it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reservation {
    pub micros: i64,
    pub tokens: i64,
}

/// An owner's monthly limits; either may be unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BudgetLimits {
    pub spend_micros: Option<i64>,
    pub tokens: Option<i64>,
}

/// An owner's budget row: what this month recorded, and what unfinished
/// jobs hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BudgetCounters {
    /// The month `spent_*` belong to (its first instant, UTC).
    pub period_start: Timestamp,
    pub spent_micros: i64,
    pub spent_tokens: i64,
    /// Reservations of jobs not yet finished, whichever month made them.
    pub reserved_micros: i64,
    pub reserved_tokens: i64,
}

impl BudgetCounters {
    /// What counts against the limits in the month of `period_start`:
    /// that month's spend (none if the row is of an earlier month) and
    /// every open reservation.
    pub fn committed(&self, period_start: Timestamp) -> Reservation {
        let (spent_micros, spent_tokens) = if self.period_start >= period_start {
            (self.spent_micros, self.spent_tokens)
        } else {
            (0, 0)
        };
        Reservation {
            micros: spent_micros.saturating_add(self.reserved_micros),
            tokens: spent_tokens.saturating_add(self.reserved_tokens),
        }
    }

    /// The row after a reservation made at `period_start` (the month
    /// only moves forward: a process whose clock lags never rolls it back).
    pub fn reserve(&self, period_start: Timestamp, reservation: Reservation) -> Self {
        let mut next = self.rolled_to(period_start);
        next.reserved_micros += reservation.micros;
        next.reserved_tokens += reservation.tokens;
        next
    }

    /// The row after a job's reservation is given back.
    pub fn release(&self, reservation: Reservation) -> Self {
        Self {
            reserved_micros: (self.reserved_micros - reservation.micros).max(0),
            reserved_tokens: (self.reserved_tokens - reservation.tokens).max(0),
            ..*self
        }
    }

    /// The row after a call's cost was recorded at `period_start`.
    pub fn spend(&self, period_start: Timestamp, micros: i64, tokens: i64) -> Self {
        let mut next = self.rolled_to(period_start);
        next.spent_micros += micros;
        next.spent_tokens += tokens;
        next
    }

    fn rolled_to(&self, period_start: Timestamp) -> Self {
        if period_start > self.period_start {
            Self {
                period_start,
                spent_micros: 0,
                spent_tokens: 0,
                ..*self
            }
        } else {
            *self
        }
    }
}

/// Whether a new job holding `reservation` fits under `limits` in the
/// month of `period_start`. The store's reserving `UPDATE` has the same
/// condition in its `WHERE` (`every_guarded_statement_agrees_with_its_predicate`).
pub fn may_reserve(
    limits: &BudgetLimits,
    counters: &BudgetCounters,
    period_start: Timestamp,
    reservation: Reservation,
) -> bool {
    let committed = counters.committed(period_start);
    let fits = |limit: Option<i64>, committed: i64, more: i64| {
        limit.is_none_or(|limit| committed.saturating_add(more) <= limit)
    };
    fits(limits.spend_micros, committed.micros, reservation.micros)
        && fits(limits.tokens, committed.tokens, reservation.tokens)
}

/// The first instant (UTC) of the month holding `at`.
pub fn month_start(at: Timestamp) -> Timestamp {
    use chrono::Datelike;
    let Some(at) = chrono::DateTime::from_timestamp_millis(at.millis()) else {
        return Timestamp::EPOCH;
    };
    first_of_month(at.year(), at.month()).unwrap_or(Timestamp::EPOCH)
}

/// The first instant of the month after the one holding `at`: when a
/// monthly budget resets.
pub fn next_month_start(at: Timestamp) -> Timestamp {
    use chrono::Datelike;
    let Some(at) = chrono::DateTime::from_timestamp_millis(at.millis()) else {
        return Timestamp::EPOCH;
    };
    let (year, month) = if at.month() == 12 {
        (at.year() + 1, 1)
    } else {
        (at.year(), at.month() + 1)
    };
    first_of_month(year, month).unwrap_or(Timestamp::from_millis(i64::MAX))
}

fn first_of_month(year: i32, month: u32) -> Option<Timestamp> {
    chrono::NaiveDate::from_ymd_opt(year, month, 1)
        .and_then(|day| day.and_hms_opt(0, 0, 0))
        .map(|start| Timestamp::from_millis(start.and_utc().timestamp_millis()))
}

/// The first instant of the UTC day holding `at`.
pub fn day_start(at: Timestamp) -> Timestamp {
    at.floor_to(DAY_MS)
}

pub const DAY_MS: i64 = 86_400_000;

/// The largest spend limit, in currency units.
pub const MAX_SPEND_UNITS: f64 = 1e12;

/// Why a spend limit cannot be kept as it was sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpendRefusal {
    #[error("`spend_limit` must be between 0 and 1000000000000 currency units")]
    OutOfRange,
    #[error(
        "`spend_limit` {0} has more than 6 decimal places; budgets count in millionths of a \
         currency unit, and a limit is never rounded silently"
    )]
    TooPrecise(String),
}

/// A spend limit in currency units as micro-units, exactly: refused when
/// negative, not finite, past [`MAX_SPEND_UNITS`], or finer than a
/// millionth (judged on the number's shortest decimal form, the one the
/// client wrote: `0.0000001` is refused, `0.1` is 100000).
pub fn spend_micros(units: f64) -> Result<i64, SpendRefusal> {
    if !units.is_finite() || !(0.0..=MAX_SPEND_UNITS).contains(&units) {
        return Err(SpendRefusal::OutOfRange);
    }
    let written = units.to_string();
    let decimals = written
        .split_once('.')
        .map_or(0, |(_, fraction)| fraction.len());
    if decimals > 6 {
        return Err(SpendRefusal::TooPrecise(written));
    }
    Ok((units * 1e6).round() as i64)
}

/// Why a request's output-token limit is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "`max_tokens` (`max_output_tokens` on /v1/responses) asks for {asked} tokens; this route's \
     providers can produce at most {ceiling} (their largest context window), and a budget \
     reserves what a job asks for"
)]
pub struct TooManyTokens {
    pub asked: u64,
    pub ceiling: u64,
}

/// A request's own output-token limit checked against the most its route
/// can produce (the largest context window among the route's providers):
/// a budget reserves what a job asks for, so the client may not inflate
/// it freely.
pub fn check_max_tokens(asked: u64, ceiling: u64) -> Result<u64, TooManyTokens> {
    if asked > ceiling {
        return Err(TooManyTokens { asked, ceiling });
    }
    Ok(asked)
}

/// A money amount in micro-units, written in currency units for people
/// (`1.234567`), trailing zeros kept to two decimals.
pub fn format_micros(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let abs = micros.unsigned_abs();
    let (whole, fraction) = (abs / 1_000_000, abs % 1_000_000);
    let mut digits = format!("{fraction:06}");
    while digits.len() > 2 && digits.ends_with('0') {
        digits.pop();
    }
    format!("{sign}{whole}.{digits}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spend_limit_is_kept_exactly_or_refused() {
        assert_eq!(spend_micros(0.0), Ok(0));
        assert_eq!(spend_micros(0.1), Ok(100_000));
        assert_eq!(spend_micros(12.345678), Ok(12_345_678));
        assert_eq!(spend_micros(1e12), Ok(1_000_000_000_000_000_000));
        assert_eq!(
            spend_micros(0.0000001),
            Err(SpendRefusal::TooPrecise("0.0000001".into()))
        );
        assert!(matches!(
            spend_micros(1.2345678),
            Err(SpendRefusal::TooPrecise(_))
        ));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e13] {
            assert_eq!(spend_micros(bad), Err(SpendRefusal::OutOfRange), "{bad}");
        }
    }

    #[test]
    fn a_request_may_not_ask_for_more_tokens_than_its_route_can_produce() {
        assert_eq!(check_max_tokens(4096, 128_000), Ok(4096));
        assert_eq!(check_max_tokens(128_000, 128_000), Ok(128_000));
        assert_eq!(
            check_max_tokens(1_000_000_000, 128_000),
            Err(TooManyTokens {
                asked: 1_000_000_000,
                ceiling: 128_000
            })
        );
    }

    fn price(input: f64, output: f64, cached: f64, from: i64) -> Price {
        Price {
            provider: "p".into(),
            model: "m".into(),
            input: Rate::per_million(input).unwrap(),
            output: Rate::per_million(output).unwrap(),
            cached: Rate::per_million(cached).unwrap(),
            effective_from: Timestamp::from_millis(from),
        }
    }

    #[test]
    fn a_price_per_million_is_the_micro_units_of_one_token() {
        let p = price(2.5, 10.0, 1.25, 0);
        // 1000 prompt tokens (200 cached), 500 answer tokens:
        // 800 × 2.5 + 200 × 1.25 + 500 × 10 = 2000 + 250 + 5000 micro-units.
        assert_eq!(p.cost_micros(&Usage::reported(1000, 500, 200)), 7250);
        assert_eq!(p.cost_micros(&Usage::none()), 0);
    }

    #[test]
    fn cost_is_rounded_once_half_up() {
        let p = price(0.075, 0.3, 0.0375, 0);
        // 3 × 0.075 + 1 × 0.3 = 0.525 micro-units: rounds to 1.
        assert_eq!(p.cost_micros(&Usage::reported(3, 1, 0)), 1);
        // 1 × 0.075 = 0.075: rounds to 0.
        assert_eq!(p.cost_micros(&Usage::reported(1, 0, 0)), 0);
    }

    #[test]
    fn written_prices_are_held_exactly_or_refused() {
        assert_eq!(Rate::per_million(2.5).unwrap().millionths(), 2_500_000);
        assert_eq!(Rate::per_million(0.0375).unwrap().millionths(), 37_500);
        assert_eq!(Rate::per_million(0.000001).unwrap().millionths(), 1);
        assert!(matches!(
            Rate::per_million(0.0000001),
            Err(RateError::TooPrecise(_))
        ));
        assert!(matches!(
            Rate::per_million(-1.0),
            Err(RateError::Negative(_))
        ));
        assert!(matches!(
            Rate::per_million(f64::NAN),
            Err(RateError::Negative(_))
        ));
        assert!(matches!(
            Rate::per_million(2e6),
            Err(RateError::TooLarge(_))
        ));
    }

    #[test]
    fn the_price_in_force_is_the_latest_that_took_effect() {
        let table = PriceTable::new(vec![
            price(3.0, 3.0, 3.0, 2_000),
            price(1.0, 1.0, 1.0, 0),
            price(2.0, 2.0, 2.0, 1_000),
        ]);
        let input_at = |at| {
            table
                .at("p", "m", Timestamp::from_millis(at))
                .map(|p| p.input.millionths())
        };
        assert_eq!(input_at(-1), None, "before the first price: not priced");
        assert_eq!(input_at(0), Some(1_000_000));
        assert_eq!(input_at(999), Some(1_000_000));
        assert_eq!(input_at(1_000), Some(2_000_000));
        assert_eq!(input_at(5_000), Some(3_000_000));
        assert_eq!(table.at("p", "other", Timestamp::from_millis(5_000)), None);
        assert_eq!(table.at("q", "m", Timestamp::from_millis(5_000)), None);
    }

    #[test]
    fn a_job_reserves_its_dearest_providers_cost() {
        let cheap = price(1.0, 1.0, 0.0, 0);
        let dear = price(2.0, 8.0, 0.0, 0);
        let reserved = most_a_job_can_cost(100, 50, [Some(&cheap), None, Some(&dear)]);
        assert_eq!(reserved.micros, 100 * 2 + 50 * 8);
        assert_eq!(reserved.tokens, 150);
        let unpriced = most_a_job_can_cost(100, 50, [None]);
        assert_eq!(
            unpriced,
            Reservation {
                micros: 0,
                tokens: 150
            }
        );
    }

    #[test]
    fn a_reservation_fits_only_under_every_limit_set() {
        let limits = BudgetLimits {
            spend_micros: Some(1_000),
            tokens: Some(100),
        };
        let month = Timestamp::from_millis(10);
        let counters = BudgetCounters {
            period_start: month,
            spent_micros: 600,
            spent_tokens: 10,
            reserved_micros: 300,
            reserved_tokens: 10,
        };
        let r = |micros, tokens| Reservation { micros, tokens };
        assert!(may_reserve(&limits, &counters, month, r(100, 80)));
        assert!(!may_reserve(&limits, &counters, month, r(101, 0)));
        assert!(!may_reserve(&limits, &counters, month, r(0, 81)));
        // A new month: last month's spend no longer counts; the open
        // reservations still do.
        assert!(may_reserve(&limits, &counters, month + 1, r(700, 80)));
        assert!(!may_reserve(&limits, &counters, month + 1, r(701, 0)));
        assert!(may_reserve(
            &BudgetLimits::default(),
            &counters,
            month,
            r(i64::MAX, i64::MAX)
        ));
    }

    #[test]
    fn the_month_only_moves_forward() {
        let counters = BudgetCounters {
            period_start: Timestamp::from_millis(100),
            spent_micros: 5,
            spent_tokens: 5,
            ..Default::default()
        };
        // A process whose clock lags spends into the current month.
        let at = Timestamp::from_millis;
        let lagging = counters.spend(at(50), 1, 1);
        assert_eq!((lagging.period_start, lagging.spent_micros), (at(100), 6));
        let next = counters.spend(at(200), 1, 1);
        assert_eq!((next.period_start, next.spent_micros), (at(200), 1));
        let reserved = counters.reserve(
            at(200),
            Reservation {
                micros: 3,
                tokens: 3,
            },
        );
        assert_eq!((reserved.spent_micros, reserved.reserved_micros), (0, 3));
        assert_eq!(
            reserved
                .release(Reservation {
                    micros: 3,
                    tokens: 3
                })
                .reserved_micros,
            0
        );
    }

    #[test]
    fn months_and_days_start_at_midnight_utc() {
        // 2026-12-02T06:10:30Z
        let at = Timestamp::from_millis(1_796_191_830_000);
        let ms = |at: Timestamp| at.millis();
        assert_eq!(ms(month_start(at)), 1_796_083_200_000); // 2026-12-01
        assert_eq!(ms(next_month_start(at)), 1_798_761_600_000); // 2027-01-01
        assert_eq!(ms(day_start(at)), 1_796_169_600_000); // 2026-12-02
        assert_eq!(month_start(month_start(at)), month_start(at));
    }

    #[test]
    fn money_is_written_in_currency_units() {
        assert_eq!(format_micros(7_250), "0.00725");
        assert_eq!(format_micros(1_500_000), "1.50");
        assert_eq!(format_micros(0), "0.00");
        assert_eq!(format_micros(-1), "-0.000001");
    }

    #[test]
    fn answer_kinds_round_trip_through_their_names() {
        for kind in AnswerKind::ALL {
            assert_eq!(AnswerKind::parse(kind.as_str()), Some(kind));
        }
    }
}
