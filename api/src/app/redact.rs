//! What a tenant reads about its VM never locates its GPUs.
//!
//! gsaasd's own messages to tenants name no host, GPU or rCUDA server. The cloud's do not promise
//! that (Nova's faults and scheduler errors may name hosts), so every failure reason that becomes
//! a VM's `error` first passes [`App::tenant_message`], which hides each word, and each part of a
//! word, that is the name of a host, the id of a GPU, or the address of an rCUDA server the pool
//! knows. The whole reason goes to the log, for operators.

use std::collections::HashSet;

use super::App;

/// What a hidden word is replaced with.
pub const HIDDEN: &str = "(hidden)";

/// Characters of host names, GPU ids and `ip:port` endpoints.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':')
}

/// Host names at least this long are hidden inside longer words too (`gsaas-gpu-host-1`, an
/// availability zone named after its host); shorter ones only as whole words, lest common words
/// go.
pub const EMBEDDED_MIN_LEN: usize = 6;

/// `message` with every word in `secret`, and every part of a word that is one, replaced by
/// [`HIDDEN`]. A word is a run of name characters; a trailing full stop (the end of a sentence) is
/// not part of it. A word that is not a secret whole is looked at part by part, whatever the
/// secrets' length: its parts between `:` (`cg1:nova-compute`, the `cg1:7450` of
/// `http://cg1:7450/routes`), and the dot-separated labels of each (`cg1.gpu.example`). A part that
/// contains one of `embedded` (long host names) is hidden too.
pub fn hide_words(message: &str, secret: &HashSet<String>, embedded: &[String]) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(is_name_char) {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let len = rest.find(|c| !is_name_char(c)).unwrap_or(rest.len());
        let word = &rest[..len];
        let bare = word.trim_end_matches('.');
        if secret.contains(word) {
            out.push_str(HIDDEN);
        } else if secret.contains(bare) {
            // The full stop after it stays.
            out.push_str(HIDDEN);
            out.push_str(&word[bare.len()..]);
        } else {
            for (i, part) in bare.split(':').enumerate() {
                if i > 0 {
                    out.push(':');
                }
                let hidden = secret.contains(part)
                    || part.split('.').any(|label| secret.contains(label))
                    || embedded.iter().any(|n| part.contains(n.as_str()));
                out.push_str(if hidden { HIDDEN } else { part });
            }
            out.push_str(&word[bare.len()..]);
        }
        rest = &rest[len..];
    }
    out.push_str(rest);
    out
}

impl App {
    /// `reason` as a tenant may read it: see the module docs.
    pub(crate) async fn tenant_message(&self, reason: &str) -> String {
        let secret = self
            .read_pool(|pool| {
                let mut secret: HashSet<String> =
                    pool.hosts().map(|(host, _, _)| host.to_string()).collect();
                let embedded: Vec<String> =
                    secret.iter().filter(|h| h.len() >= EMBEDDED_MIN_LEN).cloned().collect();
                for gpu in pool.gpu_usage() {
                    secret.insert(gpu.id.to_string());
                    secret.insert(gpu.rcuda.address.to_string());
                    secret.insert(format!("{}:{}", gpu.rcuda.address, gpu.rcuda.port));
                }
                (secret, embedded)
            })
            .await;
        match secret {
            Ok((secret, embedded)) => hide_words(reason, &secret, &embedded),
            // Without the pool's names nothing can be checked: say nothing of the cause.
            Err(_) => "the launch failed; an operator can see why in gsaasd's log".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_names_and_addresses_and_host_names_inside_words() {
        let secret: HashSet<String> =
            ["gpu-host-1", "a", "10.78.0.1", "10.78.0.1:8308", "gpu-host-1:gpu2"]
                .into_iter()
                .map(String::from)
                .collect();
        let embedded = vec!["gpu-host-1".to_owned()];
        let hidden = hide_words(
            "No valid host was found. Host \"gpu-host-1\" failed (10.78.0.1:8308, a), \
             XID on gpu-host-1:gpu2 at gpu-host-1.",
            &secret,
            &embedded,
        );
        assert_eq!(
            hidden,
            "No valid host was found. Host \"(hidden)\" failed ((hidden), (hidden)), XID on \
             (hidden) at (hidden)."
        );
        // Short names hide as whole words and as parts of words, whatever their length; long
        // host names inside longer words too.
        assert_eq!(hide_words("a-b and ab", &secret, &embedded), "a-b and ab");
        assert_eq!(
            hide_words(
                "at a:nova-compute, http://a:7450/routes and a.gpu.example.",
                &secret,
                &embedded
            ),
            "at (hidden):nova-compute, http://(hidden):7450/routes and (hidden)."
        );
        assert_eq!(
            hide_words("zone gsaas-gpu-host-1 is not available.", &secret, &embedded),
            "zone (hidden) is not available."
        );
    }
}
