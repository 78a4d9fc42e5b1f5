//! The rCUDA user_data, read back the way cloud-init reads it: Python's `email` parser on the
//! decoded text, with cloud-init's payload decoding (python3 is on every machine of the project).

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use gpgpums::Remoting;
use gsaasd::cloudinit::{
    base64_len, user_data, BootEnv, GpuDevice, GpuEnv, UserDataError, MERGE_TYPE,
    NOVA_USER_DATA_MAX_BASE64, RCUDA_DEFAULT_PORT,
};
use serde::Deserialize;

/// Parses an archive as cloud-init does (`convert_string`, `_process_msg`, `fully_decoded_payload`).
const PARSE_LIKE_CLOUD_INIT: &str = r#"
import email, json, sys
data = sys.stdin.buffer.read().decode("utf-8")
def payload(part):
    p = part.get_payload(decode=True)
    if part.get_content_maintype() == "text" and isinstance(p, bytes):
        charset = part.get_charset()
        codec = charset.input_codec if charset and charset.input_codec else "utf-8"
        return p.decode(codec, "surrogateescape")
    return p
msg = email.message_from_string(data)
out = {
    "seen_as_mime": "mime-version:" in data[0:4096].lower(),
    "content_type": msg.get_content_type(),
    "boundary": msg.get_boundary(),
    "defects": [type(d).__name__ for d in msg.defects],
    "parts": [],
}
for part in msg.walk():
    if part.get_content_maintype() == "multipart":
        out["defects"] += [type(d).__name__ for d in part.defects]
        continue
    out["parts"].append({
        "content_type": part.get_content_type(),
        "headers": [[k, v] for k, v in part.items()],
        "payload": payload(part),
        "defects": [type(d).__name__ for d in part.defects],
    })
print(json.dumps(out))
"#;

/// Builds a MIME archive as cloud-init's `make-mime` does, from `[[subtype, content], ...]`.
const MAKE_MIME: &str = r#"
import json, sys
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
archive = MIMEMultipart()
for i, (subtype, content) in enumerate(json.load(sys.stdin)):
    part = MIMEText(content, subtype, "utf-8")
    part.add_header("Content-Disposition", "attachment", filename="part-%d" % i)
    archive.attach(part)
sys.stdout.write(archive.as_string())
"#;

#[derive(Debug, Deserialize)]
struct Parsed {
    seen_as_mime: bool,
    content_type: String,
    boundary: Option<String>,
    defects: Vec<String>,
    parts: Vec<ParsedPart>,
}

#[derive(Debug, Deserialize)]
struct ParsedPart {
    content_type: String,
    headers: Vec<(String, String)>,
    payload: String,
    defects: Vec<String>,
}

impl ParsedPart {
    fn headers(&self, name: &str) -> Vec<&str> {
        (self.headers.iter())
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

fn python(script: &str, input: &[u8]) -> Vec<u8> {
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "python3: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// Parses `archive` like cloud-init and checks it is a clean multipart/mixed archive.
fn parse(archive: &[u8]) -> Parsed {
    let parsed: Parsed = serde_json::from_slice(&python(PARSE_LIKE_CLOUD_INIT, archive)).unwrap();
    assert!(parsed.seen_as_mime, "cloud-init would not see a MIME archive");
    assert_eq!(parsed.content_type, "multipart/mixed");
    assert!(parsed.defects.is_empty(), "{:?}", parsed.defects);
    for part in &parsed.parts {
        assert!(part.defects.is_empty(), "{part:?}");
    }
    let boundary = parsed.boundary.as_deref().expect("a boundary");
    let text = std::str::from_utf8(archive).unwrap();
    let delimiters = text.lines().filter(|l| l.starts_with(&format!("--{boundary}"))).count();
    assert_eq!(delimiters, parsed.parts.len() + 1, "one delimiter per part and a closing one");
    parsed
}

fn two_devices() -> GpuEnv {
    GpuEnv {
        remoting: Remoting::Rcuda,
        devices: vec![
            GpuDevice {
                address: Ipv4Addr::new(192, 168, 100, 1),
                port: RCUDA_DEFAULT_PORT,
                gpu_number: 0,
                cgpu: 0,
            },
            GpuDevice {
                address: Ipv4Addr::new(192, 168, 100, 2),
                port: 9000,
                gpu_number: 3,
                cgpu: 1,
            },
        ],
        missing: vec![],
    }
}

/// Without a metadata endpoint: what cloud-init writes is the boot-time environment alone.
fn boot(env: &GpuEnv) -> BootEnv<'_> {
    BootEnv { env, metadata: None, lupine_library_dir: "/opt/lupine/lib" }
}

const PROFILE: &str = "# rCUDA client environment, set by GSaaS: live from the host (cGPUs come \
    and go), else as at boot.\nif [ -x /usr/local/bin/gsaas-env ]; then eval \
    \"$(/usr/local/bin/gsaas-env 2>/dev/null)\"; else set -a; . /etc/rcuda.env; set +a; fi\n";

const ENV_FILE: &str = "RCUDA_DEVICE_COUNT=2\n\
    RCUDA_DEVICE_0=192.168.100.1@8308:0\n\
    RCUDA_DEVICE_1=192.168.100.2@9000:3\n\
    GSAAS_CGPUS=0,1\n\
    GSAAS_CGPUS_MISSING=\n";

/// Checks the first part is our cloud-config and returns its write_files.
fn assert_rcuda_part(part: &ParsedPart) {
    assert_eq!(part.content_type, "text/cloud-config");
    assert_eq!(part.headers("Merge-Type"), [MERGE_TYPE]);
    let document = part.payload.strip_prefix("#cloud-config\n").expect("a cloud-config");
    let config: serde_json::Value = serde_json::from_str(document).unwrap();
    let expected = serde_json::json!({
        "write_files": [
            { "path": "/etc/rcuda.env", "owner": "root:root", "permissions": "0644", "content": ENV_FILE },
            {
                "path": "/usr/local/bin/gsaas-env",
                "owner": "root:root",
                "permissions": "0755",
                "content": boot(&two_devices()).gsaas_env_script(),
            },
            {
                "path": "/etc/profile.d/rcuda.sh",
                "owner": "root:root",
                "permissions": "0644",
                "content": PROFILE,
            },
        ],
        "runcmd": [["sh", "-c", "printf '\\n' >> /etc/environment && cat /etc/rcuda.env >> /etc/environment"]],
    });
    assert_eq!(config, expected);
}

#[test]
fn variables_name_each_device_with_its_masked_address() {
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect()
    };
    assert_eq!(
        two_devices().variables(),
        pairs(&[
            ("RCUDA_DEVICE_COUNT", "2"),
            ("RCUDA_DEVICE_0", "192.168.100.1@8308:0"),
            ("RCUDA_DEVICE_1", "192.168.100.2@9000:3"),
            ("GSAAS_CGPUS", "0,1"),
            ("GSAAS_CGPUS_MISSING", ""),
        ])
    );
    assert_eq!(
        GpuEnv::default().variables(),
        pairs(&[("RCUDA_DEVICE_COUNT", "0"), ("GSAAS_CGPUS", ""), ("GSAAS_CGPUS_MISSING", "")])
    );
    assert_eq!(boot(&two_devices()).profile_script(), PROFILE);
    assert_eq!(boot(&two_devices()).env_file(), ENV_FILE);
}

#[test]
fn without_user_data_the_archive_is_the_rcuda_cloud_config() {
    for user in [None, Some(&b""[..]), Some(&b" \n\t\n"[..])] {
        let archive = user_data(&boot(&two_devices()), user).unwrap();
        assert!(archive.starts_with(b"Content-Type: multipart/mixed; boundary="));
        let parsed = parse(&archive);
        assert_eq!(parsed.parts.len(), 1);
        assert_rcuda_part(&parsed.parts[0]);
        assert!(base64_len(archive.len()) < NOVA_USER_DATA_MAX_BASE64);
    }
}

/// A one-shot HTTP server on 127.0.0.1 answering every request with `body`; its address.
fn serve_once(body: &'static str) -> std::net::SocketAddrV4 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let std::net::SocketAddr::V4(addr) = listener.local_addr().unwrap() else { unreachable!() };
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let mut stream = stream.unwrap();
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    addr
}

/// Runs the profile script in a login-like shell and prints what a child process sees.
fn login_sees(profile: &std::path::Path) -> String {
    let output = Command::new("sh")
        .args(["-c", r#". "$1" && sh -c 'printf "%s|%s|%s\n" "$RCUDA_DEVICE_COUNT" "$RCUDA_DEVICE_0" "$RCUDA_DEVICE_1"'"#])
        .arg("sh")
        .arg(profile)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_profile_script_exports_the_live_or_the_boot_variables_and_boot_fills_etc_environment() {
    let dir = std::env::temp_dir().join(format!("gsaas-rcuda-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let (env_file, profile, environment, command) = (
        dir.join("rcuda.env"),
        dir.join("rcuda.sh"),
        dir.join("environment"),
        dir.join("gsaas-env"),
    );
    let env = two_devices();
    std::fs::write(&env_file, boot(&env).env_file()).unwrap();
    let relocate = |text: String| {
        text.replace("/etc/rcuda.env", env_file.to_str().unwrap())
            .replace("/etc/environment", environment.to_str().unwrap())
            .replace("/usr/local/bin/gsaas-env", command.to_str().unwrap())
    };
    std::fs::write(&profile, relocate(boot(&env).profile_script())).unwrap();
    std::fs::write(&environment, "PATH=\"/usr/bin\"").unwrap();
    let boot_command = Command::new("sh")
        .arg("-c")
        .arg(relocate(boot(&env).environment_command()))
        .status()
        .unwrap();
    assert!(boot_command.success());
    assert_eq!(
        std::fs::read_to_string(&environment).unwrap(),
        format!("PATH=\"/usr/bin\"\n{ENV_FILE}")
    );
    let install = |metadata| {
        let script = BootEnv { metadata, ..boot(&env) }.gsaas_env_script();
        std::fs::write(&command, relocate(script)).unwrap();
        let status = Command::new("chmod").arg("0755").arg(&command).status().unwrap();
        assert!(status.success());
    };
    let boot_values = "2|192.168.100.1@8308:0|192.168.100.2@9000:3\n";

    // Without the command, and without a metadata endpoint: the boot values, exported.
    assert_eq!(login_sees(&profile), boot_values);
    install(None);
    assert_eq!(login_sees(&profile), boot_values);
    // The host answers: its live values (cGPU 0 was lost since boot: the device is cGPU 1).
    install(Some(serve_once(
        "export RCUDA_DEVICE_COUNT=1\nexport RCUDA_DEVICE_0=100.127.0.1@8309:0\n\
         export GSAAS_CGPUS=1\nexport GSAAS_CGPUS_MISSING=0\n",
    )));
    assert_eq!(login_sees(&profile), "1|100.127.0.1@8309:0|\n");
    // LUPINE's variables are the layer's too; anything else is not evaluated.
    install(Some(serve_once("export RCUDA_DEVICE_COUNT=1\nexport LD_PRELOAD=/tmp/evil.so\n")));
    assert_eq!(login_sees(&profile), boot_values);
    // An answer that is not only rCUDA variables is not evaluated.
    install(Some(serve_once("export RCUDA_DEVICE_COUNT=1\ntouch /tmp/owned\n")));
    assert_eq!(login_sees(&profile), boot_values);
    // Nobody answers (a closed port): the boot values.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let std::net::SocketAddr::V4(closed_addr) = closed.local_addr().unwrap() else {
        unreachable!()
    };
    drop(closed);
    install(Some(closed_addr));
    assert_eq!(login_sees(&profile), boot_values);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_lupine_vm_gets_its_servers_in_order_and_its_client_first_on_the_library_path() {
    let dir = std::env::temp_dir().join(format!("gsaas-lupine-{}", uuid::Uuid::new_v4()));
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let env = GpuEnv { remoting: Remoting::Lupine, missing: vec![2], ..two_devices() };
    let boot_env = BootEnv { lupine_library_dir: lib.to_str().unwrap(), ..boot(&env) };
    assert_eq!(
        boot_env.env_file(),
        "LUPINE_SERVER=192.168.100.1:8308,192.168.100.2:9000\nLUPINE_DISABLE_LOCAL=1\n\
         GSAAS_CGPUS=0,1\nGSAAS_CGPUS_MISSING=2\n"
    );
    // Its own files, not rCUDA's.
    let parsed = parse(&user_data(&boot_env, None).unwrap());
    let document = parsed.parts[0].payload.strip_prefix("#cloud-config\n").unwrap();
    let config: serde_json::Value = serde_json::from_str(document).unwrap();
    let paths: Vec<&str> = config["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/etc/lupine.env", "/usr/local/bin/gsaas-env", "/etc/profile.d/lupine.sh"]);
    assert!(boot_env.environment_command().contains("cat /etc/lupine.env >> /etc/environment"));

    let (env_file, profile, command) =
        (dir.join("lupine.env"), dir.join("lupine.sh"), dir.join("gsaas-env"));
    let relocate = |text: String| {
        text.replace("/etc/lupine.env", env_file.to_str().unwrap())
            .replace("/usr/local/bin/gsaas-env", command.to_str().unwrap())
    };
    std::fs::write(&env_file, boot_env.env_file()).unwrap();
    std::fs::write(&profile, relocate(boot_env.profile_script())).unwrap();
    let sees = |ld: &str| {
        let output = Command::new("sh")
            .args([
                "-c",
                r#". "$1" && sh -c 'printf "%s|%s|%s|%s\n" "$LUPINE_SERVER" "$LUPINE_DISABLE_LOCAL" "$GSAAS_CGPUS_MISSING" "$LD_LIBRARY_PATH"'"#,
            ])
            .arg("sh")
            .arg(&profile)
            .env("LD_LIBRARY_PATH", ld)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let servers = "192.168.100.1:8308,192.168.100.2:9000|1|2";
    // Boot values (no gsaas-env), the client's directory first.
    assert_eq!(sees(""), format!("{servers}|{}\n", lib.display()));
    assert_eq!(sees("/usr/lib/x"), format!("{servers}|{}:/usr/lib/x\n", lib.display()));
    // Live from the host: its answer for a LUPINE VM must hold LUPINE_SERVER.
    let install = |metadata| {
        let script = BootEnv { metadata, ..boot_env }.gsaas_env_script();
        std::fs::write(&command, relocate(script)).unwrap();
        assert!(Command::new("chmod").arg("0755").arg(&command).status().unwrap().success());
    };
    install(Some(serve_once(
        "export LUPINE_SERVER=100.127.0.1:8308\nexport LUPINE_DISABLE_LOCAL=1\n\
         export GSAAS_CGPUS=0\nexport GSAAS_CGPUS_MISSING=1,2\n",
    )));
    assert_eq!(sees(""), format!("100.127.0.1:8308|1|1,2|{}\n", lib.display()));
    // An rCUDA answer is not this VM's: the boot values.
    install(Some(serve_once("export RCUDA_DEVICE_COUNT=1\n")));
    assert_eq!(sees(""), format!("{servers}|{}\n", lib.display()));
    // Without the client's directory, the library path is left alone.
    std::fs::remove_dir_all(&lib).unwrap();
    assert_eq!(sees("/usr/lib/x"), format!("{servers}|/usr/lib/x\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_user_cloud_config_follows_ours_and_merges_by_appending() {
    let user = "#cloud-config\nwrite_files:\n  - path: /etc/motd\n    content: hello\n";
    let parsed = parse(&user_data(&boot(&two_devices()), Some(user.as_bytes())).unwrap());
    assert_eq!(parsed.parts.len(), 2);
    assert_rcuda_part(&parsed.parts[0]);
    let part = &parsed.parts[1];
    assert_eq!(part.content_type, "text/cloud-config");
    assert_eq!(part.payload, user);
    assert_eq!(part.headers("Merge-Type"), [MERGE_TYPE]);
}

#[test]
fn a_user_shell_script_is_carried_exactly_even_when_not_ascii() {
    for script in ["#!/bin/sh\necho hello", "#!/bin/bash\necho 'héllo ✓' > /tmp/x\n"] {
        let parsed = parse(&user_data(&boot(&two_devices()), Some(script.as_bytes())).unwrap());
        assert_eq!(parsed.parts.len(), 2);
        let part = &parsed.parts[1];
        assert_eq!(part.content_type, "text/x-shellscript");
        assert_eq!(part.payload, script);
        assert!(part.headers("Merge-Type").is_empty());
        let encoding = if script.is_ascii() { "7bit" } else { "base64" };
        assert_eq!(part.headers("Content-Transfer-Encoding"), [encoding]);
    }
}

#[test]
fn other_cloud_init_types_are_labelled_by_how_they_start() {
    let cases = [
        ("#cloud-boothook\necho early\n", "text/cloud-boothook", false),
        ("#include\nhttps://example.invalid/config\n", "text/x-include-url", false),
        (
            "## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\n",
            "text/jinja2",
            true,
        ),
        ("## template: jinja\n#!/bin/sh\necho {{ v1.region }}\n", "text/jinja2", false),
        ("\n  #Cloud-Config\nruncmd: [ls]\n", "text/cloud-config", true),
    ];
    for (user, content_type, merges) in cases {
        let parsed = parse(&user_data(&boot(&two_devices()), Some(user.as_bytes())).unwrap());
        let part = &parsed.parts[1];
        assert_eq!(part.content_type, content_type, "{user:?}");
        assert_eq!(part.payload, user);
        assert_eq!(!part.headers("Merge-Type").is_empty(), merges, "{user:?}");
    }
}

#[test]
fn a_user_mime_archive_made_by_make_mime_has_its_parts_carried_over() {
    let contents = serde_json::json!([
        ["cloud-config", "#cloud-config\npackages: [htop]\n"],
        ["x-shellscript", "#!/bin/sh\necho 'ünïcode'\n"],
        ["plain", "#cloud-config\nruncmd: [date]\n"],
        ["cloud-boothook", "#cloud-boothook\necho boot\n"],
    ]);
    let user = python(MAKE_MIME, contents.to_string().as_bytes());
    let parsed = parse(&user_data(&boot(&two_devices()), Some(&user)).unwrap());
    assert_eq!(parsed.parts.len(), 5);
    assert_rcuda_part(&parsed.parts[0]);
    let carried: Vec<(&str, &str, usize)> = parsed.parts[1..]
        .iter()
        .map(|p| (p.content_type.as_str(), p.payload.as_str(), p.headers("Merge-Type").len()))
        .collect();
    assert_eq!(
        carried,
        [
            ("text/cloud-config", "#cloud-config\npackages: [htop]\n", 1),
            ("text/x-shellscript", "#!/bin/sh\necho 'ünïcode'\n", 0),
            // text/plain is typed by its content, as cloud-init does, so it merges too.
            ("text/plain", "#cloud-config\nruncmd: [date]\n", 1),
            ("text/cloud-boothook", "#cloud-boothook\necho boot\n", 0),
        ]
    );
    for (i, part) in parsed.parts[1..].iter().enumerate() {
        let disposition = format!("attachment; filename=\"part-{i}\"");
        assert_eq!(part.headers("Content-Disposition"), [disposition.as_str()]);
    }
}

#[test]
fn a_hand_written_archive_with_nesting_and_crlf_is_carried_over() {
    let user = "MIME-Version: 1.0\r\n\
        Content-Type: multipart/mixed;\r\n boundary=\"outer\"\r\n\
        \r\n\
        This is the preamble.\r\n\
        --outer\r\n\
        Content-Type: text/cloud-config\r\n\
        Merge-Type: dict(recurse_array)+list(append)\r\n\
        \r\n\
        #cloud-config\r\nbootcmd: [true]\r\n\
        --outer\r\n\
        Content-Type: multipart/alternative; boundary=inner\r\n\
        \r\n\
        --inner\r\n\
        Content-Type: text/x-shellscript\r\n\
        \r\n\
        #!/bin/sh\r\necho nested\r\n\
        --inner--\r\n\
        --outer--\r\n\
        epilogue\r\n";
    let parsed = parse(&user_data(&boot(&two_devices()), Some(user.as_bytes())).unwrap());
    assert_eq!(parsed.parts.len(), 3);
    let config = &parsed.parts[1];
    assert_eq!(config.content_type, "text/cloud-config");
    // The line break before a delimiter belongs to the delimiter.
    assert_eq!(config.payload, "#cloud-config\r\nbootcmd: [true]");
    // The user said how to merge; that stands.
    assert_eq!(config.headers("Merge-Type"), ["dict(recurse_array)+list(append)"]);
    assert_eq!(parsed.parts[2].content_type, "text/x-shellscript");
    assert_eq!(parsed.parts[2].payload, "#!/bin/sh\r\necho nested");
}

#[test]
fn the_boundary_occurs_nowhere_in_the_parts() {
    let user = "#!/bin/sh\n--==gsaas-rcuda-0==\n--==gsaas-rcuda-1==--\necho ==gsaas-rcuda-3==\n";
    let archive = user_data(&boot(&two_devices()), Some(user.as_bytes())).unwrap();
    let parsed = parse(&archive);
    let boundary = parsed.boundary.clone().unwrap();
    assert_eq!(boundary, "==gsaas-rcuda-2==");
    assert_eq!(parsed.parts.len(), 2);
    assert_eq!(parsed.parts[1].payload, user);
    for part in &parsed.parts {
        assert!(!part.payload.contains(&boundary));
        assert!(part.headers.iter().all(|(n, v)| !n.contains(&boundary) && !v.contains(&boundary)));
    }
}

#[test]
fn user_data_that_cannot_be_combined_is_refused_with_the_reason() {
    let env = two_devices();
    let refuse = |user: &[u8]| user_data(&boot(&env), Some(user)).unwrap_err();

    assert_eq!(refuse(&[0x1f, 0x8b, 0x08, 0x00, 0x00]), UserDataError::Compressed);
    assert_eq!(refuse(b"#!/bin/sh\n\xff\xfe"), UserDataError::NotUtf8 { offset: 10 });
    let err = refuse(b"echo hello\n");
    assert_eq!(err, UserDataError::UnknownType { start: "echo hello".to_owned() });
    assert!(err.to_string().starts_with("unknown type: it starts with \"echo hello\""), "{err}");
    assert!(matches!(refuse(b"{\"runcmd\": []}"), UserDataError::UnknownType { .. }));

    let untyped_part = "Content-Type: multipart/mixed; boundary=b\nMIME-Version: 1.0\n\n\
        --b\nContent-Type: text/x-shellscript\n\n#!/bin/sh\n\
        --b\nContent-Type: text/plain\n\njust some text\n--b--\n";
    assert_eq!(
        refuse(untyped_part.as_bytes()),
        UserDataError::UnknownPartType { part: 2, start: "just some text".to_owned() }
    );
    let no_boundary = "Content-Type: multipart/mixed\nMIME-Version: 1.0\n\n--b\n\n#!/bin/sh\n";
    assert!(matches!(refuse(no_boundary.as_bytes()), UserDataError::Mime(_)));
    let no_parts = "Content-Type: multipart/mixed; boundary=b\n\nnothing here\n";
    assert!(matches!(refuse(no_parts.as_bytes()), UserDataError::Mime(_)));
}

#[test]
fn nova_size_limit_is_measured_in_base64() {
    assert_eq!(NOVA_USER_DATA_MAX_BASE64, 65_535);
    assert_eq!(base64_len(49_151), 65_536);
    assert_eq!(base64_len(49_149), 65_532);
}

#[test]
fn a_thousand_cgpus_fit_in_novas_user_data_limit() {
    let env = GpuEnv {
        remoting: Remoting::Rcuda,
        devices: (0..1000)
            .map(|j| GpuDevice {
                address: Ipv4Addr::new(100, 127, 0, 1),
                port: 8308 + j,
                gpu_number: 0,
                cgpu: u32::from(j),
            })
            .collect(),
        missing: vec![],
    };
    let archive = user_data(&boot(&env), None).unwrap();
    assert!(
        base64_len(archive.len()) <= NOVA_USER_DATA_MAX_BASE64,
        "{} bytes",
        base64_len(archive.len())
    );
    assert_rcuda_vars(&parse(&archive).parts[0], 1000);
}

/// The cloud-config part sets `count` devices in the env file.
fn assert_rcuda_vars(part: &ParsedPart, count: usize) {
    let document = part.payload.strip_prefix("#cloud-config\n").expect("a cloud-config");
    let config: serde_json::Value = serde_json::from_str(document).unwrap();
    let env = config["write_files"][0]["content"].as_str().unwrap();
    // The count, each device, and which cGPU each is and which are missing.
    assert_eq!(env.lines().count(), count + 3);
    assert!(env.contains(&format!("RCUDA_DEVICE_COUNT={count}\n")));
}
