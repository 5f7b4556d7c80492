//! Counting a prompt's tokens, for the context-budget check of qualification.

use super::ProviderSettings;

/// How many tokens a prompt takes with this provider, and how it was counted.
pub fn count_tokens(provider: &ProviderSettings, text: &str) -> (u32, &'static str) {
    if provider.kind.speaks_openai() {
        let bpe = provider
            .model
            .as_deref()
            .and_then(|m| tiktoken_rs::bpe_for_model(m).ok())
            .unwrap_or_else(|| tiktoken_rs::o200k_base_singleton());
        return (
            bpe.encode_with_special_tokens(text).len() as u32,
            "tiktoken",
        );
    }
    // No Rust tokenizer for this provider: a conservative estimate, one token
    // per three bytes of UTF-8 (English runs about four characters a token).
    (
        text.len().div_ceil(3) as u32,
        "estimate: 1 token per 3 bytes",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::ProviderKind;

    #[test]
    fn openai_prompts_are_counted_with_tiktoken_and_others_conservatively() {
        let mut provider: ProviderSettings =
            toml::from_str("name = \"p\"\nkind = \"openai\"\nmodel = \"gpt-4o\"").unwrap();
        let (tokens, method) = count_tokens(&provider, "hello world");
        assert_eq!((tokens, method), (2, "tiktoken"));
        provider.kind = ProviderKind::Anthropic;
        let (tokens, _) = count_tokens(&provider, "hello world");
        assert_eq!(tokens, 4, "11 bytes / 3, rounded up");
    }
}
