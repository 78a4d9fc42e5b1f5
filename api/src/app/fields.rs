//! Checking a request's fields. Every problem of a request is collected, so that a client hears
//! of all of them at once (`errors` in the problem document) rather than one per attempt.
//!
//! The checks here are the ones the OpenAPI document states (see `http::openapi`): what a
//! client can validate before sending must be exactly what gsaasd refuses.

use crate::error::{Error, FieldError};

/// What [`FieldChecks::text`] accepts, as a JSON Schema (ECMA-262) pattern: no control
/// character (Unicode `Cc`), and at least one character that is not white space (Unicode
/// `White_Space`, as Rust's `char::is_whitespace`).
pub const TEXT_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*\
    [^\\u0000-\\u0020\\u007f-\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]\
    [^\\u0000-\\u001f\\u007f-\\u009f]*$";

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
        } else if value.chars().any(char::is_control) {
            self.fail(field, "must not contain control characters");
        }
    }

    /// `Err` with every problem found, or `Ok` when there is none.
    pub fn finish(self) -> Result<(), Error> {
        Error::invalid_fields(self.0)
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

    #[test]
    fn lengths_count_characters_not_bytes() {
        assert!(check_text("name", &"é".repeat(10), 10).is_ok());
        assert!(check_text("name", &"é".repeat(11), 10).is_err());
    }
}
