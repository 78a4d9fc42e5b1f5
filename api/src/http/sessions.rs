//! Signing in: which sign-ins gsaasd offers (`GET /v1/auth`), and Keystone sign-in through
//! gsaasd (`/v1/auth/tokens`, `/v1/auth/projects`) for the dashboard. See `app::sessions`.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gsaas_api_types::{
    AuthMethods, NamedView, ProjectList, ProjectParam, SessionView, SignInRequest,
};

use super::{AppState, Unparsed};
use crate::app::sessions::{ProjectAsked, Session, SignIn, DEFAULT_DOMAIN};
use crate::auth::{bearer_token, ClientAddr};
use crate::error::{Error, Problem};
use crate::openstack::time::format_rfc3339;

/// Which sign-ins this gsaasd offers: gsaasd's tokens always; Keystone's in Keystone mode.
#[utoipa::path(get, path = "/v1/auth", tag = "auth",
    responses((status = 200, body = AuthMethods)))]
pub(super) async fn auth_methods(State(app): State<AppState>) -> Json<AuthMethods> {
    let keystone = crate::auth::HasKeys::keystone(&app).is_some();
    Json(AuthMethods {
        mode: if keystone { "keystone" } else { "jwt" }.to_owned(),
        methods: if keystone {
            vec!["password".to_owned(), "application_credential".to_owned()]
        } else {
            Vec::new()
        },
        default_domain: DEFAULT_DOMAIN.to_owned(),
    })
}

fn asked(project: ProjectParam) -> ProjectAsked {
    ProjectAsked { id: project.id, name: project.name, domain: project.domain }
}

fn session_view(session: Session) -> SessionView {
    let info = &session.identity.info;
    SessionView {
        expires_at: format_rfc3339(session.expires_at()),
        user: NamedView { id: info.user_id.clone(), name: info.user_name.clone() },
        project: NamedView {
            id: info.project_id.clone().unwrap_or_default(),
            name: info.project_name.clone(),
        },
        roles: info.roles.clone(),
        admin: session.identity.admin,
        token: session.token,
        unscoped_token: session.unscoped,
    }
}

/// Sign in with Keystone (Keystone mode): a password or an application credential, or (neither,
/// with a Keystone token in `X-Auth-Token`) switch that token to another project of its user's.
/// The answer carries the new token; keep it in memory and send it as `X-Auth-Token`.
#[utoipa::path(post, path = "/v1/auth/tokens", tag = "auth", request_body = SignInRequest,
    responses(
        (status = 201, body = SessionView),
        (status = 401, description = "Keystone refused the user name, domain, password or application credential; or the user has no role in the project, or there is no such project", body = Problem),
        (status = 404, description = "Keystone sign-in is off (`auth.mode` is not `keystone`)", body = Problem),
        (status = 429, description = "Too many sign-ins from this address", body = Problem),
        (status = 503, description = "Keystone is unreachable", body = Problem),
    ))]
pub(super) async fn sign_in(
    State(app): State<AppState>,
    ClientAddr(client): ClientAddr,
    headers: HeaderMap,
    request: Unparsed<SignInRequest>,
) -> Result<Response, Error> {
    let request = request.parse().map_err(without_values)?;
    let sign_in = match request {
        SignInRequest { password: Some(p), application_credential: None, project } => {
            SignIn::Password {
                user: p.user,
                domain: p.domain,
                password: p.password,
                project: project.map(asked),
            }
        }
        SignInRequest { password: None, application_credential: Some(a), project: None } => {
            SignIn::ApplicationCredential { id: a.id, secret: a.secret }
        }
        SignInRequest { password: None, application_credential: Some(_), project: Some(_) } => {
            return Err(Error::invalid(
                "project",
                "an application credential is scoped to its own project: name none",
            ));
        }
        SignInRequest { password: None, application_credential: None, project: Some(project) } => {
            let token = bearer_token(&headers).map_err(|_| {
                Error::invalid(
                    "password",
                    "is required, or an application_credential, or (to switch project) a \
                     Keystone token in X-Auth-Token",
                )
            })?;
            SignIn::Switch { token: token.to_owned(), project: asked(project) }
        }
        SignInRequest { password: Some(_), application_credential: Some(_), .. } => {
            return Err(Error::invalid(
                "application_credential",
                "sign in with a password or an application credential, not both",
            ));
        }
        SignInRequest { password: None, application_credential: None, project: None } => {
            return Err(Error::invalid(
                "password",
                "is required (or an application_credential, or a project to switch to)",
            ));
        }
    };
    let session = app.sign_in(client, sign_in).await?;
    Ok((StatusCode::CREATED, no_store(), Json(session_view(session))).into_response())
}

/// The projects the signed-in user may switch to (Keystone mode; the token in `X-Auth-Token`).
#[utoipa::path(get, path = "/v1/auth/projects", tag = "auth",
    responses(
        (status = 200, body = ProjectList),
        (status = 401, description = "No Keystone token, or Keystone does not know it", body = Problem),
        (status = 404, description = "Keystone sign-in is off (`auth.mode` is not `keystone`)", body = Problem),
        (status = 429, description = "Too many Keystone requests from this address", body = Problem),
        (status = 503, description = "Keystone is unreachable", body = Problem),
    ),
    security(("bearer" = [])))]
pub(super) async fn projects(
    State(app): State<AppState>,
    ClientAddr(client): ClientAddr,
    headers: HeaderMap,
) -> Result<Response, Error> {
    let token = bearer_token(&headers)?;
    let projects = app.projects_of(client, token).await?;
    let projects =
        projects.into_iter().map(|p| NamedView { id: p.id, name: Some(p.name) }).collect();
    Ok((no_store(), Json(ProjectList { projects })).into_response())
}

/// Sign out: Keystone revokes the token (Keystone mode; the token in `X-Auth-Token`).
#[utoipa::path(delete, path = "/v1/auth/tokens", tag = "auth",
    responses(
        (status = 204, description = "Revoked"),
        (status = 401, description = "No token", body = Problem),
        (status = 404, description = "Keystone sign-in is off (`auth.mode` is not `keystone`)", body = Problem),
        (status = 503, description = "Keystone is unreachable", body = Problem),
    ),
    security(("bearer" = [])))]
pub(super) async fn sign_out(
    State(app): State<AppState>,
    headers: HeaderMap,
) -> Result<StatusCode, Error> {
    let token = bearer_token(&headers)?;
    app.sign_out(token).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A body's problems without the values at fault: a password or a secret sent where a field of
/// another type belongs is not repeated (in the answer, or the log).
fn without_values(e: Error) -> Error {
    let Error::Invalid(errors) = e else { return e };
    let errors = errors
        .into_iter()
        .map(|mut error| {
            for prefix in ["invalid type: ", "invalid value: ", "invalid length "] {
                if error.detail.starts_with(prefix) {
                    let expected = error.detail.rsplit_once(", expected ").map(|(_, e)| e);
                    error.detail = match expected {
                        Some(expected) => {
                            format!("has the wrong type or value: expected {expected}")
                        }
                        None => "has the wrong type or value".to_owned(),
                    };
                }
            }
            error
        })
        .collect();
    Error::Invalid(errors)
}

/// Answers that carry a token are never cached.
fn no_store() -> [(header::HeaderName, &'static str); 1] {
    [(header::CACHE_CONTROL, "no-store")]
}
