//! How deeply a client's JSON may nest, checked before anything walks it.
//!
//! Parsers, the canonicaliser, schema validation and templates all recurse
//! over a document's structure; a request of a few kilobytes can nest
//! thousands of levels deep and exhaust a thread's stack. [`check_nesting`]
//! measures the depth with one pass over the bytes, iteratively and without
//! building anything, so every edge can refuse a document that is too deep
//! before any recursive walk sees it.

/// The nesting allowed unless the configuration says otherwise.
pub const DEFAULT_MAX_NESTING: usize = 64;

/// The most any configuration may allow: serde_json's own recursion limit,
/// which every typed parse of a body meets anyway.
pub const MAX_NESTING_CEILING: usize = 128;

/// A document nests deeper than `limit` arrays and objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the JSON nests deeper than {limit} levels of arrays and objects")]
pub struct TooDeep {
    pub limit: usize,
}

/// Checks that `text` nests at most `limit` levels of arrays and objects.
///
/// Brackets inside strings do not count (escapes are honoured). Anything
/// else about the text is left to the parser that follows: this pass only
/// ever refuses depth, and its cost is one look at each byte.
pub fn check_nesting(text: &[u8], limit: usize) -> Result<(), TooDeep> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in text {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Err(TooDeep { limit });
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        "[".repeat(depth) + &"]".repeat(depth)
    }

    #[test]
    fn depth_up_to_the_limit_passes_and_one_more_is_refused() {
        assert_eq!(check_nesting(nested(64).as_bytes(), 64), Ok(()));
        assert_eq!(
            check_nesting(nested(65).as_bytes(), 64),
            Err(TooDeep { limit: 64 })
        );
        assert_eq!(check_nesting(br#"{"a":{"b":[1,{"c":2}]}}"#, 4), Ok(()));
        assert!(check_nesting(br#"{"a":{"b":[1,{"c":2}]}}"#, 3).is_err());
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let text = format!(r#"{{"a":"{}\"{}"}}"#, "[".repeat(500), "{".repeat(500));
        assert_eq!(check_nesting(text.as_bytes(), 1), Ok(()));
        // An escaped backslash ends before the quote, which closes the string.
        assert!(check_nesting(br#"["\\", [[]]]"#, 2).is_err());
    }

    #[test]
    fn a_hundred_thousand_levels_are_refused_without_recursion() {
        let deep = nested(100_000);
        assert_eq!(
            check_nesting(deep.as_bytes(), DEFAULT_MAX_NESTING),
            Err(TooDeep {
                limit: DEFAULT_MAX_NESTING
            })
        );
        // Unbalanced garbage is the parser's business, not a crash here.
        assert_eq!(check_nesting(b"]]]]}}}", 1), Ok(()));
    }
}
