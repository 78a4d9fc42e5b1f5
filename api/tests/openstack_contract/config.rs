//! OpenStack credentials (clouds.yaml, `OS_*`) and Keystone over TLS.

use super::*;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gsaas-os-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const CLOUDS_YAML: &str = "
clouds:
  gsaas:
    auth:
      auth_url: http://127.0.0.1:35000/v3
      username: admin
      password: adminpw
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
    interface: internal
    identity_api_version: 3
";

#[test]
fn clouds_yaml_and_os_variables() {
    let dir = temp_dir("clouds");
    let path = dir.join("clouds.yaml");
    std::fs::write(&path, CLOUDS_YAML).unwrap();
    let no_env = |_: &str| -> Option<String> { None };
    let settings = AuthSettings::load(Some("gsaas"), Some(&path), &no_env).unwrap();
    assert_eq!(settings.identity_v3(), "http://127.0.0.1:35000/v3");
    assert_eq!(settings.username.as_deref(), Some("admin"));
    assert_eq!(settings.interface, "internal");
    assert_eq!(settings.region_name.as_deref(), Some("RegionOne"));
    assert_eq!(
        settings.password_auth_body()["auth"]["identity"]["password"]["user"],
        json!({ "name": "admin", "domain": { "name": "Default" }, "password": "adminpw" })
    );
    assert!(!format!("{settings:?}").contains("adminpw"), "Debug hides the password");

    // OS_CLOUD names the cloud, OS_CLIENT_CONFIG_FILE the file; OS_* override its fields.
    let file = path.display().to_string();
    let env = move |name: &str| match name {
        "OS_CLOUD" => Some("gsaas".to_owned()),
        "OS_CLIENT_CONFIG_FILE" => Some(file.clone()),
        "OS_REGION_NAME" => Some("RegionTwo".to_owned()),
        _ => None,
    };
    let settings = AuthSettings::load(None, None, &env).unwrap();
    assert_eq!(settings.region_name.as_deref(), Some("RegionTwo"));

    // Only OS_* variables.
    let env = |name: &str| {
        let value = match name {
            "OS_AUTH_URL" => "http://keystone:5000",
            "OS_USERNAME" => "gsaas",
            "OS_PASSWORD" => "secret",
            "OS_PROJECT_ID" => PROJECT,
            "OS_USER_DOMAIN_ID" => "default",
            _ => return None,
        };
        Some(value.to_owned())
    };
    let settings = AuthSettings::load(None, None, &env).unwrap();
    assert_eq!(settings.identity_v3(), "http://keystone:5000/v3");
    assert_eq!(settings.interface, "public");
    assert_eq!(
        settings.password_auth_body()["auth"]["scope"],
        json!({ "project": { "id": PROJECT } })
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn openstack_config_errors_name_their_origin() {
    let dir = temp_dir("errors");
    let path = dir.join("clouds.yaml");
    let no_env = |_: &str| -> Option<String> { None };
    std::fs::write(&path, "clouds: [not, a, map").unwrap();
    let err = AuthSettings::load(Some("gsaas"), Some(&path), &no_env).unwrap_err();
    assert!(matches!(err, OpenStackConfigError::Parse { .. }), "{err:?}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");

    std::fs::write(&path, CLOUDS_YAML).unwrap();
    let err = AuthSettings::load(Some("other"), Some(&path), &no_env).unwrap_err();
    assert!(matches!(err, OpenStackConfigError::NoSuchCloud { .. }), "{err:?}");
    assert!(err.to_string().contains("clouds.yaml") && err.to_string().contains("other"), "{err}");

    let https = CLOUDS_YAML.replace("http://", "https://");
    std::fs::write(&path, &https).unwrap();
    AuthSettings::load(Some("gsaas"), Some(&path), &no_env).unwrap();
    let with_cacert =
        |line: &str| https.replace("    auth:\n", &format!("    {line}\n    auth:\n"));
    std::fs::write(&path, with_cacert("cacert: /nonexistent/ca.pem")).unwrap();
    let err = AuthSettings::load(Some("gsaas"), Some(&path), &no_env).unwrap_err();
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");

    std::fs::write(&path, CLOUDS_YAML.replace("      password: adminpw\n", "")).unwrap();
    let err = AuthSettings::load(Some("gsaas"), Some(&path), &no_env).unwrap_err();
    assert!(
        matches!(err, OpenStackConfigError::Missing { field, .. } if field.starts_with("password")),
        "{err:?}"
    );

    let missing = dir.join("missing.yaml");
    let err = AuthSettings::load(Some("gsaas"), Some(&missing), &no_env).unwrap_err();
    assert!(err.to_string().contains("missing.yaml"), "{err}");
    assert!(err.source().is_some());

    let err = AuthSettings::load(None, None, &no_env).unwrap_err();
    assert!(
        matches!(err, OpenStackConfigError::Missing { field, .. } if field.starts_with("auth_url")),
        "{err:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let err = NovaCloud::new(
        settings("http://127.0.0.1:1"),
        NovaConfig { microversion: "2.60".into(), ..NovaConfig::default() },
    )
    .unwrap_err();
    assert!(err.to_string().contains("2.60"), "{err}");
}

#[test]
fn the_keystone_sample_headers_carry_the_token() {
    // The upstream HTTP sample: 201 and the token in X-Subject-Token, which is what the mock sends.
    let sample = fixture("keystone/auth-password-user-name-unscoped-response-HTTP.txt");
    assert!(sample.starts_with("HTTP/1.1 201 Created"));
    let headers: BTreeSet<&str> =
        sample.lines().filter_map(|l| l.split_once(':').map(|(name, _)| name)).collect();
    assert!(headers.contains("X-Subject-Token"));
}

/// A Keystone stand-in over TLS (Python's `http.server` with `ssl`), with a throwaway
/// self-signed certificate for 127.0.0.1 made by `openssl`: every POST gets the upstream token
/// body with its catalog pointing back at it.
struct TlsKeystone {
    child: std::process::Child,
    dir: PathBuf,
    base: String,
    cert: PathBuf,
}

const TLS_KEYSTONE: &str = r#"
import http.server, ssl, sys
cert, key, body_path = sys.argv[1:4]
template = open(body_path).read()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = template.replace("BASE", "https://127.0.0.1:%d" % self.server.server_port).encode()
        self.send_response(201)
        self.send_header("X-Subject-Token", "token-over-tls")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_port, flush=True)
server.serve_forever()
"#;

impl TlsKeystone {
    fn start() -> TlsKeystone {
        use std::io::BufRead as _;
        use std::process::{Command, Stdio};
        let dir = std::env::temp_dir().join(format!(
            "gsaas-tls-{}-{}",
            std::process::id(),
            VmId::new_random()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"])
            .args(["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl runs (Debian's openssl package)");
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        let body = dir.join("token.json");
        std::fs::write(&body, token_body("BASE", in_an_hour()).to_string()).unwrap();
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(TLS_KEYSTONE)
            .args([&cert, &key, &body])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port: u16 =
            line.trim().parse().unwrap_or_else(|_| panic!("no port from the server: {line:?}"));
        TlsKeystone { child, dir, base: format!("https://127.0.0.1:{port}"), cert }
    }
}

impl Drop for TlsKeystone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn keystone_over_https_is_trusted_through_cacert_only() {
    let keystone = TlsKeystone::start();
    let mut trusting = settings(&keystone.base);
    trusting.auth_url = format!("{}/identity/v3", keystone.base);
    trusting.cacert = Some(keystone.cert.clone());
    let session = Keystone::new(trusting.clone(), HttpOptions::default()).unwrap();
    let token = session.token().await.expect("a token over TLS with the CA trusted");
    assert_eq!(token.token, "token-over-tls");

    // The same server without its CA in cacert: the certificate is refused, and said so.
    let untrusting = Keystone::new(settings(&keystone.base), HttpOptions::default()).unwrap();
    let err = untrusting.token().await.unwrap_err();
    let chain = gsaasd::error::ErrorChain(&err).to_string();
    assert!(chain.contains(&keystone.base), "{chain}");
    assert!(chain.to_lowercase().contains("certificate"), "{chain}");

    // A cacert that holds no certificate is refused before any request, naming the file.
    let not_pem = keystone.dir.join("not-a-ca.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let err = Keystone::new(
        AuthSettings { cacert: Some(not_pem.clone()), ..trusting },
        HttpOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains(&not_pem.display().to_string()), "{err}");
}
