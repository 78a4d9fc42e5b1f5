//! Tenants' tokens validated at Keystone: mapping, caching, refusals and failures.

use super::*;

/// Keystone validating tenants' tokens: `tenant-admin` (the upstream admin token), `tenant-member`
/// (expiring in `member_ttl`), anything else 404.
async fn keystone_for_tenants(member_ttl: Duration) -> Mock {
    let member_expires = format_rfc3339(SystemTime::now() + member_ttl);
    Mock::start(move |req, base| {
        if req.is(&Method::GET, "/identity/v3/auth/tokens?nocatalog") {
            assert_eq!(req.header("x-auth-token"), Some("service-token"));
            let mut body = token_body(base, in_an_hour());
            match req.header("x-subject-token") {
                Some("tenant-admin") => {}
                Some(t) if t.starts_with("tenant-member") => {
                    body["token"]["roles"] =
                        json!([{ "id": "9fe2ff9ee4384b1894a90878d3e92bab", "name": "member" }]);
                    body["token"]["expires_at"] = json!(member_expires);
                }
                Some("tenant-unscoped") => {
                    body["token"].as_object_mut().unwrap().remove("project");
                }
                _ => return nova_error(404, "error", "Could not find token."),
            }
            return reply(200, body.to_string());
        }
        standard(req, base)
    })
    .await
}

fn validator(mock: &Mock, capacity: usize) -> TokenValidator {
    validator_aged(mock, capacity, Duration::from_secs(300))
}

fn validator_aged(mock: &Mock, capacity: usize, max_age: Duration) -> TokenValidator {
    validator_with(mock, |s| {
        s.capacity = capacity;
        s.max_age = max_age;
    })
}

/// A validator whose admin project is the samples' `admin` project.
fn validator_with(mock: &Mock, tweak: impl FnOnce(&mut ValidatorSettings)) -> TokenValidator {
    let keystone = Keystone::new(settings(&mock.base), HttpOptions::default()).unwrap();
    let mut settings = ValidatorSettings {
        admin: AdminScope {
            roles: vec!["admin".into()],
            system: true,
            project: Some("admin".into()),
            project_domain: "Default".into(),
        },
        capacity: 16,
        max_age: Duration::from_secs(300),
        refusal_ttl: Duration::from_secs(30),
        per_client_per_minute: 60,
    };
    tweak(&mut settings);
    TokenValidator::new(Arc::new(keystone), settings)
}

fn validations(mock: &Mock) -> usize {
    mock.count(&Method::GET, "/identity/v3/auth/tokens")
}

#[tokio::test]
async fn tenant_tokens_are_validated_mapped_and_cached() {
    let mock = keystone_for_tenants(Duration::from_secs(3600)).await;
    let validator = validator(&mock, 16);
    let admin = validator.validate("tenant-admin", None).await.unwrap();
    assert!(admin.admin);
    assert_eq!(admin.project_id.as_deref(), Some(PROJECT));
    assert_eq!(admin.info.user_id, "ee4dfb6e5540447cb3741905149d9b6e");
    let caller = gsaasd::caller::Caller::keystone(&admin);
    assert_eq!(caller.project.as_deref(), Some(PROJECT));
    assert!(caller.is_admin());
    let member = validator.validate("tenant-member", None).await.unwrap();
    assert!(!member.admin);
    assert_eq!(validations(&mock), 2);
    assert_eq!(validator.validate("tenant-admin", None).await.unwrap(), admin);
    assert_eq!(validator.validate("tenant-member", None).await.unwrap(), member);
    assert_eq!(validations(&mock), 2, "cached answers do not call Keystone");
    assert!(matches!(validator.validate("forged", None).await, Err(ValidationError::Invalid)));
    assert!(matches!(
        validator.validate("tenant-unscoped", None).await,
        Err(ValidationError::Unscoped)
    ));
    assert_eq!(mock.auths(), 1, "one service token for all validations");
}

#[tokio::test]
async fn an_admin_role_outside_the_admin_scope_makes_a_member() {
    let mock = keystone_for_tenants(Duration::from_secs(3600)).await;
    // The samples' admin token is scoped to project `admin`: with only system scope counting, its
    // admin role makes a member of that project.
    let validator = validator_with(&mock, |s| s.admin.project = None);
    let admin = validator.validate("tenant-admin", None).await.unwrap();
    assert_eq!((admin.admin, admin.project_id.as_deref()), (false, Some(PROJECT)));
    let validator = validator_with(&mock, |s| s.admin.project_domain = "elsewhere".into());
    let admin = validator.validate("tenant-admin", None).await.unwrap();
    assert!(!admin.admin, "a project of that name in another domain");
    let validator = validator_with(&mock, |s| s.admin.project = Some(PROJECT.into()));
    assert!(validator.validate("tenant-admin", None).await.unwrap().admin);
}

#[tokio::test]
async fn refused_tokens_are_remembered_and_each_client_asks_so_often() {
    let mock = keystone_for_tenants(Duration::from_secs(3600)).await;
    let validator = validator_with(&mock, |s| s.per_client_per_minute = 10);
    let client = Some("192.0.2.7".parse().unwrap());
    // One bad token sent 50 times costs Keystone one validation.
    for _ in 0..50 {
        let err = validator.validate("forged", client).await.unwrap_err();
        assert!(matches!(err, ValidationError::Invalid), "{err:?}");
    }
    assert_eq!(validations(&mock), 1);
    // 50 different bad tokens from one client: a minute's budget reaches Keystone, then 429.
    let mut limited = 0;
    for i in 0..50 {
        match validator.validate(&format!("forged-{i}"), client).await {
            Err(ValidationError::RateLimited) => limited += 1,
            Err(ValidationError::Invalid) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(validations(&mock), 10, "the first token and 9 more");
    assert_eq!(limited, 41);
    // Another client, and tokens already cached, are not held back.
    let other = Some("192.0.2.8".parse().unwrap());
    assert!(!validator.validate("tenant-member", other).await.unwrap().admin);
}

#[tokio::test]
async fn cached_tokens_expire_and_the_cache_is_bounded() {
    let mock = keystone_for_tenants(Duration::from_millis(1500)).await;
    let validator = validator(&mock, 2);
    validator.validate("tenant-member", None).await.unwrap();
    validator.validate("tenant-member", None).await.unwrap();
    assert_eq!(validations(&mock), 1);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    // Keystone's answer now says the token has expired: invalid, and asked again.
    assert!(matches!(
        validator.validate("tenant-member", None).await,
        Err(ValidationError::Invalid)
    ));
    assert_eq!(validations(&mock), 2);

    let mock = keystone_for_tenants(Duration::from_secs(3600)).await;
    let validator = self::validator(&mock, 2);
    for token in ["tenant-member-1", "tenant-member-2", "tenant-admin"] {
        validator.validate(token, None).await.unwrap();
    }
    assert_eq!(validator.cached(), 2);

    // A long-lived token is asked about again after the cache's maximum age (revocation).
    let validator = validator_aged(&mock, 4, Duration::from_millis(200));
    let before = validations(&mock);
    validator.validate("tenant-admin", None).await.unwrap();
    validator.validate("tenant-admin", None).await.unwrap();
    assert_eq!(validations(&mock), before + 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    validator.validate("tenant-admin", None).await.unwrap();
    assert_eq!(validations(&mock), before + 2);
}

#[tokio::test]
async fn keystone_failures_while_validating_are_not_invalid_tokens() {
    let mock = Mock::start(|req, base| {
        if req.method == Method::GET && req.path.starts_with("/identity/") {
            return reply(500, "");
        }
        standard(req, base)
    })
    .await;
    let err = validator(&mock, 4).validate("tenant-admin", None).await.unwrap_err();
    assert!(matches!(err, ValidationError::Keystone(_)), "{err:?}");
    assert!(err.source().unwrap().to_string().contains("500"), "{err:?}");
}
