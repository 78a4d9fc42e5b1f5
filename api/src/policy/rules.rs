//! oslo.policy's rule language, parsed once and evaluated per request.
//!
//! A rule is checks joined by `and`, `or` and `not` (in that order of binding, `not` tightest)
//! with parentheses: `@` (always), `!` (never), `rule:NAME` (another rule), `role:NAME` (the
//! caller has the role, case-insensitively) and `KEY:VALUE`, where KEY is one of the caller's
//! credentials or a quoted literal and VALUE is a literal or `%(ATTR)s`, an attribute of the
//! thing acted on. As in oslo.policy, an empty rule allows everyone and a check whose attribute
//! the target lacks is false.
//!
//! Unlike oslo.policy, which only logs them, names gsaasd does not know are refused when the
//! file is read: a credential, a target attribute or a rule nobody defines. A typo in a policy
//! file would otherwise deny or allow in silence. Remote checks (`http:`) are not supported.

use std::fmt;

/// The credentials a rule may name (`KEY:` in `KEY:VALUE`); `role:` reads `roles`.
pub const CREDENTIALS: &[&str] = &[
    "user_id",
    "project_id",
    "project_name",
    "project_domain_id",
    "system_scope",
    "is_admin",
    "roles",
];

/// The attributes of the thing acted on a rule may name (`%(ATTR)s`).
pub const TARGET_ATTRIBUTES: &[&str] = &["project_id"];

/// A parsed rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Always,
    Never,
    Rule(String),
    Role(Value),
    /// `KEY:VALUE`: a credential (or a literal) equals the value.
    Equals(Value, Value),
    Not(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

/// A side of a check: a literal, a credential or a target attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Literal(String),
    Credential(String),
    /// `%(ATTR)s`, possibly within text.
    Target(Vec<Piece>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Attribute(String),
}

/// What a rule is evaluated against.
pub trait Facts {
    /// The credential's values (several for `roles`), or none.
    fn credential(&self, key: &str) -> Vec<String>;
    /// The target's attribute, if it has it.
    fn target(&self, attribute: &str) -> Option<String>;
    /// The rule named `name`'s verdict.
    fn rule(&self, name: &str) -> bool;
}

impl Expr {
    pub fn eval(&self, facts: &dyn Facts) -> bool {
        match self {
            Expr::Always => true,
            Expr::Never => false,
            Expr::Rule(name) => facts.rule(name),
            Expr::Role(role) => match role.resolve(facts) {
                Some(role) => {
                    facts.credential("roles").iter().any(|held| held.eq_ignore_ascii_case(&role))
                }
                None => false,
            },
            Expr::Equals(left, right) => {
                let Some(right) = right.resolve(facts) else { return false };
                match left {
                    Value::Credential(key) => facts.credential(key).contains(&right),
                    other => other.resolve(facts).is_some_and(|left| left == right),
                }
            }
            Expr::Not(inner) => !inner.eval(facts),
            Expr::And(all) => all.iter().all(|e| e.eval(facts)),
            Expr::Or(any) => any.iter().any(|e| e.eval(facts)),
        }
    }

    /// The rules it names.
    pub fn rules(&self) -> Vec<&str> {
        match self {
            Expr::Rule(name) => vec![name.as_str()],
            Expr::Not(inner) => inner.rules(),
            Expr::And(all) | Expr::Or(all) => all.iter().flat_map(Expr::rules).collect(),
            _ => Vec::new(),
        }
    }
}

impl Value {
    fn resolve(&self, facts: &dyn Facts) -> Option<String> {
        match self {
            Value::Literal(text) => Some(text.clone()),
            Value::Credential(key) => facts.credential(key).into_iter().next(),
            Value::Target(pieces) => {
                let mut out = String::new();
                for piece in pieces {
                    match piece {
                        Piece::Text(text) => out.push_str(text),
                        Piece::Attribute(name) => out.push_str(&facts.target(name)?),
                    }
                }
                Some(out)
            }
        }
    }
}

/// Why a rule does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError(pub String);

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses a rule.
pub fn parse(text: &str) -> Result<Expr, SyntaxError> {
    let tokens = tokenize(text);
    if tokens.is_empty() {
        return Ok(Expr::Always);
    }
    let mut parser = Parser { tokens, at: 0 };
    let expr = parser.or()?;
    match parser.tokens.get(parser.at) {
        None => Ok(expr),
        Some(token) => Err(SyntaxError(format!("unexpected {token:?} after a complete rule"))),
    }
}

/// Words and parentheses, as oslo.policy splits them: at white space (a quoted literal keeps its
/// spaces), then the `(`s a word starts with and the `)`s it ends with are tokens of their own
/// (so `%(project_id)s` stays whole).
fn tokenize(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                word.push(c);
                quote = None;
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                word.push(c);
                quote = Some(c);
            }
            (None, c) if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            (None, c) => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let mut tokens = Vec::new();
    for word in words {
        let inner = word.trim_start_matches('(');
        tokens.extend(std::iter::repeat_n("(".to_owned(), word.len() - inner.len()));
        let core = inner.trim_end_matches(')');
        if !core.is_empty() {
            tokens.push(core.to_owned());
        }
        tokens.extend(std::iter::repeat_n(")".to_owned(), inner.len() - core.len()));
    }
    tokens
}

struct Parser {
    tokens: Vec<String>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn next(&mut self) -> Option<String> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn or(&mut self) -> Result<Expr, SyntaxError> {
        let mut any = vec![self.and()?];
        while self.peek().is_some_and(|t| t.eq_ignore_ascii_case("or")) {
            self.at += 1;
            any.push(self.and()?);
        }
        Ok(if any.len() == 1 { any.remove(0) } else { Expr::Or(any) })
    }

    fn and(&mut self) -> Result<Expr, SyntaxError> {
        let mut all = vec![self.not()?];
        while self.peek().is_some_and(|t| t.eq_ignore_ascii_case("and")) {
            self.at += 1;
            all.push(self.not()?);
        }
        Ok(if all.len() == 1 { all.remove(0) } else { Expr::And(all) })
    }

    fn not(&mut self) -> Result<Expr, SyntaxError> {
        if self.peek().is_some_and(|t| t.eq_ignore_ascii_case("not")) {
            self.at += 1;
            return Ok(Expr::Not(Box::new(self.not()?)));
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Expr, SyntaxError> {
        let Some(token) = self.next() else {
            return Err(SyntaxError("the rule ends where a check was expected".into()));
        };
        match token.as_str() {
            "(" => {
                let inner = self.or()?;
                match self.next().as_deref() {
                    Some(")") => Ok(inner),
                    _ => Err(SyntaxError("a '(' is never closed".into())),
                }
            }
            ")" => Err(SyntaxError("a ')' closes nothing".into())),
            "@" => Ok(Expr::Always),
            "!" => Ok(Expr::Never),
            word if ["and", "or"].iter().any(|op| word.eq_ignore_ascii_case(op)) => {
                Err(SyntaxError(format!("'{word}' where a check was expected")))
            }
            _ => check(&token),
        }
    }
}

/// One `KIND:MATCH` check.
fn check(token: &str) -> Result<Expr, SyntaxError> {
    let Some((kind, matched)) = split_check(token) else {
        return Err(SyntaxError(format!(
            "{token:?} is not a check: use @, !, rule:NAME, role:NAME or KEY:VALUE"
        )));
    };
    if matched.is_empty() {
        return Err(SyntaxError(format!("{token:?} names nothing after the ':'")));
    }
    match kind {
        "rule" => Ok(Expr::Rule(matched.to_owned())),
        "role" => Ok(Expr::Role(value(matched)?)),
        "http" | "https" => Err(SyntaxError(format!(
            "{token:?}: remote checks (http:, https:) are not supported by gsaasd"
        ))),
        _ => {
            let left = match unquote(kind) {
                Some(literal) => Value::Literal(literal),
                None if kind == "roles" || !CREDENTIALS.contains(&kind) => {
                    return Err(SyntaxError(format!(
                        "unknown credential {kind:?} in {token:?} (a rule may name {}; roles \
                         with role:NAME)",
                        CREDENTIALS[..CREDENTIALS.len() - 1].join(", ")
                    )))
                }
                None => Value::Credential(kind.to_owned()),
            };
            Ok(Expr::Equals(left, value(matched)?))
        }
    }
}

/// `KIND:MATCH` at the first ':' outside quotes.
fn split_check(token: &str) -> Option<(&str, &str)> {
    let mut quote = None;
    for (i, c) in token.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, ':') => return Some((&token[..i], &token[i + 1..])),
            _ => {}
        }
    }
    None
}

fn unquote(text: &str) -> Option<String> {
    let quoted = |q: char| text.len() >= 2 && text.starts_with(q) && text.ends_with(q);
    (quoted('\'') || quoted('"')).then(|| text[1..text.len() - 1].to_owned())
}

/// A check's right side: a literal, or text with `%(ATTR)s` in it.
fn value(text: &str) -> Result<Value, SyntaxError> {
    if let Some(literal) = unquote(text) {
        return Ok(Value::Literal(literal));
    }
    if !text.contains("%(") {
        return Ok(Value::Literal(text.to_owned()));
    }
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("%(") {
        if start > 0 {
            pieces.push(Piece::Text(rest[..start].to_owned()));
        }
        let after = &rest[start + 2..];
        let Some(end) = after.find(")s") else {
            return Err(SyntaxError(format!("{text:?}: a %( is not closed by )s")));
        };
        let name = &after[..end];
        if !TARGET_ATTRIBUTES.contains(&name) {
            return Err(SyntaxError(format!(
                "unknown target attribute {name:?} in {text:?} (a rule may name {})",
                TARGET_ATTRIBUTES.iter().map(|a| format!("%({a})s")).collect::<Vec<_>>().join(", ")
            )));
        }
        pieces.push(Piece::Attribute(name.to_owned()));
        rest = &after[end + 2..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    Ok(Value::Target(pieces))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Known {
        credentials: HashMap<&'static str, Vec<&'static str>>,
        target: HashMap<&'static str, &'static str>,
        rules: HashMap<&'static str, bool>,
    }

    impl Facts for Known {
        fn credential(&self, key: &str) -> Vec<String> {
            self.credentials
                .get(key)
                .map_or_else(Vec::new, |v| v.iter().map(|s| (*s).to_owned()).collect())
        }
        fn target(&self, attribute: &str) -> Option<String> {
            self.target.get(attribute).map(|s| (*s).to_owned())
        }
        fn rule(&self, name: &str) -> bool {
            self.rules.get(name).copied().unwrap_or(false)
        }
    }

    fn member_of(project: &'static str, target: &'static str) -> Known {
        Known {
            credentials: HashMap::from([
                ("roles", vec!["Member", "reader"]),
                ("project_id", vec![project]),
                ("is_admin", vec!["False"]),
            ]),
            target: HashMap::from([("project_id", target)]),
            rules: HashMap::from([("yes", true), ("no", false)]),
        }
    }

    fn eval(rule: &str, facts: &Known) -> bool {
        parse(rule).unwrap_or_else(|e| panic!("{rule}: {e}")).eval(facts)
    }

    #[test]
    fn checks_and_their_operators_read_as_oslo_policy_reads_them() {
        let own = member_of("p1", "p1");
        let other = member_of("p1", "p2");
        for (rule, on_own, on_other) in [
            ("", true, true),
            ("@", true, true),
            ("!", false, false),
            ("role:member", true, true),
            ("role:admin", false, false),
            ("project_id:%(project_id)s", true, false),
            ("role:member and project_id:%(project_id)s", true, false),
            ("role:admin or project_id:%(project_id)s", true, false),
            ("not role:admin", true, true),
            ("not (role:member or role:admin)", false, false),
            ("rule:yes and not rule:no", true, true),
            // `and` binds tighter than `or`, `not` tighter than both.
            ("rule:yes or rule:no and rule:no", true, true),
            ("(rule:yes or rule:no) and rule:no", false, false),
            ("not rule:no and rule:no", false, false),
            ("is_admin:True", false, false),
            ("is_admin:False", true, true),
            ("'p1':%(project_id)s", true, false),
            ("project_id:p1", true, true),
            ("project_id:'p2'", false, false),
            ("project_name:x", false, false),
            ("AND_not_an_operator:x", false, false),
        ] {
            if rule.starts_with("AND_") {
                assert!(parse(rule).is_err(), "{rule}");
                continue;
            }
            assert_eq!((eval(rule, &own), eval(rule, &other)), (on_own, on_other), "{rule}");
        }
        // A target without the attribute: false, as oslo.policy's KeyError.
        let mut bare = member_of("p1", "p1");
        bare.target.clear();
        assert!(!eval("project_id:%(project_id)s", &bare));
        assert!(eval("not project_id:%(project_id)s", &bare));
    }

    #[test]
    fn what_does_not_parse_is_named() {
        for (rule, says) in [
            ("role:member and", "ends where a check"),
            ("(role:member", "never closed"),
            ("role:member)", "unexpected"),
            ("member", "not a check"),
            ("role:", "names nothing"),
            ("or role:member", "'or' where a check"),
            ("http://example.com/check", "remote checks"),
            ("projet_id:%(project_id)s", "unknown credential \"projet_id\""),
            ("roles:member", "unknown credential \"roles\""),
            ("project_id:%(projet_id)s", "unknown target attribute \"projet_id\""),
            ("project_id:%(project_id", "not closed"),
        ] {
            let error = parse(rule).expect_err(rule).0;
            assert!(error.contains(says), "{rule}: {error}");
        }
    }

    #[test]
    fn the_rules_a_rule_names_are_listed() {
        let expr = parse("rule:a or (rule:b and not rule:c) or role:x").unwrap();
        assert_eq!(expr.rules(), ["a", "b", "c"]);
    }
}
