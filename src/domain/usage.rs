//! What one provider call used: the tokens of its prompt, of its answer,
//! and how many of the prompt's were read from the provider's cache.
//!
//! A call's usage is recorded once, with its outcome (docs/design.md,
//! "Usage, prices and budgets"). An attempt whose outcome is unknown has
//! unknown usage: `None` where an `Option<Usage>` is kept, never zero.

use super::ids::text_enum;

text_enum! {
    /// Where a call's token counts come from.
    stored pub enum UsageSource {
        /// The provider's answer said (`usage` of OpenAI's or Anthropic's
        /// answer, or of a stream's last event).
        Reported = "reported",
        /// The provider answered without saying: onejob counted the prompt
        /// and the answer itself.
        Estimated = "estimated",
    }
}

/// The tokens one call used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Usage {
    /// Every token of the prompt, those read from the cache included.
    pub prompt_tokens: u64,
    /// The answer's tokens.
    pub completion_tokens: u64,
    /// Of `prompt_tokens`, those the provider read from its prompt cache
    /// (billed at the cached price).
    pub cached_tokens: u64,
    pub source: UsageSource,
}

impl Usage {
    /// Counts as the provider reported them; `cached_tokens` is held within
    /// `prompt_tokens`.
    pub fn reported(prompt_tokens: u64, completion_tokens: u64, cached_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            cached_tokens: cached_tokens.min(prompt_tokens),
            source: UsageSource::Reported,
        }
    }

    /// Counts onejob made itself, for an answer that carried none.
    pub fn estimated(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            cached_tokens: 0,
            source: UsageSource::Estimated,
        }
    }

    /// A call that used nothing (a refusal in which nothing happened).
    pub fn none() -> Self {
        Self::reported(0, 0, 0)
    }

    /// Prompt and answer together.
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// The prompt tokens billed at the full input price.
    pub fn uncached_prompt_tokens(&self) -> u64 {
        self.prompt_tokens - self.cached_tokens.min(self.prompt_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_never_exceed_the_prompt() {
        let usage = Usage::reported(10, 5, 40);
        assert_eq!(usage.cached_tokens, 10);
        assert_eq!(usage.uncached_prompt_tokens(), 0);
        assert_eq!(usage.total(), 15);
    }

    #[test]
    fn sources_round_trip_through_their_names() {
        for source in UsageSource::ALL {
            assert_eq!(UsageSource::parse(source.as_str()), Some(source));
        }
        assert_eq!(UsageSource::parse("guessed"), None);
    }
}
