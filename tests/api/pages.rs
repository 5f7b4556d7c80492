//! The browser app over plain HTTP (no JavaScript): sign-in, forms, CSRF,
//! escaping, roles and the htmx partial.

use reqwest::StatusCode;

use crate::support::harness::{
    hidden_value, spawn_app, spawn_app_with, summarize, test_config, FormClient, TestBackend,
    DEFAULT_TEST_PROVIDERS,
};

async fn the_submit_form_without_javascript_makes_one_job_however_often_it_is_posted(
    backend: TestBackend,
) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    let browser = FormClient::new(&app);
    let csrf = browser.sign_in("alice", "alice-password").await;
    let (form_url, form) = browser.open_submit_form("").await;
    let key = hidden_value(&form, "idempotency_key");
    assert!(form_url.ends_with(&key), "the form's URL carries its key");
    let fields = [
        ("csrf", csrf.as_str()),
        ("idempotency_key", key.as_str()),
        ("task", "summarize"),
        ("provider", ""),
        ("input.text", "hello"),
    ];
    let first = browser.post_form("/jobs", &fields).await;
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    let location = first.headers()["location"].to_str().unwrap().to_owned();
    assert!(location.starts_with("/jobs/"));
    // Enter twice, a reload that re-POSTs: the same job.
    for _ in 0..2 {
        let again = browser.post_form("/jobs", &fields).await;
        assert_eq!(again.status(), StatusCode::SEE_OTHER);
        assert_eq!(again.headers()["location"].to_str().unwrap(), location);
    }
    assert_eq!(app.job_count(&app.alice.id).await, 1);
    // Changed content under the same key: explained, nothing created.
    let changed = [
        ("csrf", csrf.as_str()),
        ("idempotency_key", key.as_str()),
        ("task", "summarize"),
        ("provider", ""),
        ("input.text", "edited"),
    ];
    let response = browser.post_form("/jobs", &changed).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let page = response.text().await.unwrap();
    assert!(
        page.contains("already submitted, with different content"),
        "{page}"
    );
    assert!(
        page.contains(&format!("href=\"{location}\"")),
        "links the existing job"
    );
    assert_eq!(app.job_count(&app.alice.id).await, 1);
    // Back to the form's own URL: it knows it was submitted, and says so.
    let again = browser.get(&form_url).await.text().await.unwrap();
    assert!(again.contains("This form was already submitted"), "{again}");
    assert!(
        again.contains(&format!("href=\"{location}\"")),
        "links the job"
    );
    assert_eq!(hidden_value(&again, "idempotency_key"), key, "the same key");
    assert!(
        again.contains(">hello</textarea>"),
        "filled with what it sent"
    );
    // A fresh form carries a fresh key.
    let (_, fresh) = browser.open_submit_form("").await;
    assert_ne!(hidden_value(&fresh, "idempotency_key"), key);
}

/// The submit form posts to an address that repeats its key, where a load
/// balancer can route by it (docs/deployment.md, "Routing by key"); the
/// hidden field stays the key, and an address naming another key is
/// refused before anything is stored.
async fn the_submit_forms_address_repeats_its_key_and_must_agree_with_it(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    let browser = FormClient::new(&app);
    let csrf = browser.sign_in("alice", "alice-password").await;
    let (_, form) = browser.open_submit_form("").await;
    let key = hidden_value(&form, "idempotency_key");
    let action = format!("/jobs?idempotency_key={key}");
    assert!(
        form.contains(&format!(
            "action=\"{action}\" class=\"stack\" id=\"submit-form\""
        )),
        "the form posts to {action}: {form}"
    );
    let fields = [
        ("csrf", csrf.as_str()),
        ("idempotency_key", key.as_str()),
        ("task", "summarize"),
        ("provider", ""),
        ("input.text", "routed by its key"),
    ];
    let elsewhere = browser
        .post_form("/jobs?idempotency_key=another-key", &fields)
        .await;
    assert_eq!(elsewhere.status(), StatusCode::BAD_REQUEST);
    let page = elsewhere.text().await.unwrap();
    assert!(page.contains("another submission key"), "{page}");
    assert_eq!(app.job_count(&app.alice.id).await, 0, "nothing stored");

    let routed = browser.post_form(&action, &fields).await;
    assert_eq!(routed.status(), StatusCode::SEE_OTHER);
    let location = routed.headers()["location"].to_str().unwrap().to_owned();
    // Posted to `/jobs` alone, as before: the field is the key.
    let plain = browser.post_form("/jobs", &fields).await;
    assert_eq!(plain.status(), StatusCode::SEE_OTHER);
    assert_eq!(plain.headers()["location"].to_str().unwrap(), location);
    assert_eq!(app.job_count(&app.alice.id).await, 1);
}

/// Posts the submit form as a browser without JavaScript would.
async fn submit_form(browser: &FormClient, csrf: &str, key: &str, text: &str) -> reqwest::Response {
    let fields = [
        ("csrf", csrf),
        ("idempotency_key", key),
        ("task", "summarize"),
        ("provider", ""),
        ("input.text", text),
    ];
    browser.post_form("/jobs", &fields).await
}

/// A browser form is read up to `server.body_limit_bytes`, as the JSON API
/// is: 80 KB of input is refused with a readable page under the default
/// 64 KiB and accepted once the limit is raised.
async fn browser_forms_follow_the_configured_body_limit(backend: TestBackend) {
    let text = "a".repeat(80 * 1024);
    for (limit, accepted) in [(None, false), (Some(256 * 1024), true)] {
        let mut config = test_config(DEFAULT_TEST_PROVIDERS);
        if let Some(limit) = limit {
            config.server.body_limit_bytes = limit;
        }
        let app = spawn_app_with(backend, config).await;
        app.set_password("alice", "alice-password").await;
        let browser = FormClient::new(&app);
        let csrf = browser.sign_in("alice", "alice-password").await;
        let key = hidden_value(&browser.open_submit_form("").await.1, "idempotency_key");
        let response = submit_form(&browser, &csrf, &key, &text).await;
        if accepted {
            assert_eq!(response.status(), StatusCode::SEE_OTHER, "limit {limit:?}");
            assert_eq!(app.job_count(&app.alice.id).await, 1);
        } else {
            assert_eq!(
                response.status(),
                StatusCode::BAD_REQUEST,
                "limit {limit:?}"
            );
            let page = response.text().await.unwrap();
            assert!(page.contains("The form could not be read"), "{page}");
            assert_eq!(app.job_count(&app.alice.id).await, 0);
        }
    }
}

async fn an_invalid_form_is_shown_again_with_the_same_key_and_nothing_stored(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    let browser = FormClient::new(&app);
    let csrf = browser.sign_in("alice", "alice-password").await;
    let key = hidden_value(&browser.open_submit_form("").await.1, "idempotency_key");
    let response = submit_form(&browser, &csrf, &key, "  ").await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let page = response.text().await.unwrap();
    assert!(page.contains("non-empty string"), "says what is wrong");
    assert_eq!(
        hidden_value(&page, "idempotency_key"),
        key,
        "the key is kept, not reserved"
    );
    assert_eq!(app.job_count(&app.alice.id).await, 0);
    let fixed = submit_form(&browser, &csrf, &key, "fixed").await;
    assert_eq!(fixed.status(), StatusCode::SEE_OTHER);
}

async fn a_cross_site_post_is_refused_and_changes_nothing(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    let browser = FormClient::new(&app);
    let _csrf = browser.sign_in("alice", "alice-password").await;
    let key = uuid::Uuid::now_v7().to_string();
    // Another site can make the browser send the cookie, but not the token.
    for token in [None, Some("0".repeat(64))] {
        let mut form = vec![
            ("idempotency_key", key.clone()),
            ("task", "summarize".into()),
            ("input.text", "forged".into()),
        ];
        if let Some(t) = &token {
            form.push(("csrf", t.clone()));
        }
        let response = browser
            .http
            .post(format!("{}/jobs", browser.base))
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert!(response
            .text()
            .await
            .unwrap()
            .contains("did not come from this session"));
    }
    assert_eq!(app.job_count(&app.alice.id).await, 0);
    // Signing in needs the sign-in page's own token too.
    let other = FormClient::new(&app);
    let response = other
        .post_form(
            "/login",
            &[
                ("name", "alice"),
                ("password", "alice-password"),
                ("csrf", "x"),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
}

/// Posts the sign-in form from `address` (via a trusted proxy's
/// `X-Forwarded-For`).
async fn sign_in_from(
    browser: &FormClient,
    csrf: &str,
    address: &str,
    name: &str,
    password: &str,
) -> reqwest::Response {
    browser
        .http
        .post(format!("{}/login", browser.base))
        .header("X-Forwarded-For", address)
        .form(&[("name", name), ("password", password), ("csrf", csrf)])
        .send()
        .await
        .unwrap()
}

async fn throttle_rows(app: &crate::support::harness::TestApp) -> Vec<(String, i32)> {
    use diesel::prelude::*;
    use onejob::store::schema::sign_in_throttle as t;
    app.with_conn(|conn| {
        t::table
            .order(t::scope)
            .select((t::scope, t::failures))
            .load(conn)
            .unwrap()
    })
    .await
}

async fn wrong_passwords_slow_one_address_down_and_never_lock_out_another(backend: TestBackend) {
    let mut config =
        crate::support::harness::test_config(crate::support::harness::DEFAULT_TEST_PROVIDERS);
    config.server.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    let app = crate::support::harness::spawn_app_with(backend, config).await;
    app.set_password("ada", "ada-password").await;
    let attacker = FormClient::new(&app);
    let page = attacker.get("/login").await.text().await.unwrap();
    let csrf = hidden_value(&page, "csrf");
    let free = onejob::domain::throttle::NAME_AT_ADDRESS.free;
    // Guesses at `ada` from one address: free tries, then a growing wait.
    for _ in 0..=free {
        let response = sign_in_from(&attacker, &csrf, "203.0.113.9", "ada", "guess").await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(response
            .text()
            .await
            .unwrap()
            .contains("Wrong name or password"));
    }
    let response = sign_in_from(&attacker, &csrf, "203.0.113.9", "ada", "ada-password").await;
    assert_eq!(
        response.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "that address waits, even with the right password"
    );
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(
        throttle_rows(&app).await,
        vec![
            ("addr:203.0.113.9".to_owned(), free as i32 + 1),
            ("name:ada@203.0.113.9".to_owned(), free as i32 + 1),
        ],
        "counted per name and address, and per address; the refused try not counted"
    );
    // The admin, from anywhere else, signs in at once.
    let admin = FormClient::new(&app);
    let page = admin.get("/login").await.text().await.unwrap();
    let admin_csrf = hidden_value(&page, "csrf");
    let response = sign_in_from(&admin, &admin_csrf, "198.51.100.7", "ada", "ada-password").await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER, "never locked out");
    // A password reset lifts every wait on the name.
    app.set_password("ada", "new-password").await;
    assert_eq!(
        throttle_rows(&app).await,
        vec![("addr:203.0.113.9".to_owned(), free as i32 + 1)]
    );
    // Without a trusted proxy the header is ignored: it is the socket's address.
    let response = attacker
        .post_form(
            "/login",
            &[("name", "bob"), ("password", "nope"), ("csrf", &csrf)],
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(throttle_rows(&app)
        .await
        .iter()
        .any(|(scope, _)| scope == "name:bob@127.0.0.1"));
}

async fn parallel_guesses_cannot_spend_more_than_the_allowance(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("bob", "bob-password").await;
    let browser = std::sync::Arc::new(FormClient::new(&app));
    let page = browser.get("/login").await.text().await.unwrap();
    let csrf = hidden_value(&page, "csrf");
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let guesses: Vec<_> = (0..20)
        .map(|_| {
            let (browser, barrier, csrf) = (browser.clone(), barrier.clone(), csrf.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                browser
                    .post_form(
                        "/login",
                        &[("name", "bob"), ("password", "guess"), ("csrf", &csrf)],
                    )
                    .await
                    .status()
            })
        })
        .collect();
    let mut checked = 0;
    for guess in guesses {
        match guess.await.unwrap() {
            StatusCode::UNAUTHORIZED => checked += 1,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {}
            other => panic!("unexpected {other}"),
        }
    }
    let free = onejob::domain::throttle::NAME_AT_ADDRESS.free as usize;
    assert!(
        checked <= free + 1,
        "{checked} of 20 simultaneous guesses had their password checked; at most {} may",
        free + 1
    );
}

async fn a_name_that_cannot_exist_costs_nothing_and_is_not_stored(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let browser = FormClient::new(&app);
    let page = browser.get("/login").await.text().await.unwrap();
    let csrf = hidden_value(&page, "csrf");
    let huge = "x".repeat(60 * 1024);
    let response = browser
        .post_form(
            "/login",
            &[("name", &huge), ("password", "p"), ("csrf", &csrf)],
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(
        !response.text().await.unwrap().contains(&huge[..100]),
        "not shown again"
    );
    assert!(throttle_rows(&app).await.is_empty(), "nothing stored");
}

async fn pages_need_a_session_and_sign_out_ends_it(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    let browser = FormClient::new(&app);
    let response = browser.get("/jobs/new?key=k1").await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        response.headers()["location"],
        "/login?next=/jobs/new%3Fkey%3Dk1"
    );
    let csrf = browser.sign_in("alice", "alice-password").await;
    assert_eq!(browser.get("/jobs").await.status(), StatusCode::OK);
    let response = browser.post_form("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        browser.get("/jobs").await.status(),
        StatusCode::SEE_OTHER,
        "signed out"
    );
}

async fn the_session_cookie_is_http_only_and_same_site(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = client.get(app.url("/login")).send().await.unwrap();
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let csrf = hidden_value(&login.text().await.unwrap(), "csrf");
    let response = client
        .post(app.url("/login"))
        .header("Cookie", cookie)
        .form(&[
            ("name", "alice"),
            ("password", "alice-password"),
            ("csrf", &csrf),
        ])
        .send()
        .await
        .unwrap();
    let set_cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(set_cookie.starts_with("onejob_session="));
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Lax"),
        "{set_cookie}"
    );
    assert!(
        !set_cookie.contains("Secure"),
        "plain HTTP here; Secure is set over TLS"
    );
}

async fn html_in_a_jobs_input_renders_as_text(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    let script = "<script>alert('owned')</script>";
    let job_id = app
        .create_job(&app.alice.token, "xss", &summarize(script))
        .await;
    let browser = FormClient::new(&app);
    browser.sign_in("alice", "alice-password").await;
    let page = browser
        .get(&format!("/jobs/{job_id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        !page.contains(script),
        "the script is not in the page as markup"
    );
    assert!(
        page.contains("&lt;script&gt;") || page.contains("&#60;script&#62;"),
        "it is shown escaped"
    );
}

async fn reasons_staff_write_are_escaped_on_the_console_audit_and_job_pages(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("ada", "ada-pw").await;
    // Signed in first: sim-slow's late answer comes 1.5 s after the send,
    // and the job must still be unanswered when it is marked failed (a
    // password check is slow on purpose).
    let ada = FormClient::new(&app);
    let csrf = ada.sign_in("ada", "ada-pw").await;
    let mut body = summarize("times out");
    body["provider"] = "sim-slow".into();
    let job_id = app.create_job(&app.alice.token, "escape", &body).await;
    let job = app
        .wait_for_status(&job_id, "unknown", std::time::Duration::from_secs(15))
        .await;
    let attempt_id = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    let abandon_reason = "<script>alert('abandon')</script>";
    let response = app
        .abandon(&app.sue.token, &attempt_id, abandon_reason)
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let fail_reason = "<img src=x onerror=alert('fail')>";
    let response = ada
        .post_form(
            &format!("/jobs/{job_id}/fail"),
            &[("csrf", &csrf), ("reason", fail_reason)],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    // Stored as written…
    let entries = app
        .with_conn(|conn| onejob::store::console::audit_entries(conn, 10).unwrap())
        .await;
    let reasons: Vec<&str> = entries.iter().map(|e| e.reason.as_str()).collect();
    assert!(
        reasons.contains(&abandon_reason) && reasons.contains(&fail_reason),
        "{reasons:?}"
    );
    // …and shown as text, never as markup.
    for path in ["/admin/audit".to_owned(), format!("/jobs/{job_id}")] {
        let page = ada.get(&path).await.text().await.unwrap();
        for raw in [abandon_reason, fail_reason] {
            assert!(!page.contains(raw), "{path} carries {raw} as markup");
        }
    }
    let audit = ada.get("/admin/audit").await.text().await.unwrap();
    assert!(
        audit.contains("&lt;script&gt;alert(") || audit.contains("&#60;script&#62;alert("),
        "{audit}"
    );
    assert!(
        audit.contains("&lt;img src=x onerror=") || audit.contains("&#60;img src=x onerror="),
        "{audit}"
    );
    let job_page = ada
        .get(&format!("/jobs/{job_id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        job_page.contains("marked failed by support: &lt;img")
            || job_page.contains("marked failed by support: &#60;img"),
        "the failure reason is shown escaped"
    );
}

async fn roles_are_enforced_on_the_console_and_other_owners_jobs_are_404(backend: TestBackend) {
    let app = spawn_app(backend).await;
    for (name, pw) in [("alice", "a-pw"), ("bob", "b-pw"), ("sue", "s-pw")] {
        app.set_password(name, pw).await;
    }
    let job_id = app
        .create_job(&app.alice.token, "mine", &summarize("alice's"))
        .await;
    let bob = FormClient::new(&app);
    bob.sign_in("bob", "b-pw").await;
    for path in ["/admin", "/admin/unknown", "/admin/races", "/admin/audit"] {
        assert_eq!(
            bob.get(path).await.status(),
            StatusCode::FORBIDDEN,
            "{path}"
        );
    }
    assert_eq!(
        bob.get(&format!("/jobs/{job_id}")).await.status(),
        StatusCode::NOT_FOUND
    );
    let sue = FormClient::new(&app);
    sue.sign_in("sue", "s-pw").await;
    assert_eq!(sue.get("/admin").await.status(), StatusCode::OK);
    assert_eq!(sue.get("/admin/unknown").await.status(), StatusCode::OK);
    assert_eq!(
        sue.get("/admin/races").await.status(),
        StatusCode::FORBIDDEN,
        "the race log is for admins"
    );
    assert_eq!(
        sue.get(&format!("/jobs/{job_id}")).await.status(),
        StatusCode::OK,
        "support may look"
    );
}

async fn htmx_polling_gets_the_live_partial_and_boosted_navigation_the_page(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("alice", "alice-password").await;
    let job_id = app
        .create_job(&app.alice.token, "partial", &summarize("p"))
        .await;
    let browser = FormClient::new(&app);
    browser.sign_in("alice", "alice-password").await;
    let page = format!("/jobs/{job_id}");
    let url = format!("{}{page}", browser.base);
    let partial = browser.partial(&page).await;
    assert!(
        partial.trim_start().starts_with("<section id=\"job-live\""),
        "{partial}"
    );
    assert!(!partial.contains("<html"));
    let boosted = browser
        .http
        .get(&url)
        .header("HX-Request", "true")
        .header("HX-Boosted", "true")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(boosted.contains("<html"));
    // Once the job is finished the live part stops asking to be polled.
    app.wait_for_status(&job_id, "succeeded", std::time::Duration::from_secs(10))
        .await;
    let done = browser.partial(&page).await;
    assert!(!done.contains("hx-trigger"), "{done}");
}

async fn static_assets_are_served_and_htmx_is_cached_for_good(backend: TestBackend) {
    let app = spawn_app(backend).await;
    let response = app
        .client
        .get(app.url("/static/htmx-2.0.11.min.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["cache-control"],
        "public, max-age=31536000, immutable"
    );
    assert!(response.text().await.unwrap().contains("htmx"));
    let missing = app
        .client
        .get(app.url("/no/such/page"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert!(missing.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
}

async fn support_can_mark_a_resolved_job_failed_with_an_audited_reason(backend: TestBackend) {
    let app = crate::support::harness::spawn_app_with(
        backend,
        crate::support::harness::test_config(crate::attempts::HANGING_PRIMARY),
    )
    .await;
    app.set_password("sue", "s-pw").await;
    let job_id = app
        .create_job(&app.alice.token, "give-up", &summarize("x"))
        .await;
    let job = app
        .wait_for_status(&job_id, "unknown", std::time::Duration::from_secs(10))
        .await;
    let attempt = job["attempts"][0]["id"].as_str().unwrap().to_owned();
    let sue = FormClient::new(&app);
    let csrf = sue.sign_in("sue", "s-pw").await;
    // Not while the attempt is unknown.
    let response = sue
        .post_form(
            &format!("/jobs/{job_id}/fail"),
            &[("csrf", &csrf), ("reason", "customer cancelled")],
        )
        .await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let response = sue
        .abandon_attempt(&csrf, &attempt, "provider outage")
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        response.headers()["location"].to_str().unwrap(),
        format!("/jobs/{job_id}")
    );
    let response = sue
        .post_form(
            &format!("/jobs/{job_id}/fail"),
            &[("csrf", &csrf), ("reason", "customer cancelled")],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(job["status"], "failed");
    assert!(job["failure_reason"]
        .as_str()
        .unwrap()
        .contains("customer cancelled"));
    let entries = app
        .with_conn(|conn| onejob::store::console::audit_entries(conn, 10).unwrap())
        .await;
    let actions: Vec<_> = entries
        .iter()
        .map(|e| (e.actor.as_str(), e.action.as_str()))
        .collect();
    assert_eq!(
        actions,
        vec![("sue", "fail_job"), ("sue", "abandon_attempt")]
    );
}

async fn the_providers_page_shows_the_matrix_and_qualifies_on_demand(backend: TestBackend) {
    let app = spawn_app(backend).await;
    app.set_password("ada", "ada-pw").await;
    app.set_password("sue", "sue-pw").await;
    let sue = FormClient::new(&app);
    sue.sign_in("sue", "sue-pw").await;
    assert_eq!(
        sue.get("/admin/providers").await.status(),
        StatusCode::FORBIDDEN,
        "admins only"
    );
    let ada = FormClient::new(&app);
    let csrf = ada.sign_in("ada", "ada-pw").await;
    let page = ada.get("/admin/providers").await.text().await.unwrap();
    // Qualified at start: sim-fast answers in time; sim-slow outlasts its soft timeout.
    assert!(
        page.contains(r#"data-provider="sim-fast" data-task="summarize" data-status="qualified""#),
        "{page}"
    );
    assert!(
        page.contains(r#"data-provider="sim-slow" data-task="summarize" data-status="failed""#),
        "{page}"
    );
    assert!(
        page.contains("no answer within the provider&#39;s soft timeout of 300 ms"),
        "the failing check is shown"
    );
    // The qualification at start is seconds old, and its age says so.
    let row = page
        .split(r#"data-provider="sim-fast" data-task="summarize""#)
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .expect("the sim-fast row");
    let age = row
        .split(r#"<td data-label="Age">"#)
        .nth(1)
        .and_then(|cell| cell.split("</td>").next())
        .expect("an Age cell");
    assert!(
        age.ends_with(" ms") || (age.ends_with(" s") && !age.contains("min")),
        "the age of a qualification made at start: {age:?}"
    );
    let response = ada
        .post_form(
            "/admin/providers/qualify",
            &[
                ("csrf", &csrf),
                ("provider", "sim-fast"),
                ("task", "summarize"),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let entries = app
        .with_conn(|conn| onejob::store::console::audit_entries(conn, 10).unwrap())
        .await;
    assert_eq!(entries[0].action, "qualify");
    assert!(
        entries[0]
            .reason
            .contains("qualified sim-fast for summarize"),
        "{}",
        entries[0].reason
    );
}

/// The owner's "Cancel the job" on the job page of a job whose attempt was
/// sent: the job is cancelled, the page offers neither a cancel nor a new
/// attempt and says why, a second cancel changes nothing, another user's
/// cancel finds no job, and the provider's late answer is discarded.
async fn the_owner_cancels_a_running_job_from_its_page(backend: TestBackend) {
    use crate::support::fake_provider::{
        answer, config_of, strict_task_toml, Behaviour, FakeProvider, ProviderToml, Shape,
    };
    let fake = FakeProvider::start(Shape::OpenAi).await;
    fake.set_default(Behaviour::Hold);
    let toml = [
        ProviderToml::openai("held", &fake.base_url)
            .timeout_ms(600_000)
            .late_result_ms(600_000)
            .toml(),
        strict_task_toml("summarize", &["held"], "Summarize: {{ text }}"),
    ]
    .concat();
    let app = spawn_app_with(backend, config_of(&toml)).await;
    app.set_password("alice", "alice-password").await;
    app.set_password("bob", "bob-password").await;
    let job_id = app
        .create_job(&app.alice.token, "to-cancel", &summarize("never mind"))
        .await;
    let held = fake.wait_held_count(1).await.remove(0);
    let alice = FormClient::new(&app);
    let csrf = alice.sign_in("alice", "alice-password").await;
    let path = format!("/jobs/{job_id}");
    let page = alice.get(&path).await.text().await.unwrap();
    assert!(page.contains("id=\"cancel-job\""), "{page}");

    let bob = FormClient::new(&app);
    let bob_csrf = bob.sign_in("bob", "bob-password").await;
    let refused = bob
        .post_form(&format!("{path}/cancel"), &[("csrf", &bob_csrf)])
        .await;
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(
        job["status"], "running",
        "another user's cancel changed nothing"
    );

    for _ in 0..2 {
        let cancelled = alice
            .post_form(&format!("{path}/cancel"), &[("csrf", &csrf)])
            .await;
        assert_eq!(cancelled.status(), StatusCode::SEE_OTHER);
        assert_eq!(cancelled.headers()["location"].to_str().unwrap(), path);
    }
    let job = app.get_job(&app.alice.token, &job_id).await;
    assert_eq!(job["status"], "cancelled");
    let metrics = crate::support::metrics::metrics(&app).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "onejob_jobs_cancelled_total 1"),
        "one cancel counted, not two: {metrics}"
    );
    let page = alice.get(&path).await.text().await.unwrap();
    assert!(!page.contains("id=\"cancel-job\""), "no cancel offered now");
    assert!(
        !page.contains("id=\"new-attempt\""),
        "no new attempt offered"
    );
    assert!(page.contains("cancelled by its owner"), "{page}");

    // The sent attempt's late answer loses and leaves the job cancelled.
    fake.release(&held, answer("too late"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let job = app.get_job(&app.alice.token, &job_id).await;
        if job["attempts"][0]["outcome"] == "lost" {
            assert_eq!(job["status"], "cancelled");
            assert!(job["result"].is_null());
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no race: {job:#}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

on_both_backends!(
    the_owner_cancels_a_running_job_from_its_page,
    browser_forms_follow_the_configured_body_limit,
    reasons_staff_write_are_escaped_on_the_console_audit_and_job_pages,
    the_submit_form_without_javascript_makes_one_job_however_often_it_is_posted,
    the_submit_forms_address_repeats_its_key_and_must_agree_with_it,
    an_invalid_form_is_shown_again_with_the_same_key_and_nothing_stored,
    a_cross_site_post_is_refused_and_changes_nothing,
    wrong_passwords_slow_one_address_down_and_never_lock_out_another,
    parallel_guesses_cannot_spend_more_than_the_allowance,
    a_name_that_cannot_exist_costs_nothing_and_is_not_stored,
    pages_need_a_session_and_sign_out_ends_it,
    the_session_cookie_is_http_only_and_same_site,
    html_in_a_jobs_input_renders_as_text,
    roles_are_enforced_on_the_console_and_other_owners_jobs_are_404,
    htmx_polling_gets_the_live_partial_and_boosted_navigation_the_page,
    static_assets_are_served_and_htmx_is_cached_for_good,
    support_can_mark_a_resolved_job_failed_with_an_audited_reason,
    the_providers_page_shows_the_matrix_and_qualifies_on_demand,
);
