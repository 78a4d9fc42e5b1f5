//! The cloud-init user_data of a cGPU VM: the remote-GPU environment, combined with the user's own.
//!
//! A VM finds its cGPUs through its layer's client variables (rCUDA's `RCUDA_DEVICE_COUNT` and
//! `RCUDA_DEVICE_<j>=<address>@<port>:<gpu>`, LUPINE's `LUPINE_SERVER=<address>:<port>,...`) and
//! GSaaS's own (`GSAAS_CGPUS`, `GSAAS_CGPUS_MISSING`: see `rodvr_contract::env`), pointing at the
//! masked addresses the host's agent routes. GSaaS sets them at first boot through cloud-init, and
//! the tenant may bring user_data of their own, so both must run. Nova takes one user_data blob, so we build a MIME multipart
//! archive, the form cloud-init reads as several parts: first ours, a `text/cloud-config` that
//! writes `/etc/profile.d/<layer>.sh` (login shells, live from the host through `gsaas-env`) and
//! appends to `/etc/environment` (everything else, through pam_env, as at boot), then the
//! user's.
//!
//! The user's data is typed the way cloud-init types it, by how it starts (`#cloud-config`, `#!`,
//! ...); a MIME archive of their own has its parts carried into ours unchanged. cloud-init merges
//! cloud-config parts in order and by default a later `write_files` replaces an earlier one, which
//! would drop ours, so every cloud-config part gets a `Merge-Type` header that appends lists
//! instead (unless it already says how to merge). Anything we cannot type, or cannot combine
//! (compressed or non-UTF-8 data), is refused rather than passed on to fail silently in the VM.
//!
//! Our cloud-config is written as JSON, which YAML parsers read as YAML: serde_json's escaping
//! makes it correct without a YAML dependency. The archive's boundary is chosen to occur nowhere in
//! the parts, so no part can end early. Parts not plain ASCII are base64-encoded, since cloud-init
//! parses the archive as a `str` and would mangle 8-bit bodies.

use std::fmt::Write as _;

use base64::Engine as _;

/// rCUDA's daemon port when none is configured.
pub const RCUDA_DEFAULT_PORT: u16 = Remoting::Rcuda.default_port();

/// Nova's limit, which a VM's user_data must fit (the cloud says so: `Cloud::check_user_data_len`).
pub use gsaas_clouds::cloud::nova::{base64_len, NOVA_USER_DATA_MAX_BASE64};

/// Where the VM's variables are written (`NAME=value` per line), once, read by both of the
/// files below, so that a VM with a thousand cGPUs still fits Nova's 65,535-byte user_data. Per
/// layer: an rCUDA VM's at the path it always had.
pub fn env_file_path(remoting: Remoting) -> &'static str {
    match remoting {
        Remoting::Rcuda => "/etc/rcuda.env",
        Remoting::Lupine => "/etc/lupine.env",
    }
}
/// Where the VM's login shells get the variables (it exports what [`env_file_path`] sets).
pub fn profile_path(remoting: Remoting) -> &'static str {
    match remoting {
        Remoting::Rcuda => "/etc/profile.d/rcuda.sh",
        Remoting::Lupine => "/etc/profile.d/lupine.sh",
    }
}
/// Where every other process of the VM gets them (pam_env); the env file is appended at boot.
pub const ENVIRONMENT_PATH: &str = "/etc/environment";
/// cloud-init's merge rule that appends lists (`write_files`, `runcmd`) rather than replacing them.
pub const MERGE_TYPE: &str = "list(append)+dict(no_replace,recurse_list)+str()";

use gpgpums::Remoting;
pub use rodvr_contract::protocol::{GpuDevice, GpuEnv};

/// The command that prints the VM's environment as `export` lines: live from the host's agent
/// when it answers, else the values written at boot.
pub const GSAAS_ENV_PATH: &str = "/usr/local/bin/gsaas-env";

/// The names of the variables GSaaS sets, as `sed -E` and `grep -E` read them.
const VARIABLE_NAMES: &str = "(RCUDA|LUPINE|GSAAS)_[A-Z0-9_]+";
/// Their values: addresses, ports, numbers and commas (never quoted), possibly empty.
const VARIABLE_VALUES: &str = "[0-9.@:,]*";

/// What GSaaS's cloud-config sets up in a VM: its remote-GPU environment at boot, and where the
/// VM reads it live (the masked metadata endpoint its host's agent answers at), when configured.
#[derive(Debug, Clone, Copy)]
pub struct BootEnv<'a> {
    pub env: &'a GpuEnv,
    pub metadata: Option<std::net::SocketAddrV4>,
    /// Where a LUPINE VM's image keeps the client libraries (`remoting.lupine_library_dir`).
    pub lupine_library_dir: &'a str,
}

impl BootEnv<'_> {
    fn remoting(&self) -> Remoting {
        self.env.remoting
    }

    /// The content of [`env_file_path`]. The values never need quoting (addresses, numbers and
    /// commas), so the same lines are valid shell assignments and `/etc/environment` entries.
    pub fn env_file(&self) -> String {
        let mut lines = String::new();
        for (name, value) in self.env.variables() {
            let _ = writeln!(lines, "{name}={value}");
        }
        lines
    }

    /// The content of [`profile_path`]: exports what [`GSAAS_ENV_PATH`] prints, or what the env
    /// file sets when that command is gone; for LUPINE, also puts its client first on
    /// `LD_LIBRARY_PATH` where the image has it.
    pub fn profile_script(&self) -> String {
        let env_file = env_file_path(self.remoting());
        let mut script = format!(
            "# {} client environment, set by GSaaS: live from the host (cGPUs come and go), \
             else as at boot.\n\
             if [ -x {GSAAS_ENV_PATH} ]; then eval \"$({GSAAS_ENV_PATH} 2>/dev/null)\"; \
             else set -a; . {env_file}; set +a; fi\n",
            match self.remoting() {
                Remoting::Rcuda => "rCUDA",
                Remoting::Lupine => "LUPINE",
            }
        );
        if self.remoting() == Remoting::Lupine {
            let dir = self.lupine_library_dir;
            let _ = write!(
                script,
                "# LUPINE's client (libcuda.so.1, libnvidia-ml.so.1) before any other.\n\
                 if [ -d {dir} ]; then export LD_LIBRARY_PATH={dir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}; fi\n"
            );
        }
        script
    }

    /// The content of [`GSAAS_ENV_PATH`]. What the agent answers (`/gpu.env`) is checked line by
    /// line (only `export` of GSaaS's variables with addresses, numbers and commas, and the
    /// layer's first variable among them) before a shell evaluates it.
    pub fn gsaas_env_script(&self) -> String {
        let first = match self.remoting() {
            Remoting::Rcuda => "RCUDA_DEVICE_COUNT=[0-9]",
            Remoting::Lupine => "LUPINE_SERVER=",
        };
        let live = match self.metadata {
            Some(endpoint) => format!(
                "url=http://{endpoint}/gpu.env\n\
                 live=$( (curl -fsS --connect-timeout 1 --max-time 2 \"$url\" || \
                 wget -q -T 2 -O - \"$url\") 2>/dev/null)\n\
                 if [ -n \"$live\" ] \\\n\
                 \x20 && ! printf '%s\\n' \"$live\" | grep -Evq '^export {VARIABLE_NAMES}={VARIABLE_VALUES}$' \\\n\
                 \x20 && printf '%s\\n' \"$live\" | grep -q '^export {first}'; then\n\
                 \x20 printf '%s\\n' \"$live\"\n\
                 \x20 exit 0\n\
                 fi\n\
                 echo \"gsaas-env: the host did not answer; these are the values at boot\" >&2\n"
            ),
            None => String::new(),
        };
        format!(
            "#!/bin/sh\n\
             # Prints this VM's remote-GPU environment as export lines (GSaaS): eval \"$(gsaas-env)\".\n\
             {live}\
             sed -nE 's/^({VARIABLE_NAMES}={VARIABLE_VALUES})$/export \\1/p' {}\n",
            env_file_path(self.remoting())
        )
    }

    /// The boot command that appends the env file to [`ENVIRONMENT_PATH`] (after a newline, in
    /// case the file does not end with one).
    pub fn environment_command(&self) -> String {
        format!(
            "printf '\\n' >> {ENVIRONMENT_PATH} && cat {} >> {ENVIRONMENT_PATH}",
            env_file_path(self.remoting())
        )
    }

    /// Our cloud-config document.
    fn cloud_config(&self) -> String {
        let config = serde_json::json!({
            "write_files": [
                {
                    "path": env_file_path(self.remoting()),
                    "owner": "root:root",
                    "permissions": "0644",
                    "content": self.env_file(),
                },
                {
                    "path": GSAAS_ENV_PATH,
                    "owner": "root:root",
                    "permissions": "0755",
                    "content": self.gsaas_env_script(),
                },
                {
                    "path": profile_path(self.remoting()),
                    "owner": "root:root",
                    "permissions": "0644",
                    "content": self.profile_script(),
                },
            ],
            "runcmd": [["sh", "-c", self.environment_command()]],
        });
        format!("#cloud-config\n{config}\n")
    }
}

/// Why the user's user_data cannot be combined with GSaaS's GPU configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserDataError {
    #[error("gzip-compressed data cannot be combined with GSaaS's GPU configuration; send it uncompressed")]
    Compressed,
    #[error("not UTF-8 text (invalid byte at offset {offset})")]
    NotUtf8 { offset: usize },
    #[error("unknown type: it starts with {start:?}; cloud-init runs {KNOWN_TYPES}")]
    UnknownType { start: String },
    #[error("part {part} of the MIME archive has an unknown type: it starts with {start:?}; cloud-init runs {KNOWN_TYPES}")]
    UnknownPartType { part: usize, start: String },
    #[error("malformed MIME archive: {0}")]
    Mime(String),
}

const KNOWN_TYPES: &str =
    "#cloud-config, #!, #cloud-boothook, #include, ## template: jinja or a MIME multipart archive";

/// cloud-init's types by how the data starts (case-insensitive, after leading whitespace), longest
/// first so that `#include-once` is not taken for `#include`.
const STARTS: &[(&str, &str)] = &[
    ("#cloud-config-archive", "text/cloud-config-archive"),
    ("#cloud-config-jsonp", "text/cloud-config-jsonp"),
    ("## template: jinja", "text/jinja2"),
    ("#cloud-boothook", "text/cloud-boothook"),
    ("#include-once", "text/x-include-once-url"),
    ("#cloud-config", "text/cloud-config"),
    ("#part-handler", "text/part-handler"),
    ("#include", "text/x-include-url"),
    ("#!", "text/x-shellscript"),
];

const CLOUD_CONFIG: &str = "text/cloud-config";
const JINJA: &str = "text/jinja2";

fn type_from_start(payload: &[u8]) -> Option<&'static str> {
    let start = payload.trim_ascii_start();
    STARTS.iter().find(|(prefix, _)| starts_with_ignore_case(start, prefix)).map(|(_, t)| *t)
}

fn starts_with_ignore_case(data: &[u8], prefix: &str) -> bool {
    data.get(..prefix.len()).is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
}

/// Whether a part of this type ends up as cloud-config (a jinja template renders to its second
/// line's type).
fn is_cloud_config(content_type: &str, payload: &[u8]) -> bool {
    match content_type {
        CLOUD_CONFIG => true,
        JINJA => {
            let rest = payload.trim_ascii_start();
            let rest = rest.iter().position(|&b| b == b'\n').map_or(&[][..], |i| &rest[i + 1..]);
            type_from_start(rest) == Some(CLOUD_CONFIG)
        }
        _ => false,
    }
}

fn start_of(payload: &[u8]) -> String {
    let text = String::from_utf8_lossy(payload.trim_ascii_start());
    text.lines().next().unwrap_or("").chars().take(40).collect()
}

/// One part of our archive: its header lines, each ending in a newline, and its body.
#[derive(Debug)]
struct Part {
    headers: String,
    body: String,
}

impl Part {
    fn new(content_type: &str, filename: &str, content: &str, merge: bool) -> Self {
        let ascii = content.is_ascii();
        let charset = if ascii { "us-ascii" } else { "utf-8" };
        let mut headers = format!(
            "Content-Type: {content_type}; charset=\"{charset}\"\nMIME-Version: 1.0\n\
             Content-Transfer-Encoding: {}\n\
             Content-Disposition: attachment; filename=\"{filename}\"\n",
            if ascii { "7bit" } else { "base64" },
        );
        if merge {
            let _ = writeln!(headers, "Merge-Type: {MERGE_TYPE}");
        }
        let body = if ascii { content.to_owned() } else { base64_lines(content.as_bytes()) };
        Self { headers, body }
    }
}

fn base64_lines(data: &[u8]) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(data);
    let mut lines = String::with_capacity(encoded.len() + encoded.len() / 76 + 1);
    for chunk in encoded.as_bytes().chunks(76) {
        // Base64 output is ASCII.
        lines.push_str(&String::from_utf8_lossy(chunk));
        lines.push('\n');
    }
    lines
}

/// The complete user_data of a VM: the remote-GPU environment, then the user's own, if any.
pub fn user_data(boot: &BootEnv<'_>, user: Option<&[u8]>) -> Result<Vec<u8>, UserDataError> {
    let mut parts = vec![Part::new(CLOUD_CONFIG, "gsaas-rcuda.cfg", &boot.cloud_config(), true)];
    if let Some(user) = user.filter(|u| !u.trim_ascii().is_empty()) {
        user_parts(user, &mut parts)?;
    }

    let mut rendered = String::new();
    for part in &parts {
        rendered.push_str(&part.headers);
        rendered.push('\n');
        rendered.push_str(&part.body);
        rendered.push('\n');
    }
    let boundary = boundary_absent_from(&rendered);
    let mut archive =
        format!("Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n");
    for part in &parts {
        // The newline before a delimiter belongs to the delimiter, so bodies stay exact.
        let _ = write!(archive, "--{boundary}\n{}\n{}\n", part.headers, part.body);
    }
    let _ = writeln!(archive, "--{boundary}--");
    Ok(archive.into_bytes())
}

/// The first of `==gsaas-rcuda-0==`, `-1`, ... not in `content`. Content of length n contains at
/// most n of these equally long strings, so the search ends.
fn boundary_absent_from(content: &str) -> String {
    let mut n: u64 = 0;
    loop {
        let candidate = format!("==gsaas-rcuda-{n}==");
        if !content.contains(&candidate) {
            return candidate;
        }
        n += 1;
    }
}

fn user_parts(user: &[u8], parts: &mut Vec<Part>) -> Result<(), UserDataError> {
    if user.starts_with(&[0x1f, 0x8b]) {
        return Err(UserDataError::Compressed);
    }
    let text = std::str::from_utf8(user)
        .map_err(|err| UserDataError::NotUtf8 { offset: err.valid_up_to() })?;
    if let Some(content_type) = type_from_start(user) {
        let merge = is_cloud_config(content_type, user);
        parts.push(Part::new(content_type, "user-data", text, merge));
        return Ok(());
    }
    let archive = Entity::parse(text);
    if archive.headers.is_empty() || archive.header("content-type").is_none() {
        return Err(UserDataError::UnknownType { start: start_of(user) });
    }
    let mut count = 0;
    carry_over(&archive, parts, &mut count, 0)
}

const MAX_NESTING: usize = 8;

/// Carries the leaf parts of a user's MIME entity into ours, headers and body unchanged.
fn carry_over(
    entity: &Entity<'_>,
    parts: &mut Vec<Part>,
    count: &mut usize,
    depth: usize,
) -> Result<(), UserDataError> {
    let (media_type, params) = match entity.header("content-type") {
        Some(value) => parse_content_type(&value),
        None => ("text/plain".to_owned(), Vec::new()),
    };
    if media_type.starts_with("multipart/") {
        if depth >= MAX_NESTING {
            return Err(UserDataError::Mime(format!("nested deeper than {MAX_NESTING} levels")));
        }
        let boundary = params
            .iter()
            .find(|(name, _)| name == "boundary")
            .map(|(_, value)| value.as_str())
            .filter(|b| !b.is_empty())
            .ok_or_else(|| UserDataError::Mime(format!("{media_type} without a boundary")))?;
        for part in split_multipart(entity.body, boundary)? {
            carry_over(&Entity::parse(part), parts, count, depth + 1)?;
        }
        return Ok(());
    }

    *count += 1;
    let payload = entity.decoded_body();
    let content_type = match media_type.as_str() {
        // cloud-init types these by their content, as it does user_data that is not MIME.
        "text/plain" | "text/x-not-multipart" => type_from_start(&payload).ok_or_else(|| {
            UserDataError::UnknownPartType { part: *count, start: start_of(&payload) }
        })?,
        "text/x-shellscript" => type_from_start(&payload).unwrap_or("text/x-shellscript"),
        other => other,
    };
    let mut headers = entity.header_block.to_owned();
    if !headers.ends_with('\n') {
        headers.push('\n');
    }
    let says_how_to_merge =
        entity.header("merge-type").is_some() || entity.header("x-merge-type").is_some();
    if is_cloud_config(content_type, &payload) && !says_how_to_merge {
        let _ = writeln!(headers, "Merge-Type: {MERGE_TYPE}");
    }
    parts.push(Part { headers, body: entity.body.to_owned() });
    Ok(())
}

/// A MIME entity: its header block as written, the headers unfolded, and its body.
#[derive(Debug)]
struct Entity<'a> {
    header_block: &'a str,
    /// Lowercase names, unfolded values.
    headers: Vec<(String, String)>,
    body: &'a str,
}

impl<'a> Entity<'a> {
    /// Headers up to the first empty line; like Python's parser, a line that is not a header ends
    /// them too (and starts the body).
    fn parse(text: &'a str) -> Self {
        let mut headers: Vec<(String, String)> = Vec::new();
        let mut offset = 0;
        while offset < text.len() {
            let end = text[offset..].find('\n').map_or(text.len(), |i| offset + i + 1);
            let line = text[offset..end].trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                return Self { header_block: &text[..offset], headers, body: &text[end..] };
            }
            if line.starts_with([' ', '\t']) && !headers.is_empty() {
                if let Some((_, value)) = headers.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
            } else if let Some((name, value)) = line.split_once(':').filter(|(name, _)| {
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
            }) {
                headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
            } else {
                return Self { header_block: &text[..offset], headers, body: &text[offset..] };
            }
            offset = end;
        }
        Self { header_block: text, headers, body: "" }
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
    }

    /// The body with its transfer encoding undone (base64; others are left as they are, which
    /// is enough to see how the content starts).
    fn decoded_body(&self) -> Vec<u8> {
        let encoding = self.header("content-transfer-encoding").unwrap_or_default();
        if encoding.eq_ignore_ascii_case("base64") {
            let compact: String = self.body.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            if let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(compact) {
                return decoded;
            }
        }
        self.body.as_bytes().to_vec()
    }
}

/// `type/subtype` lowercased, and the parameters (names lowercased, quotes removed).
fn parse_content_type(value: &str) -> (String, Vec<(String, String)>) {
    let mut fields = split_unquoted(value, ';').into_iter();
    let media_type = fields.next().unwrap_or_default().trim().to_ascii_lowercase();
    let params = fields
        .filter_map(|field| {
            let (name, value) = field.split_once('=')?;
            Some((name.trim().to_ascii_lowercase(), unquote(value.trim())))
        })
        .collect();
    (media_type, params)
}

fn split_unquoted(value: &str, separator: char) -> Vec<&str> {
    let mut fields = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                fields.push(&value[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    fields.push(&value[start..]);
    fields
}

fn unquote(value: &str) -> String {
    let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        return value.to_owned();
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' { chars.next().unwrap_or('\\') } else { c });
    }
    out
}

/// The parts of a multipart body (RFC 2046): between `--boundary` lines, up to `--boundary--`
/// (or the end, as lenient parsers accept). The line break before a delimiter is not part of
/// the part.
fn split_multipart<'a>(body: &'a str, boundary: &str) -> Result<Vec<&'a str>, UserDataError> {
    let delimiter = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut part_start: Option<usize> = None;
    let mut offset = 0;
    while offset < body.len() {
        let end = body[offset..].find('\n').map_or(body.len(), |i| offset + i + 1);
        let line = body[offset..end].trim_end_matches(['\r', '\n']);
        if let Some(rest) = line.strip_prefix(&delimiter) {
            let closing = rest.starts_with("--");
            let rest = rest.strip_prefix("--").unwrap_or(rest);
            if rest.trim_matches([' ', '\t']).is_empty() {
                if let Some(start) = part_start {
                    let before = &body[start..offset];
                    let before = before.strip_suffix('\n').unwrap_or(before);
                    parts.push(before.strip_suffix('\r').unwrap_or(before));
                }
                if closing {
                    return Ok(parts);
                }
                part_start = Some(end);
            }
        }
        offset = end;
    }
    match part_start {
        Some(start) => {
            parts.push(&body[start..]);
            Ok(parts)
        }
        None => Err(UserDataError::Mime(format!("no part starts with the boundary {boundary:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_recognised_as_cloud_init_does() {
        let cases: &[(&str, Option<&str>)] = &[
            ("#cloud-config\n{}", Some("text/cloud-config")),
            ("  \n#Cloud-Config\n", Some("text/cloud-config")),
            ("#cloud-config-archive\n- a", Some("text/cloud-config-archive")),
            ("#!/bin/bash\n", Some("text/x-shellscript")),
            ("#cloud-boothook\n", Some("text/cloud-boothook")),
            ("#include\nhttp://x\n", Some("text/x-include-url")),
            ("#include-once\nhttp://x\n", Some("text/x-include-once-url")),
            ("## template: jinja\n#cloud-config\n", Some("text/jinja2")),
            ("echo hi", None),
            ("", None),
        ];
        for (payload, expected) in cases {
            assert_eq!(type_from_start(payload.as_bytes()), *expected, "{payload:?}");
        }
        assert!(is_cloud_config(JINJA, b"## template: jinja\n#cloud-config\n"));
        assert!(!is_cloud_config(JINJA, b"## template: jinja\n#!/bin/sh\n"));
    }

    #[test]
    fn content_type_parameters_are_parsed() {
        let (media, params) =
            parse_content_type(r#"Multipart/Mixed; BOUNDARY="a;b\"c"; charset=utf-8"#);
        assert_eq!(media, "multipart/mixed");
        assert_eq!(
            params,
            [
                ("boundary".to_owned(), "a;b\"c".to_owned()),
                ("charset".to_owned(), "utf-8".to_owned())
            ]
        );
    }

    #[test]
    fn multipart_bodies_split_at_delimiter_lines_only() {
        let body =
            "preamble\r\n--b\r\nA: 1\r\n\r\none\r\n--bx\r\n--b  \r\n\r\ntwo\r\n--b--\r\nepilogue";
        assert_eq!(split_multipart(body, "b").unwrap(), ["A: 1\r\n\r\none\r\n--bx", "\r\ntwo"]);
        assert_eq!(split_multipart("--b\nunterminated\n", "b").unwrap(), ["unterminated\n"]);
        assert!(split_multipart("no parts", "b").is_err());
    }

    #[test]
    fn entities_split_headers_from_body() {
        let entity = Entity::parse("Content-Type: text/plain;\n charset=x\nX-A: b\n\nbody\n");
        assert_eq!(entity.header("content-type").unwrap(), "text/plain; charset=x");
        assert_eq!(entity.header_block, "Content-Type: text/plain;\n charset=x\nX-A: b\n");
        assert_eq!(entity.body, "body\n");
        let entity = Entity::parse("#!/bin/sh\n");
        assert!(entity.headers.is_empty());
        assert_eq!(entity.body, "#!/bin/sh\n");
    }
}
