//! The `[ledger]` section: the currency and the price table each call's
//! cost is computed from (docs/design.md, "Usage, prices and budgets";
//! every key in docs/configuration.md).

use serde::Deserialize;

use crate::domain::ledger::{Price, PriceTable, Rate};
use crate::domain::Timestamp;
use crate::providers::ProviderSettings;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerSettings {
    /// The currency prices are written in (an ISO 4217 code, shown beside
    /// amounts); costs are kept in its micro-units.
    pub currency: String,
    /// How often each process writes the counts it keeps in memory
    /// (duplicates absorbed, creations refused by a budget, attempts
    /// withdrawn unsent) to the database.
    pub tally_flush_ms: u64,
    /// Each provider's and model's prices, with the date each took effect.
    pub prices: Vec<PriceEntry>,
}

impl Default for LedgerSettings {
    fn default() -> Self {
        Self {
            currency: "USD".to_owned(),
            tally_flush_ms: 1_000,
            prices: Vec::new(),
        }
    }
}

/// One `[[ledger.prices]]` entry: what a provider's model costs per million
/// tokens, from a date on.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceEntry {
    pub provider: String,
    /// The model this price is for; default: the provider's configured
    /// model (`simulated` for the simulated kind).
    pub model: Option<String>,
    /// Per million prompt tokens.
    pub input: f64,
    /// Per million answer tokens.
    pub output: f64,
    /// Per million prompt tokens read from the provider's cache; default:
    /// the input price.
    pub cached: Option<f64>,
    /// When the price took effect: `YYYY-MM-DD` (midnight UTC) or an RFC
    /// 3339 time; default: always.
    pub effective_from: Option<String>,
}

/// The resolved section.
#[derive(Debug, Clone, Default)]
pub struct LedgerConfig {
    pub currency: String,
    pub tally_flush_ms: u64,
    pub prices: PriceTable,
}

impl LedgerSettings {
    /// Checks the section against the providers and compiles its prices;
    /// an error names the offending key.
    pub fn resolve(self, providers: &[ProviderSettings]) -> Result<LedgerConfig, (String, String)> {
        let currency = self.currency.trim().to_owned();
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err((
                "ledger.currency".to_owned(),
                format!(
                    "must be a three-letter ISO 4217 code such as USD or EUR, not {currency:?}"
                ),
            ));
        }
        if !(50..=60_000).contains(&self.tally_flush_ms) {
            return Err((
                "ledger.tally_flush_ms".to_owned(),
                "must be between 50 and 60000".to_owned(),
            ));
        }
        let mut prices = Vec::with_capacity(self.prices.len());
        for (i, entry) in self.prices.into_iter().enumerate() {
            let key = |field: &str| format!("ledger.prices[{i}].{field}");
            let provider = providers
                .iter()
                .find(|p| p.name == entry.provider)
                .ok_or_else(|| {
                    (
                        key("provider"),
                        format!("no provider is named {:?}", entry.provider),
                    )
                })?;
            let rate = |field: &str, value: f64| {
                Rate::per_million(value).map_err(|e| (key(field), e.to_string()))
            };
            let effective_from = match &entry.effective_from {
                None => Timestamp::from_millis(i64::MIN),
                Some(text) => parse_moment(text).ok_or_else(|| {
                    (
                        key("effective_from"),
                        format!("{text:?} is neither YYYY-MM-DD nor an RFC 3339 time"),
                    )
                })?,
            };
            let price = Price {
                provider: entry.provider.clone(),
                model: entry
                    .model
                    .clone()
                    .unwrap_or_else(|| provider.model_name().to_owned()),
                input: rate("input", entry.input)?,
                output: rate("output", entry.output)?,
                cached: rate("cached", entry.cached.unwrap_or(entry.input))?,
                effective_from,
            };
            if prices.iter().any(|p: &Price| {
                (&p.provider, &p.model, p.effective_from)
                    == (&price.provider, &price.model, price.effective_from)
            }) {
                return Err((
                    key("effective_from"),
                    format!(
                        "{} ({}) already has a price taking effect then",
                        price.provider, price.model
                    ),
                ));
            }
            prices.push(price);
        }
        Ok(LedgerConfig {
            currency,
            tally_flush_ms: self.tally_flush_ms,
            prices: PriceTable::new(prices),
        })
    }
}

/// `YYYY-MM-DD` (midnight UTC) or an RFC 3339 time, as an instant.
fn parse_moment(text: &str) -> Option<Timestamp> {
    let millis = if let Ok(day) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        day.and_hms_opt(0, 0, 0)?.and_utc().timestamp_millis()
    } else {
        chrono::DateTime::parse_from_rfc3339(text)
            .ok()?
            .timestamp_millis()
    };
    Some(Timestamp::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn providers() -> Vec<ProviderSettings> {
        toml::from_str::<toml::Table>(
            "[[p]]\nname = \"a\"\nkind = \"openai\"\nmodel = \"gpt-x\"\n\
             [[p]]\nname = \"sim\"\nkind = \"simulated\"\n",
        )
        .unwrap()["p"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.clone().try_into().unwrap())
            .collect()
    }

    fn resolve(toml_text: &str) -> Result<LedgerConfig, (String, String)> {
        let settings: LedgerSettings = toml::from_str(toml_text).unwrap();
        settings.resolve(&providers())
    }

    #[test]
    fn prices_take_the_providers_model_and_their_dates() {
        let ledger = resolve(
            "currency = \"EUR\"\n\
             [[prices]]\nprovider = \"a\"\ninput = 2.5\noutput = 10\n\
             [[prices]]\nprovider = \"a\"\ninput = 1\noutput = 4\ncached = 0.5\neffective_from = \"2026-12-01\"\n\
             [[prices]]\nprovider = \"sim\"\ninput = 0\noutput = 0\n",
        )
        .unwrap();
        assert_eq!(ledger.currency, "EUR");
        let december = Timestamp::from_millis(1_796_083_200_000);
        let before = ledger.prices.at("a", "gpt-x", december - 1).unwrap();
        assert_eq!(before.input.millionths(), 2_500_000);
        assert_eq!(before.cached, before.input, "cached defaults to input");
        let after = ledger.prices.at("a", "gpt-x", december).unwrap();
        assert_eq!(after.cached.millionths(), 500_000);
        assert!(ledger
            .prices
            .at("sim", "simulated", Timestamp::EPOCH)
            .is_some());
    }

    #[test]
    fn mistakes_are_named_by_their_key() {
        let key = |text: &str| resolve(text).unwrap_err().0;
        assert_eq!(key("currency = \"dollars\""), "ledger.currency");
        assert_eq!(
            key("[[prices]]\nprovider = \"nobody\"\ninput = 1\noutput = 1"),
            "ledger.prices[0].provider"
        );
        assert_eq!(
            key("[[prices]]\nprovider = \"a\"\ninput = -1\noutput = 1"),
            "ledger.prices[0].input"
        );
        assert_eq!(
            key("[[prices]]\nprovider = \"a\"\ninput = 1\noutput = 1\neffective_from = \"soon\""),
            "ledger.prices[0].effective_from"
        );
        assert_eq!(
            key("[[prices]]\nprovider = \"a\"\ninput = 1\noutput = 1\n\
                 [[prices]]\nprovider = \"a\"\ninput = 2\noutput = 2"),
            "ledger.prices[1].effective_from"
        );
        assert_eq!(key("tally_flush_ms = 0"), "ledger.tally_flush_ms");
    }

    #[test]
    fn moments_are_days_or_rfc3339_times() {
        let at = |ms| Some(Timestamp::from_millis(ms));
        assert_eq!(parse_moment("1970-01-02"), at(86_400_000));
        assert_eq!(parse_moment("1970-01-01T00:00:01Z"), at(1_000));
        assert_eq!(parse_moment("1970-01-01T01:00:00+01:00"), at(0));
        assert_eq!(parse_moment("yesterday"), None);
    }
}
