//! Accounts and the console around them: the Users page, revocation,
//! job search for support, security headers, cleanup, and a sign-in flood
//! that must not starve anything else.

use std::time::{Duration, Instant};

use diesel::prelude::*;
use onejob::store::schema::{api_tokens, audit_log, sessions, sign_in_throttle, users};
use reqwest::StatusCode;
use serde_json::json;

use crate::support::fake_provider::{
    config_of, one_fake_config, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape,
    WAIT,
};
use crate::support::harness::{
    hidden_value, onejob_users, spawn_app, spawn_app_with, summarize, FormClient, TestApp,
    TestBackend,
};

async fn sign_in(app: &TestApp, name: &str, password: &str) -> (FormClient, String) {
    app.set_password(name, password).await;
    let browser = FormClient::new(app);
    let csrf = browser.sign_in(name, password).await;
    (browser, csrf)
}

async fn user_act(
    browser: &FormClient,
    csrf: &str,
    name: &str,
    action: &str,
    reason: &str,
) -> reqwest::Response {
    browser
        .post_form(
            &format!("/admin/users/{name}/act"),
            &[("csrf", csrf), ("action", action), ("reason", reason)],
        )
        .await
}

/// The password a "shown once" page shows.
async fn shown_password(response: reqwest::Response) -> String {
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["cache-control"],
        "no-store",
        "never cached"
    );
    let page = response.text().await.unwrap();
    let start = page
        .find("id=\"new-password\">")
        .expect("a password is shown")
        + "id=\"new-password\">".len();
    page[start..].split('<').next().unwrap().to_owned()
}

async fn audit_subjects(app: &TestApp) -> Vec<(String, String, String)> {
    app.with_conn(|conn| {
        audit_log::table
            .inner_join(users::table.on(users::id.nullable().eq(audit_log::subject_user_id)))
            .order(audit_log::at)
            .select((audit_log::action, users::name, audit_log::reason))
            .load(conn)
            .unwrap()
    })
    .await
}

async fn the_users_page_adds_resets_revokes_disables_and_audits_each_action(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let (admin, csrf) = sign_in(&app, "ada", "ada-pw").await;
    let page = admin.get("/admin/users").await.text().await.unwrap();
    for name in ["alice", "bob", "sue", "ada"] {
        assert!(
            page.contains(&format!("data-user=\"{name}\"")),
            "{name} listed"
        );
    }
    // Add a user: their password is shown once, and works.
    let response = admin
        .post_form(
            "/admin/users",
            &[
                ("csrf", &csrf),
                ("name", "zoe"),
                ("role", "support"),
                ("reason", "new hire"),
            ],
        )
        .await;
    // Shown once: a reload or Back under htmx shows the list, not a re-post.
    assert_eq!(
        response.headers().get("hx-replace-url").unwrap(),
        "/admin/users"
    );
    let password = shown_password(response).await;
    let zoe = FormClient::new(&app);
    zoe.sign_in("zoe", &password).await;
    assert_eq!(
        zoe.get("/admin").await.status(),
        StatusCode::OK,
        "zoe is support"
    );

    // Reset zoe's password: her session ends, the new password works.
    let response = user_act(&admin, &csrf, "zoe", "reset-password", "forgot it").await;
    let new_password = shown_password(response).await;
    assert_eq!(
        zoe.get("/admin").await.status(),
        StatusCode::SEE_OTHER,
        "signed out everywhere"
    );
    zoe.sign_in("zoe", &new_password).await;

    // Revoke alice's tokens: her API token stops working.
    assert_eq!(
        app.get(&app.alice.token, "/api/v1/jobs").await.status(),
        StatusCode::OK
    );
    let response = user_act(&admin, &csrf, "alice", "revoke-tokens", "token leaked").await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        app.get(&app.alice.token, "/api/v1/jobs").await.status(),
        StatusCode::UNAUTHORIZED
    );

    // Disable zoe: her session stops at once, and so does signing in.
    let response = user_act(&admin, &csrf, "zoe", "disable", "left the company").await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(zoe.get("/admin").await.status(), StatusCode::SEE_OTHER);
    let page = zoe.get("/login").await.text().await.unwrap();
    let login_csrf = hidden_value(&page, "csrf");
    let response = zoe
        .post_form(
            "/login",
            &[
                ("name", "zoe"),
                ("password", &new_password),
                ("csrf", &login_csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(response.text().await.unwrap().contains("disabled"));
    // Enable her again, and make her an admin.
    assert_eq!(
        user_act(&admin, &csrf, "zoe", "enable", "came back")
            .await
            .status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        user_act(&admin, &csrf, "zoe", "role-admin", "promoted")
            .await
            .status(),
        StatusCode::SEE_OTHER
    );
    let role: String = app
        .with_conn(|conn| {
            users::table
                .filter(users::name.eq("zoe"))
                .select(users::role)
                .first(conn)
                .unwrap()
        })
        .await;
    assert_eq!(role, "admin");

    // A reason is required; an admin cannot disable themselves here.
    let response = user_act(&admin, &csrf, "bob", "disable", "  ").await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let response = user_act(&admin, &csrf, "ada", "disable", "oops").await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);

    let audit = audit_subjects(&app).await;
    let actions: Vec<(&str, &str)> = audit
        .iter()
        .map(|(a, u, _)| (a.as_str(), u.as_str()))
        .collect();
    assert_eq!(
        actions,
        vec![
            ("add_user", "zoe"),
            ("reset_password", "zoe"),
            ("revoke_tokens", "alice"),
            ("disable_user", "zoe"),
            ("enable_user", "zoe"),
            ("set_role", "zoe"),
        ]
    );
    assert!(audit[2].2.contains("token leaked"), "{:?}", audit[2]);
    let zoe_hash: Option<String> = app
        .with_conn(|conn| {
            users::table
                .filter(users::name.eq("zoe"))
                .select(users::password_hash)
                .first(conn)
                .unwrap()
        })
        .await;
    assert!(
        zoe_hash.unwrap().starts_with("$argon2id$"),
        "only the hash is stored"
    );
}

async fn support_finds_a_job_by_id_key_owner_status_and_provider(backend: TestBackend) {
    // sim-hang never answers: the second job stays unknown.
    let app = spawn_app_with(
        backend,
        crate::support::harness::test_config(crate::authorization::PROVIDERS),
    )
    .await;
    let first = app
        .create_job(&app.alice.token, "order-77", &summarize("a"))
        .await;
    let mut slow = summarize("b");
    slow["provider"] = "sim-hang".into();
    let second = app.create_job(&app.bob.token, "order-78", &slow).await;
    app.wait_for_status(&first, "succeeded", WAIT).await;
    app.wait_for_status(&second, "unknown", WAIT).await;
    let (sue, _) = sign_in(&app, "sue", "sue-pw").await;
    // By id: straight to the job.
    let response = sue.get(&format!("/admin/jobs?job={first}")).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        response.headers()["location"],
        format!("/jobs/{first}").as_str()
    );
    let rows = |page: &str| -> Vec<String> {
        page.match_indices("data-job=\"")
            .map(|(i, m)| page[i + m.len()..].split('"').next().unwrap().to_owned())
            .collect()
    };
    let page = sue
        .get("/admin/jobs?owner=bob&key=order-78")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(rows(&page), vec![second.clone()]);
    let page = sue
        .get("/admin/jobs?key=order-77")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(rows(&page), vec![first.clone()]);
    let page = sue
        .get("/admin/jobs?status=unknown")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(rows(&page), vec![second.clone()]);
    let page = sue
        .get("/admin/jobs?provider=sim-fast")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(rows(&page), vec![first.clone()]);
    let page = sue.get("/admin/jobs").await.text().await.unwrap();
    assert_eq!(
        rows(&page),
        vec![second.clone(), first.clone()],
        "every owner's, newest first"
    );
    let page = sue
        .get("/admin/jobs?job=not-an-id")
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("is not a job id"));
    // The job page shows staff its owner and its audit entries.
    let attempt = app.get_job(&app.ada.token, &second).await["attempts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        app.abandon(&app.sue.token, &attempt, "customer asked")
            .await
            .status(),
        StatusCode::OK
    );
    let page = sue
        .get(&format!("/jobs/{second}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("Owner: <strong>bob</strong>"), "{page}");
    assert!(
        page.contains("abandon attempt") && page.contains("customer asked"),
        "{page}"
    );
    // Not for users.
    let (alice, _) = sign_in(&app, "alice", "alice-pw").await;
    assert_eq!(
        alice.get("/admin/jobs?owner=bob").await.status(),
        StatusCode::FORBIDDEN
    );
    let page = alice
        .get(&format!("/jobs/{first}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        !page.contains("id=\"job-audit\""),
        "owners see no staff notes"
    );
}

async fn every_response_carries_the_security_headers(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let (alice, _) = sign_in(&app, "alice", "alice-pw").await;
    for path in ["/jobs", "/login", "/healthz", "/static/style.css", "/nope"] {
        let response = alice.get(path).await;
        let headers = response.headers();
        assert_eq!(
            headers["content-security-policy"],
            onejob::web::CONTENT_SECURITY_POLICY,
            "{path}"
        );
        assert!(headers["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'"));
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["x-frame-options"], "DENY", "{path}");
        assert_eq!(headers["referrer-policy"], "same-origin", "{path}");
    }
    let page = alice.get("/jobs").await;
    assert_eq!(
        page.headers()["cache-control"],
        "no-store",
        "signed-in pages are never stored"
    );
    assert!(page
        .headers()
        .get_all("vary")
        .iter()
        .any(|v| v.to_str().unwrap().contains("HX-Request")));
    let api = app.get(&app.alice.token, "/api/v1/jobs").await;
    assert_eq!(api.headers()["cache-control"], "no-store");
    let css = alice.get("/static/style.css").await;
    assert_eq!(
        css.headers()["cache-control"],
        "public, max-age=3600",
        "assets stay cacheable"
    );
    // The cookie's Secure flag follows the configuration, never a header.
    let login = app
        .client
        .get(app.url("/login"))
        .header("X-Forwarded-Proto", "https")
        .send()
        .await
        .unwrap();
    let cookie = login.headers()["set-cookie"].to_str().unwrap();
    assert!(
        !cookie.contains("Secure") && !cookie.starts_with("__Host-"),
        "{cookie}"
    );
}

async fn cleanup_removes_expired_sessions_and_quiet_counters_only(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let (_alice, _) = sign_in(&app, "alice", "alice-pw").await;
    let (_bob, _) = sign_in(&app, "bob", "bob-pw").await;
    let now = onejob::domain::Timestamp::now();
    let day = 24 * 3_600_000;
    app.with_conn(move |conn| {
        // alice's session has expired; bob's has not.
        diesel::update(
            sessions::table.filter(
                sessions::user_id.eq_any(
                    users::table
                        .filter(users::name.eq("alice"))
                        .select(users::id),
                ),
            ),
        )
        .set(sessions::expires_at.eq(now - 1))
        .execute(conn)
        .unwrap();
        for (scope, last, until) in [
            ("addr:old", now - day, now - day),
            ("addr:recent", now - 1000, now + 60_000),
        ] {
            diesel::insert_into(sign_in_throttle::table)
                .values((
                    sign_in_throttle::scope.eq(scope),
                    sign_in_throttle::failures.eq(9),
                    sign_in_throttle::last_failure_at.eq(last),
                    sign_in_throttle::blocked_until.eq(until),
                ))
                .execute(conn)
                .unwrap();
        }
    })
    .await;
    let cleaned = app.app.clean_up().await.unwrap();
    assert_eq!((cleaned.sessions, cleaned.throttles), (1, 1));
    let (sessions_left, scopes): (i64, Vec<String>) = app
        .with_conn(|conn| {
            (
                sessions::table.count().get_result(conn).unwrap(),
                sign_in_throttle::table
                    .select(sign_in_throttle::scope)
                    .load(conn)
                    .unwrap(),
            )
        })
        .await;
    assert_eq!(sessions_left, 1, "bob's live session stays");
    assert_eq!(scopes, vec!["addr:recent".to_owned()]);
}

async fn an_answer_larger_than_the_cap_is_refused_unread(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        ProviderToml::openai("fake", &fake.base_url)
            .with("max_response_bytes = 2048")
            .toml(),
        strict_task_toml("summarize", &["fake"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    fake.push(Behaviour::Answer(json!({"summary": "x".repeat(100_000)})));
    let job_id = app
        .create_job(&app.alice.token, "huge", &summarize("x"))
        .await;
    let job = app.wait_for_status(&job_id, "failed", WAIT).await;
    let error = job["attempts"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("invalid_output") && error.contains("2048 bytes"),
        "{error}"
    );
}

async fn owners_see_a_classified_reason_and_staff_the_providers_text(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let app = spawn_app_with(backend, one_fake_config(&fake)).await;
    fake.push(Behaviour::Status {
        status: 403,
        retry_after: None,
        body: "org org-secret-42 may not use db-7.internal".into(),
    });
    let job_id = app
        .create_job(&app.alice.token, "leaky", &summarize("x"))
        .await;
    app.wait_for_status(&job_id, "failed", WAIT).await;
    let owner = app.get_job(&app.alice.token, &job_id).await;
    let owner_text = owner.to_string();
    assert!(
        owner_text.contains("the provider refused the request with 403"),
        "{owner_text}"
    );
    assert!(
        !owner_text.contains("org-secret-42") && !owner_text.contains("db-7.internal"),
        "{owner_text}"
    );
    let staff = app.get_job(&app.sue.token, &job_id).await;
    assert!(staff["attempts"][0]["error"]
        .as_str()
        .unwrap()
        .contains("db-7.internal"));
    let (alice, _) = sign_in(&app, "alice", "alice-pw").await;
    let page = alice
        .get(&format!("/jobs/{job_id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        !page.contains("db-7.internal"),
        "the owner's page hides it too"
    );
}

async fn the_callback_route_honours_the_body_limit(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let toml = [
        "[server]\npublic_url = \"http://127.0.0.1:9\"\ncallback_secret_env = \"ONEJOB_TEST_CALLBACK_KEY\"\nbody_limit_bytes = 1024\n".to_owned(),
        ProviderToml::openai("async", &fake.base_url).with("callbacks = true").toml(),
        strict_task_toml("summarize", &["async"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    let response = app
        .client
        .post(app.url(&format!(
            "/api/v1/callbacks/attempts/{}",
            uuid::Uuid::now_v7()
        )))
        .header("Content-Type", "application/json")
        .body(format!("{{\"error\": \"{}\"}}", "x".repeat(4096)))
        .send()
        .await
        .unwrap();
    crate::support::harness::assert_problem(
        response,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload-too-large",
    )
    .await;
}

/// A flood of bad sign-ins (unknown names from many addresses, each paying
/// for a hash) for a few seconds, keeping the password checks busy: API
/// requests are still answered, and a live attempt's lease keeps being
/// renewed (it never turns unknown).
async fn a_sign_in_flood_starves_neither_the_api_nor_lease_renewals(backend: TestBackend) {
    let fake = FakeProvider::start(Shape::OpenAi).await;
    let mut config = one_fake_config(&fake);
    // The held call stays running (not unknown) for the whole flood.
    config.providers[0].timeout_ms = 60_000;
    config.server.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    config.server.shutdown_grace_ms = 61_000;
    // Six times shorter than the default lease: renewals must get through.
    config.worker.lease_ms = 5000;
    let app = std::sync::Arc::new(spawn_app_with(backend, config).await);
    fake.set_default(Behaviour::Hold);
    let job_id = app
        .create_job(&app.alice.token, "live", &summarize("x"))
        .await;
    let live = app.wait_for_status(&job_id, "running", WAIT).await["attempts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    fake.wait_held(&live).await;

    let page = FormClient::new(&app).get("/login").await;
    let cookie = page.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let csrf = hidden_value(&page.text().await.unwrap(), "csrf");
    // What one password check costs here: the flood must keep the one
    // hashing slot (two cores) busy for most of its time.
    let one_check = || async {
        tokio::task::spawn_blocking(|| {
            let started = Instant::now();
            for _ in 0..5 {
                onejob::domain::password::verify_password("x", None);
            }
            started.elapsed() / 5
        })
        .await
        .unwrap()
    };
    let before = one_check().await;
    let flood_for = Duration::from_secs(4);
    let started = Instant::now();
    let flooders: Vec<_> = (0..16)
        .map(|f| {
            let (app, cookie, csrf) = (app.clone(), cookie.clone(), csrf.clone());
            tokio::spawn(async move {
                let mut counts = [0usize; 3];
                let mut i = 0;
                while started.elapsed() < flood_for {
                    i += 1;
                    let response = app
                        .client
                        .post(app.url("/login"))
                        .header("Cookie", &cookie)
                        .header("X-Forwarded-For", format!("10.{f}.{}.{}", i / 250, i % 250))
                        .form(&[
                            ("name", format!("nobody{f}-{i}")),
                            ("password", "x".into()),
                            ("csrf", csrf.clone()),
                        ])
                        .send()
                        .await
                        .unwrap();
                    match response.status() {
                        StatusCode::UNAUTHORIZED => counts[0] += 1,
                        StatusCode::SERVICE_UNAVAILABLE => counts[1] += 1,
                        _ => counts[2] += 1,
                    }
                }
                counts
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    let mut api_calls = 0;
    while started.elapsed() < flood_for {
        let asked = Instant::now();
        let response = app.get(&app.alice.token, "/api/v1/jobs").await;
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "the API answers during the flood"
        );
        slowest = slowest.max(asked.elapsed());
        api_calls += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut totals = [0usize; 3];
    for flooder in flooders {
        let counts = flooder.await.unwrap();
        for (t, c) in totals.iter_mut().zip(counts) {
            *t += c;
        }
    }
    let sign_ins = totals.iter().sum::<usize>();
    // Measured again after the flood: the tests running beside this one
    // may have slowed every check meanwhile; the slower measure counts.
    let per_check = before.max(one_check().await);
    let capacity = flood_for.as_secs_f64() / per_check.as_secs_f64();
    let figures = format!(
        "sign-in flood: {sign_ins} sign-ins in {:.1} s ({:.0}/s: {} checked, {} refused 503, {} other; \
         one check takes {:.1} ms, so one slot checks {capacity:.0} in that time); \
         {api_calls} API requests all answered, slowest {} ms",
        flood_for.as_secs_f64(),
        sign_ins as f64 / flood_for.as_secs_f64(),
        totals[0],
        totals[1],
        totals[2],
        per_check.as_secs_f64() * 1000.0,
        slowest.as_millis()
    );
    eprintln!("{figures}");
    crate::support::harness::record_figures(&format!("sign-in-flood-{backend:?}"), &figures);
    assert!(
        totals[0] as f64 >= 0.5 * capacity,
        "a flood that keeps the password checks busy: {figures}"
    );
    assert_eq!(totals[2], 0, "only 401 and 503: {figures}");
    let job = app.get_job(&app.ada.token, &job_id).await;
    assert_eq!(
        job["attempts"][0]["state"], "running",
        "the live attempt kept its lease"
    );
    assert_eq!(job["status"], "running");
    fake.release(&live, Behaviour::Answer(json!({"summary": "done"})));
    app.wait_for_status(&job_id, "succeeded", WAIT).await;
    let tokens: i64 = app
        .with_conn(|conn| api_tokens::table.count().get_result(conn).unwrap())
        .await;
    assert_eq!(tokens, 4, "nothing else changed");
}

/// `onejob users …` against the running server's database.
async fn the_command_line_disables_enables_and_revokes_at_once(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let (alice, _) = sign_in(&app, "alice", "alice-pw").await;
    let api = |token: String| {
        let app = &app;
        async move { app.get(&token, "/api/v1/jobs").await.status() }
    };
    assert_eq!(api(app.alice.token.clone()).await, StatusCode::OK);
    onejob_users(&app, &["disable", "alice"]);
    assert_eq!(
        api(app.alice.token.clone()).await,
        StatusCode::UNAUTHORIZED,
        "tokens stop at once"
    );
    assert_eq!(
        alice.get("/jobs").await.status(),
        StatusCode::SEE_OTHER,
        "sessions stop at once"
    );
    onejob_users(&app, &["enable", "alice"]);
    assert_eq!(api(app.alice.token.clone()).await, StatusCode::OK);
    onejob_users(&app, &["revoke-tokens", "alice"]);
    assert_eq!(api(app.alice.token.clone()).await, StatusCode::UNAUTHORIZED);
    let issued = onejob_users(&app, &["token", "alice", "--days", "1"]);
    let token = String::from_utf8(issued.stdout).unwrap().trim().to_owned();
    assert_eq!(api(token).await, StatusCode::OK);
    let expires: Vec<Option<i64>> = app
        .with_conn(|conn| {
            api_tokens::table
                .select(api_tokens::expires_at)
                .load(conn)
                .unwrap()
        })
        .await;
    let now = onejob::domain::Timestamp::now().millis();
    assert!(
        expires
            .iter()
            .any(|e| e.is_some_and(|at| at > now && at <= now + 86_400_000)),
        "{expires:?}"
    );
}

on_both_backends!(
    the_command_line_disables_enables_and_revokes_at_once,
    the_users_page_adds_resets_revokes_disables_and_audits_each_action,
    support_finds_a_job_by_id_key_owner_status_and_provider,
    every_response_carries_the_security_headers,
    cleanup_removes_expired_sessions_and_quiet_counters_only,
    an_answer_larger_than_the_cap_is_refused_unread,
    owners_see_a_classified_reason_and_staff_the_providers_text,
    the_callback_route_honours_the_body_limit,
    a_sign_in_flood_starves_neither_the_api_nor_lease_renewals,
);
