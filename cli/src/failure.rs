//! How a command fails: a one-line message and the exit code of its kind, shared by everything
//! that talks to a server (gsaasd, Keystone).

/// Exit codes; documented in `--help` (`args::EXIT_CODES`).
pub mod exit {
    pub const REFUSED: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const NO_CAPACITY: u8 = 4;
    pub const AUTH: u8 = 5;
    pub const UNAVAILABLE: u8 = 6;
}

/// A failed command: what to print, and how to exit.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: u8,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Failure { message: message.into(), code: exit::USAGE }
    }
}

/// A request to `target` that got no answer, said in one line.
pub fn unreachable(target: &str, e: &reqwest::Error) -> Failure {
    let why = if e.is_connect() {
        "connection refused or no route"
    } else if e.is_timeout() {
        "timed out"
    } else {
        "the request failed"
    };
    Failure { message: format!("cannot reach {target}: {why}"), code: exit::UNAVAILABLE }
}
