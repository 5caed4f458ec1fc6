//! Names that become parts of paths and lines: scenario, host profile and host names. They come
//! from a restricted set (letters, digits, `.`, `_`, `-`; starting with a letter or digit; at
//! most 100 characters), so a name can neither leave the report folder (`../x`), nor be empty,
//! nor forge a line of output.

use crate::model::invalid::Invalid;
use serde::{Deserialize, Deserializer};

pub const MAX_LEN: usize = 100;

/// One line of text with every control character escaped (no ANSI sequences, no forged lines):
/// how any text from outside (a program's output, an argument, a reason) reaches a log line,
/// the terminal or a report.
pub fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if hidden(c) {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Characters a terminal or a page does not show as themselves: controls, and the
/// bidirectional marks and overrides that reorder the text around them (Trojan Source).
pub fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{061c}')
}

/// What is wrong with `name`, if anything.
pub fn check(name: &str) -> Result<(), Invalid> {
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    let all_ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if name.is_empty() {
        return Err("a name must not be empty".into());
    }
    if name.len() > MAX_LEN {
        return Err(format!(
            "a name has at most {MAX_LEN} characters, this one {}",
            name.len()
        )
        .into());
    }
    if !first_ok || !all_ok {
        let shown: String = name.escape_debug().take(60).collect();
        return Err(format!(
            "name \"{shown}\" may hold only letters, digits, `.`, `_` and `-`, and must start with a letter or digit (it names files in the report)"
        ).into());
    }
    Ok(())
}

/// Deserialize a name and check it, so a bad one is an error at its line and column.
pub fn checked<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    check(&s).map_err(serde::de::Error::custom)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_leave_the_folder_or_forge_output_are_refused() {
        for bad in [
            "",
            "../x",
            "a/b",
            "..",
            ".hidden",
            "a b",
            "a\nb",
            "\u{1b}]0;x\u{7}",
            "é",
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
        assert!(check(&"a".repeat(101)).unwrap_err().contains("at most 100"));
        for good in ["tcp-teardown-cycles", "gloo_2.x", "A1", &"a".repeat(100)] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
    }
}
