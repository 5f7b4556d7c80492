//! Browser sessions as the server keeps them: signing out ends the session
//! on the server (the old cookie opens nothing), an expired session signs no
//! one in, every process sharing the database honours the same sessions, and
//! failed sign-ins stop counting once the throttle window has passed.

use diesel::prelude::*;
use onejob::store::schema::{sessions, sign_in_throttle};
use reqwest::StatusCode;

use crate::support::harness::{
    hidden_value, spawn_app, start_instance, test_config, TestApp, TestBackend,
    DEFAULT_TEST_PROVIDERS,
};

/// Signs in with a client that keeps no cookies; returns the session
/// cookie (`name=value`) and the session's CSRF token.
async fn sign_in_by_hand(base: &str, name: &str, password: &str) -> (String, String) {
    let client = plain_client();
    let login = client.get(format!("{base}/login")).send().await.unwrap();
    let csrf_cookie = cookie_pair(&login);
    let csrf = hidden_value(&login.text().await.unwrap(), "csrf");
    let response = client
        .post(format!("{base}/login"))
        .header("Cookie", csrf_cookie)
        .form(&[("name", name), ("password", password), ("csrf", &csrf)])
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::SEE_OTHER,
        "sign-in as {name}"
    );
    let session = cookie_pair(&response);
    assert!(session.starts_with("onejob_session="), "{session}");
    let form = client
        .get(format!("{base}/jobs"))
        .header("Cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    (session, hidden_value(&form, "csrf"))
}

fn plain_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn cookie_pair(response: &reqwest::Response) -> String {
    response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned()
}

/// GET `path` with only this cookie: 200 when the session is live, a
/// redirect to sign in when it is not.
async fn get_with(base: &str, path: &str, cookie: &str) -> reqwest::Response {
    plain_client()
        .get(format!("{base}{path}"))
        .header("Cookie", cookie)
        .send()
        .await
        .unwrap()
}

async fn session_rows(app: &TestApp) -> i64 {
    app.with_conn(|conn| sessions::table.count().get_result(conn).unwrap())
        .await
}

async fn signing_out_ends_the_session_on_the_server(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    let (cookie, csrf) = sign_in_by_hand(&app.address, "alice", "alice-password").await;
    assert_eq!(
        get_with(&app.address, "/jobs", &cookie).await.status(),
        StatusCode::OK
    );
    assert_eq!(session_rows(&app).await, 1);
    let response = plain_client()
        .post(app.url("/logout"))
        .header("Cookie", &cookie)
        .form(&[("csrf", &csrf)])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(session_rows(&app).await, 0, "the session row is gone");
    // The old cookie, replayed by hand, opens nothing.
    let response = get_with(&app.address, "/jobs", &cookie).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], "/login?next=/jobs");
}

async fn an_expired_session_signs_no_one_in(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    let (cookie, _) = sign_in_by_hand(&app.address, "alice", "alice-password").await;
    assert_eq!(
        get_with(&app.address, "/jobs", &cookie).await.status(),
        StatusCode::OK
    );
    // Its time runs out (as if session_hours had passed).
    app.with_conn(|conn| {
        diesel::update(sessions::table)
            .set(sessions::expires_at.eq(onejob::domain::Timestamp::now() - 1))
            .execute(conn)
            .unwrap()
    })
    .await;
    let response = get_with(&app.address, "/jobs", &cookie).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER, "expired");
    assert_eq!(response.headers()["location"], "/login?next=/jobs");
}

async fn every_process_on_the_database_honours_the_same_sessions(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    // A second server process's worth of onejob: its own pool, worker and
    // HTTP server, on the same database.
    let second_store = {
        let (url, config) = (app.db.url.clone(), test_config(DEFAULT_TEST_PROVIDERS));
        tokio::task::spawn_blocking(move || onejob::startup::open_store(&url, &config))
            .await
            .unwrap()
            .unwrap()
    };
    let (second, _, second_server) =
        start_instance(test_config(DEFAULT_TEST_PROVIDERS), second_store).await;
    let (cookie, csrf) = sign_in_by_hand(&app.address, "alice", "alice-password").await;
    assert_eq!(
        get_with(&second, "/jobs", &cookie).await.status(),
        StatusCode::OK,
        "signed in on the first, recognised by the second"
    );
    // Signing out on the second ends it on the first.
    let response = plain_client()
        .post(format!("{second}/logout"))
        .header("Cookie", &cookie)
        .form(&[("csrf", &csrf)])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        get_with(&app.address, "/jobs", &cookie).await.status(),
        StatusCode::SEE_OTHER,
        "signed out everywhere"
    );
    second_server.abort();
}

async fn failed_sign_ins_older_than_the_quiet_window_no_longer_count(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("bob", "bob-password").await;
    let client = plain_client();
    let login = client.get(app.url("/login")).send().await.unwrap();
    let csrf_cookie = cookie_pair(&login);
    let csrf = hidden_value(&login.text().await.unwrap(), "csrf");
    let attempt = |password: &'static str| {
        client
            .post(app.url("/login"))
            .header("Cookie", csrf_cookie.clone())
            .form(&[("name", "bob"), ("password", password), ("csrf", &csrf)])
            .send()
    };
    let free = onejob::domain::throttle::NAME_AT_ADDRESS.free;
    for _ in 0..=free {
        assert_eq!(
            attempt("nope").await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        attempt("bob-password").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS,
        "waiting inside the window, even with the right password"
    );
    // The quiet window passes: move every failure, and its wait, back past it.
    let window = onejob::domain::throttle::QUIET_WINDOW_MS + 1000;
    app.with_conn(move |conn| {
        diesel::update(sign_in_throttle::table)
            .set((
                sign_in_throttle::last_failure_at.eq(sign_in_throttle::last_failure_at - window),
                sign_in_throttle::blocked_until.eq(sign_in_throttle::blocked_until - window),
            ))
            .execute(conn)
            .unwrap()
    })
    .await;
    assert_eq!(
        attempt("bob-password").await.unwrap().status(),
        StatusCode::SEE_OTHER,
        "the right password works once the window has passed"
    );
    let rows: i64 = app
        .with_conn(|conn| sign_in_throttle::table.count().get_result(conn).unwrap())
        .await;
    assert_eq!(rows, 0, "a good sign-in clears its counters");
}

on_both_backends!(
    signing_out_ends_the_session_on_the_server,
    an_expired_session_signs_no_one_in,
    every_process_on_the_database_honours_the_same_sessions,
    failed_sign_ins_older_than_the_quiet_window_no_longer_count,
);
