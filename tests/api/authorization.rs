//! Every state-changing route, with every kind of wrong credential: none,
//! the wrong role, another owner, a missing or wrong CSRF token. Each gets
//! its documented refusal, and the database does not change.

use diesel::prelude::*;
use onejob::store::schema::{api_tokens, attempts, audit_log, jobs, qualifications, sessions};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::harness::{
    spawn_app_with, summarize, test_config, FormClient, TestApp, TestBackend,
};

/// sim-hang never answers, so a job sent to it stays unknown for the whole
/// test; nothing moves unless a request is let through.
pub const PROVIDERS: &str = r#"
[[providers]]
name = "sim-fast"
kind = "simulated"
latency_ms = 10

[[providers]]
name = "sim-hang"
kind = "simulated"
fail = "timeout-forever"
timeout_ms = 200
late_result_ms = 600000

[[tasks]]
name = "summarize"
providers = ["sim-fast", "sim-hang"]
input_fields = ["text"]

[[tasks.golden]]
input = { text = "golden example" }
"#;

/// Everything a refused request could have changed.
async fn snapshot(app: &TestApp) -> String {
    app.with_conn(|conn| {
        let jobs: Vec<(String, String, i64)> = jobs::table
            .select((jobs::id, jobs::status, jobs::version))
            .order(jobs::id)
            .load(conn)
            .unwrap();
        let attempts: Vec<(String, String)> = attempts::table
            .select((attempts::id, attempts::state))
            .order(attempts::id)
            .load(conn)
            .unwrap();
        let audit: i64 = audit_log::table.count().get_result(conn).unwrap();
        let sessions: i64 = sessions::table.count().get_result(conn).unwrap();
        let tokens: i64 = api_tokens::table.count().get_result(conn).unwrap();
        let runs: i64 = qualifications::table.count().get_result(conn).unwrap();
        format!("jobs {jobs:?}\nattempts {attempts:?}\naudit {audit} sessions {sessions} tokens {tokens} qualification runs {runs}")
    })
    .await
}

/// Who sends a request.
#[derive(Clone, Copy, Debug)]
enum As {
    Nobody,
    /// A signed-in user (pages) or their token (API).
    User(&'static str),
}

/// How the form's CSRF token is sent.
#[derive(Clone, Copy, Debug)]
enum Csrf {
    Right,
    Missing,
    Wrong,
}

struct Browsers {
    alice: (FormClient, String),
    bob: (FormClient, String),
    sue: (FormClient, String),
    ada: (FormClient, String),
    nobody: FormClient,
}

impl Browsers {
    fn get(&self, who: As) -> (&FormClient, Option<&str>) {
        match who {
            As::Nobody => (&self.nobody, None),
            As::User("alice") => (&self.alice.0, Some(&self.alice.1)),
            As::User("bob") => (&self.bob.0, Some(&self.bob.1)),
            As::User("sue") => (&self.sue.0, Some(&self.sue.1)),
            As::User("ada") => (&self.ada.0, Some(&self.ada.1)),
            As::User(other) => panic!("no browser for {other}"),
        }
    }
}

async fn post_page(
    browsers: &Browsers,
    who: As,
    csrf: Csrf,
    path: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let (browser, token) = browsers.get(who);
    let mut form: Vec<(&str, String)> = fields.iter().map(|(k, v)| (*k, v.to_string())).collect();
    match csrf {
        Csrf::Right => form.push(("csrf", token.unwrap_or_default().to_owned())),
        Csrf::Missing => {}
        Csrf::Wrong => form.push(("csrf", "0".repeat(64))),
    }
    browser
        .http
        .post(format!("{}{path}", browser.base))
        .form(&form)
        .send()
        .await
        .unwrap()
}

async fn call_api(
    app: &TestApp,
    who: As,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> reqwest::Response {
    let mut request = app.client.request(method, app.url(path));
    if let As::User(name) = who {
        let token = match name {
            "alice" => &app.alice.token,
            "bob" => &app.bob.token,
            "sue" => &app.sue.token,
            "ada" => &app.ada.token,
            other => panic!("no token for {other}"),
        };
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    request
        .header("Idempotency-Key", "matrix")
        .send()
        .await
        .unwrap()
}

/// One form post of the matrix: path, fields, who, CSRF, the refusal.
type PageRow<'a> = (&'a str, &'a [(&'a str, &'a str)], As, Csrf, Refused);

/// What a refusal looks like.
#[derive(Clone, Copy, Debug)]
enum Refused {
    /// A page that needs a session sends the browser to sign in.
    ToSignIn,
    Status(StatusCode),
}

async fn assert_refused(response: reqwest::Response, expected: Refused, what: &str) {
    match expected {
        Refused::ToSignIn => {
            assert_eq!(response.status(), StatusCode::SEE_OTHER, "{what}");
            let location = response.headers()["location"].to_str().unwrap();
            assert!(location.starts_with("/login"), "{what}: to {location}");
        }
        Refused::Status(status) => assert_eq!(response.status(), status, "{what}"),
    }
}

async fn every_state_changing_route_refuses_wrong_credentials_and_changes_nothing(
    backend: TestBackend,
) {
    let app = spawn_app_with(backend, test_config(PROVIDERS)).await;
    for (name, password) in [
        ("alice", "a-pw"),
        ("bob", "b-pw"),
        ("sue", "s-pw"),
        ("ada", "d-pw"),
    ] {
        app.set_password(name, password).await;
    }
    // alice's job whose attempt is unknown (it can be abandoned), and
    // alice's job whose attempt support abandoned (it can take a new
    // attempt, or be marked failed).
    let mut hang = summarize("stays unknown");
    hang["provider"] = "sim-hang".into();
    let unknown_job = app.create_job(&app.alice.token, "unknown-job", &hang).await;
    let job = app
        .wait_for_status(&unknown_job, "unknown", std::time::Duration::from_secs(15))
        .await;
    let unknown_attempt = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    let mut hang = summarize("resolved");
    hang["provider"] = "sim-hang".into();
    let open_job = app.create_job(&app.alice.token, "open-job", &hang).await;
    let job = app
        .wait_for_status(&open_job, "unknown", std::time::Duration::from_secs(15))
        .await;
    let abandoned = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        app.abandon(&app.sue.token, &abandoned, "setting up")
            .await
            .status(),
        StatusCode::OK
    );
    app.app.startup_qualification_settled().await;

    let sign_in = |name: &'static str, password: &'static str| {
        let browser = FormClient::new(&app);
        async move {
            let csrf = browser.sign_in(name, password).await;
            (browser, csrf)
        }
    };
    let browsers = Browsers {
        alice: sign_in("alice", "a-pw").await,
        bob: sign_in("bob", "b-pw").await,
        sue: sign_in("sue", "s-pw").await,
        ada: sign_in("ada", "d-pw").await,
        nobody: FormClient::new(&app),
    };
    let before = snapshot(&app).await;

    let submit = vec![
        ("idempotency_key", "matrix-key"),
        ("task", "summarize"),
        ("input.text", "forged"),
    ];
    let attempts_path = format!("/jobs/{open_job}/attempts");
    let fail_path = format!("/jobs/{open_job}/fail");
    let abandon_path = format!("/admin/attempts/{unknown_attempt}/abandon");
    let page_rows: Vec<PageRow> = vec![
        // The submit form.
        ("/jobs", &submit, As::Nobody, Csrf::Wrong, Refused::ToSignIn),
        (
            "/jobs",
            &submit,
            As::User("alice"),
            Csrf::Missing,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            "/jobs",
            &submit,
            As::User("alice"),
            Csrf::Wrong,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        // A new attempt: the owner's, with their token only.
        (
            &attempts_path,
            &[],
            As::Nobody,
            Csrf::Wrong,
            Refused::ToSignIn,
        ),
        (
            &attempts_path,
            &[],
            As::User("bob"),
            Csrf::Right,
            Refused::Status(StatusCode::NOT_FOUND),
        ),
        (
            &attempts_path,
            &[],
            As::User("alice"),
            Csrf::Missing,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            &attempts_path,
            &[],
            As::User("alice"),
            Csrf::Wrong,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        // Marking a job failed: support only.
        (
            &fail_path,
            &[("reason", "x")],
            As::Nobody,
            Csrf::Wrong,
            Refused::ToSignIn,
        ),
        (
            &fail_path,
            &[("reason", "x")],
            As::User("alice"),
            Csrf::Right,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            &fail_path,
            &[("reason", "x")],
            As::User("bob"),
            Csrf::Right,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            &fail_path,
            &[("reason", "x")],
            As::User("sue"),
            Csrf::Missing,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            &fail_path,
            &[("reason", "x")],
            As::User("sue"),
            Csrf::Wrong,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        // Abandoning an unknown attempt: support only.
        (
            &abandon_path,
            &[("reason", "x")],
            As::Nobody,
            Csrf::Wrong,
            Refused::ToSignIn,
        ),
        (
            &abandon_path,
            &[("reason", "x")],
            As::User("alice"),
            Csrf::Right,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            &abandon_path,
            &[("reason", "x")],
            As::User("sue"),
            Csrf::Missing,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            &abandon_path,
            &[("reason", "x")],
            As::User("sue"),
            Csrf::Wrong,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        // Running a qualification: admins only.
        (
            "/admin/providers/qualify",
            &[("provider", "sim-fast"), ("task", "summarize")],
            As::Nobody,
            Csrf::Wrong,
            Refused::ToSignIn,
        ),
        (
            "/admin/providers/qualify",
            &[("provider", "sim-fast"), ("task", "summarize")],
            As::User("sue"),
            Csrf::Right,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            "/admin/providers/qualify",
            &[("provider", "sim-fast"), ("task", "summarize")],
            As::User("ada"),
            Csrf::Missing,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            "/admin/providers/qualify",
            &[("provider", "sim-fast"), ("task", "summarize")],
            As::User("ada"),
            Csrf::Wrong,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        // The Users page: admins only.
        (
            "/admin/users",
            &[("name", "mallory"), ("role", "admin"), ("reason", "x")],
            As::Nobody,
            Csrf::Wrong,
            Refused::ToSignIn,
        ),
        (
            "/admin/users",
            &[("name", "mallory"), ("role", "admin"), ("reason", "x")],
            As::User("sue"),
            Csrf::Right,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            "/admin/users",
            &[("name", "mallory"), ("role", "admin"), ("reason", "x")],
            As::User("ada"),
            Csrf::Missing,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            "/admin/users",
            &[("name", "mallory"), ("role", "admin"), ("reason", "x")],
            As::User("ada"),
            Csrf::Wrong,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            "/admin/users/bob/act",
            &[("action", "role-admin"), ("reason", "x")],
            As::Nobody,
            Csrf::Wrong,
            Refused::ToSignIn,
        ),
        (
            "/admin/users/bob/act",
            &[("action", "role-admin"), ("reason", "x")],
            As::User("bob"),
            Csrf::Right,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            "/admin/users/bob/act",
            &[("action", "role-admin"), ("reason", "x")],
            As::User("sue"),
            Csrf::Right,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            "/admin/users/bob/act",
            &[("action", "role-admin"), ("reason", "x")],
            As::User("ada"),
            Csrf::Missing,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            "/admin/users/bob/act",
            &[("action", "role-admin"), ("reason", "x")],
            As::User("ada"),
            Csrf::Wrong,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        // Signing out needs the session's token too.
        (
            "/logout",
            &[],
            As::User("alice"),
            Csrf::Missing,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        (
            "/logout",
            &[],
            As::User("alice"),
            Csrf::Wrong,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
        // Signing in needs the sign-in page's own token.
        (
            "/login",
            &[("name", "alice"), ("password", "a-pw")],
            As::Nobody,
            Csrf::Wrong,
            Refused::Status(StatusCode::FORBIDDEN),
        ),
    ];
    for (path, fields, who, csrf, expected) in page_rows {
        let what = format!("POST {path} as {who:?} with CSRF {csrf:?}");
        let response = post_page(&browsers, who, csrf, path, fields).await;
        assert_refused(response, expected, &what).await;
        assert_eq!(snapshot(&app).await, before, "{what} changed the database");
    }

    let api_rows: Vec<(Method, String, Option<serde_json::Value>, As, StatusCode)> = vec![
        (
            Method::POST,
            "/api/v1/jobs".into(),
            Some(summarize("forged")),
            As::Nobody,
            StatusCode::UNAUTHORIZED,
        ),
        // The OpenAI-compatible route creates jobs too.
        (
            Method::POST,
            "/v1/chat/completions".into(),
            Some(json!({"model": "summarize", "messages": [{"role": "user", "content": "x"}]})),
            As::Nobody,
            StatusCode::UNAUTHORIZED,
        ),
        (
            Method::POST,
            format!("/api/v1/jobs/{open_job}/attempts"),
            None,
            As::Nobody,
            StatusCode::UNAUTHORIZED,
        ),
        (
            Method::POST,
            format!("/api/v1/jobs/{open_job}/attempts"),
            None,
            As::User("bob"),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            format!("/api/v1/attempts/{unknown_attempt}/abandon"),
            Some(json!({"reason": "x"})),
            As::Nobody,
            StatusCode::UNAUTHORIZED,
        ),
        (
            Method::POST,
            format!("/api/v1/attempts/{unknown_attempt}/abandon"),
            Some(json!({"reason": "x"})),
            As::User("alice"),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            format!("/api/v1/attempts/{unknown_attempt}/abandon"),
            Some(json!({"reason": "x"})),
            As::User("bob"),
            StatusCode::FORBIDDEN,
        ),
        // The role is checked before the body: no hint from a 422.
        (
            Method::POST,
            format!("/api/v1/attempts/{unknown_attempt}/abandon"),
            Some(json!({"reason": ""})),
            As::User("alice"),
            StatusCode::FORBIDDEN,
        ),
        // Callbacks are off here: the route does not exist.
        (
            Method::POST,
            format!("/api/v1/callbacks/attempts/{unknown_attempt}"),
            Some(json!({"result": {}})),
            As::Nobody,
            StatusCode::NOT_FOUND,
        ),
    ];
    for (method, path, body, who, status) in api_rows {
        let what = format!("{method} {path} as {who:?}");
        let response = call_api(&app, who, method, &path, body).await;
        assert_eq!(response.status(), status, "{what}");
        assert_eq!(snapshot(&app).await, before, "{what} changed the database");
    }

    // Reads that reveal what only staff may see are refused before any
    // other check (a bad filter would otherwise answer 400).
    let (sue, _) = browsers.get(As::User("sue"));
    assert_eq!(
        sue.get("/admin/races?provider=nope").await.status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        sue.get("/admin/users").await.status(),
        StatusCode::FORBIDDEN
    );
    let (alice, _) = browsers.get(As::User("alice"));
    assert_eq!(
        alice.get("/admin/jobs?owner=bob").await.status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        alice.get("/admin/jobs?status=nope").await.status(),
        StatusCode::FORBIDDEN,
        "the role before the filter"
    );
    for (who, status) in [
        (As::Nobody, StatusCode::UNAUTHORIZED),
        (As::User("alice"), StatusCode::FORBIDDEN),
    ] {
        let response = call_api(&app, who, Method::GET, "/metrics", None).await;
        assert_eq!(response.status(), status, "/metrics as {who:?}");
    }

    // And with the right credentials each of these does change something:
    // the refusals above were about the credentials, not the state.
    let response = post_page(
        &browsers,
        As::User("alice"),
        Csrf::Right,
        &attempts_path,
        &[],
    )
    .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_ne!(
        snapshot(&app).await,
        before,
        "the owner's new attempt went through"
    );
    let response = post_page(
        &browsers,
        As::User("sue"),
        Csrf::Right,
        &abandon_path,
        &[("reason", "resolved")],
    )
    .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
}

on_both_backends!(every_state_changing_route_refuses_wrong_credentials_and_changes_nothing);
