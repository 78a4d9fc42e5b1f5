//! URLs that carry credentials (`database_url`, `notifications.transport_url`): their password
//! must never reach a terminal, a log or an error message, so the type that holds them shows
//! them only redacted, and the one place that connects asks for the URL by name
//! ([`SecretUrl::expose`]).

use std::fmt;

use serde::Deserialize;

/// What a redacted credential reads as.
const REDACTED: &str = "***";

/// Query parameters that carry a credential (libpq's `password`, `sslpassword`, and the like).
const SECRET_PARAMETERS: [&str; 4] = ["password", "secret", "token", "key"];

/// A URL whose password (in its user information or in a query parameter) is shown as `***` by
/// `Debug` and `Display`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// The URL with its credentials, for the client that connects with it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL as it may be shown.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

impl From<String> for SecretUrl {
    fn from(url: String) -> Self {
        SecretUrl(url)
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> Self {
        SecretUrl(url.to_owned())
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.redacted(), f)
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// `url` with the password of its user information and the values of credential-like query
/// parameters replaced by `***`. The user information is taken to run to the last `@` before
/// the query, so a password holding an unescaped `/` or `@` is redacted whole too; text that is
/// not a URL is shown as it is, since it names no credential a URL parser would find.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let mut out = format!("{scheme}://");
    match before_query.rsplit_once('@') {
        Some((userinfo, after)) => {
            match userinfo.split_once(':') {
                Some((user, _password)) => out.push_str(&format!("{user}:{REDACTED}")),
                // A user name alone may be a token (`https://TOKEN@host`): shown as neither.
                None if userinfo.is_empty() => {}
                None => out.push_str(REDACTED),
            }
            out.push('@');
            out.push_str(after);
        }
        None => out.push_str(before_query),
    }
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if is_secret_parameter(name) => format!("{name}={REDACTED}"),
                _ => pair.to_owned(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    out
}

fn is_secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMETERS.iter().any(|secret| name.contains(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_user_information_and_query_are_redacted() {
        for (url, shown) in [
            ("postgres://gsaas:s3cret@db:5432/gsaas", "postgres://gsaas:***@db:5432/gsaas"),
            ("rabbit://guest:p%40ss@mq/", "rabbit://guest:***@mq/"),
            ("amqps://u:pa/ss@word@mq:5671/vh", "amqps://u:***@mq:5671/vh"),
            (
                "postgres://db/gsaas?user=g&password=s3cret&ssl=1",
                "postgres://db/gsaas?user=g&password=***&ssl=1",
            ),
            ("postgres://db/g?sslpassword=x", "postgres://db/g?sslpassword=***"),
            ("https://ghp_TOKEN@host/x", "https://***@host/x"),
            ("sqlite://.gsaas/gsaas.sqlite?mode=rwc", "sqlite://.gsaas/gsaas.sqlite?mode=rwc"),
            ("postgres://db/gsaas", "postgres://db/gsaas"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn debug_and_display_show_no_password() {
        let url = SecretUrl::from("postgres://gsaas:s3cret@db/gsaas");
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(!format!("{url}").contains("s3cret"));
        assert!(!format!("{:?}", Some(url.clone())).contains("s3cret"));
        assert_eq!(url.expose(), "postgres://gsaas:s3cret@db/gsaas");
    }
}
