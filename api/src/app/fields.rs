//! Checking a request's fields. Every problem of a request is collected, so that a client hears
//! of all of them at once (`errors` in the problem document) rather than one per attempt.
//!
//! The checks here are the ones the OpenAPI document states (see `http::openapi`): what a
//! client can validate before sending must be exactly what gsaasd refuses.

use crate::error::{Error, FieldError};

/// What [`FieldChecks::text`] accepts, as a JSON Schema (ECMA-262) pattern: no character
/// [`is_hidden`] finds, and at least one that is neither hidden nor white space (Unicode
/// `White_Space`, as Rust's `char::is_whitespace`).
pub const TEXT_PATTERN: &str =
    "^[^\\u0000-\\u001f\\u007f-\\u009f\\u061c\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u2064\
    \\u2066-\\u206f\\ufeff\\ufff9-\\ufffb]*\
    [^\\u0000-\\u0020\\u007f-\\u00a0\\u061c\\u1680\\u2000-\\u200f\\u2028-\\u202f\\u205f-\\u2064\
    \\u2066-\\u206f\\u3000\\ufeff\\ufff9-\\ufffb]\
    [^\\u0000-\\u001f\\u007f-\\u009f\\u061c\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u2064\
    \\u2066-\\u206f\\ufeff\\ufff9-\\ufffb]*$";

/// Whether a name may not hold `c`: a control character (Unicode `Cc`), or one that hides or
/// reorders what a reader sees (bidirectional embeddings, overrides, isolates and marks, zero-width
/// characters, line and paragraph separators, the byte-order mark, interlinear annotations), with
/// which a name can pass for another in a list or a log.
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
        )
}

/// The problems found so far in one request.
#[derive(Debug, Default)]
pub struct FieldChecks(Vec<FieldError>);

impl FieldChecks {
    pub fn new() -> Self {
        FieldChecks::default()
    }

    pub fn fail(&mut self, field: impl Into<String>, detail: impl Into<String>) {
        self.0.push(FieldError { field: field.into(), detail: detail.into() });
    }

    /// A name-like text: not blank, at most `max` characters, no control characters.
    pub fn text(&mut self, field: &str, value: &str, max: usize) {
        if value.trim().is_empty() {
            self.fail(field, "must not be empty");
        } else if value.chars().count() > max {
            self.fail(field, format!("must be at most {max} characters"));
        } else if value.chars().any(is_hidden) {
            self.fail(
                field,
                "must not contain control or invisible formatting characters (such as \
                 bidirectional overrides or zero-width characters)",
            );
        }
    }

    /// `Err` with every problem found, or `Ok` when there is none.
    pub fn finish(self) -> Result<(), Error> {
        Error::invalid_fields(self.0)
    }

    /// Every problem found.
    pub fn into_errors(self) -> Vec<FieldError> {
        self.0
    }
}

/// One text field alone (see [`FieldChecks::text`]).
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), Error> {
    let mut checks = FieldChecks::new();
    checks.text(field, value, max);
    checks.finish()
}

/// `text` cut after `max` characters: how much of an agent's or a cloud's words gsaasd keeps.
pub fn truncate_chars(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((cut, _)) => &text[..cut],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_reported_once_per_field() {
        let mut checks = FieldChecks::new();
        checks.text("image", " ", 10);
        checks.text("flavor", "x".repeat(11).as_str(), 10);
        checks.text("name", "a\u{7}b", 10);
        checks.text("ok", "fine", 10);
        let Err(Error::Invalid(errors)) = checks.finish() else { panic!("no error") };
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["image", "flavor", "name"]);
        assert_eq!(errors[1].detail, "must be at most 10 characters");
    }

    /// The OpenAPI document's pattern says exactly what the check does, for every character
    /// (a client that validates first must never be surprised either way).
    #[test]
    fn the_documented_pattern_and_the_check_agree() {
        let pattern = regex::Regex::new(TEXT_PATTERN).unwrap();
        let astral = (0x1_0000..=0x10_FFFF_u32).step_by(0x7FF);
        for c in (0..=0xFFFF_u32).chain(astral).filter_map(char::from_u32) {
            for text in [format!("a{c}"), c.to_string()] {
                let checked = check_text("name", &text, 10).is_ok();
                assert_eq!(pattern.is_match(&text), checked, "U+{:04X} in {text:?}", c as u32);
            }
        }
        for spoof in ["admin\u{202E}nimda", "a\u{200B}b", "x\u{2066}y", "\u{FEFF}z"] {
            let err = check_text("name", spoof, 64).unwrap_err().to_string();
            assert!(err.contains("invisible"), "{spoof:?}: {err}");
        }
    }

    #[test]
    fn lengths_count_characters_not_bytes() {
        assert!(check_text("name", &"é".repeat(10), 10).is_ok());
        assert!(check_text("name", &"é".repeat(11), 10).is_err());
    }
}
