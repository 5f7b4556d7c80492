//! Sign-in that attackers cannot turn against users: a flood of made-up
//! names leaves honest users from other addresses signing in, a password
//! spray is throttled however often the sprayer signs in to their own
//! account, names are unique without regard to case, and nothing typed into
//! the name field, nor any generated password, reaches the logs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use onejob::domain::throttle::ADDRESS;
use onejob::domain::Role;
use onejob::store::schema::{sign_in_throttle, users};
use reqwest::StatusCode;

use crate::server_process::ServerProcess;
use crate::support::harness::{
    hidden_value, record_figures, spawn_app_with, test_config, FormClient, TestApp, TestBackend,
    DEFAULT_TEST_PROVIDERS,
};

on_both_backends!(
    honest_sign_ins_succeed_from_another_address_while_an_anonymous_flood_runs,
    a_sprayer_is_throttled_however_many_good_sign_ins_they_make,
    admin_cannot_be_created_beside_admin_in_any_case,
    no_generated_password_or_mistyped_secret_reaches_the_logs,
    names_differing_only_in_case_from_before_the_rule_are_kept_and_named,
);

/// An app behind a trusted proxy on 127.0.0.1, so tests choose the client's
/// address with `X-Forwarded-For`.
async fn proxied_app(backend: TestBackend) -> TestApp {
    let mut config = test_config(DEFAULT_TEST_PROVIDERS);
    config.server.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    spawn_app_with(backend, config).await
}

/// A client at the sign-in form: its CSRF cookie and token.
struct SignInForm {
    http: reqwest::Client,
    url: String,
    cookie: String,
    csrf: String,
}

impl SignInForm {
    async fn open(app: &TestApp) -> Self {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let page = http.get(app.url("/login")).send().await.unwrap();
        let cookie = page.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let csrf = hidden_value(&page.text().await.unwrap(), "csrf");
        Self {
            http,
            url: app.url("/login"),
            cookie,
            csrf,
        }
    }

    async fn post(&self, address: &str, name: &str, password: &str) -> StatusCode {
        self.http
            .post(&self.url)
            .header("Cookie", &self.cookie)
            .header("X-Forwarded-For", address)
            .form(&[("name", name), ("password", password), ("csrf", &self.csrf)])
            .send()
            .await
            .unwrap()
            .status()
    }
}

async fn throttle_rows(app: &TestApp) -> Vec<(String, i32)> {
    app.with_conn(|conn| {
        sign_in_throttle::table
            .order(sign_in_throttle::scope)
            .select((sign_in_throttle::scope, sign_in_throttle::failures))
            .load(conn)
            .unwrap()
    })
    .await
}

/// Four anonymous clients sign in with names that do not exist, each
/// changing its address every 20 tries, as fast as they are answered. A
/// user with the right password, from another address, every 0.25 s, gets
/// in: at most one busy answer in ten, never a wait imposed by the flood.
async fn honest_sign_ins_succeed_from_another_address_while_an_anonymous_flood_runs(
    backend: TestBackend,
) {
    let app = Arc::new(proxied_app(backend).await);
    app.set_password("ada", "ada-password").await;
    let stop = Arc::new(AtomicBool::new(false));
    let flood_answers = Arc::new(AtomicUsize::new(0));
    let flooders: Vec<_> = (0..4)
        .map(|f| {
            let (app, stop, answers) = (app.clone(), stop.clone(), flood_answers.clone());
            tokio::spawn(async move {
                let form = SignInForm::open(&app).await;
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let address = format!("10.{f}.{}.1", i / 20);
                    let status = form
                        .post(&address, &format!("nobody-{f}-{i}"), "Spring2026!")
                        .await;
                    assert!(
                        matches!(
                            status,
                            StatusCode::UNAUTHORIZED
                                | StatusCode::SERVICE_UNAVAILABLE
                                | StatusCode::TOO_MANY_REQUESTS
                        ),
                        "flood answered {status}"
                    );
                    answers.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    // Let the flood fill the line first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let victim = SignInForm::open(&app).await;
    let started = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(victim.post("198.51.100.7", "ada", "ada-password").await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for flooder in flooders {
        flooder.await.unwrap();
    }
    let count = |status| statuses.iter().filter(|s| **s == status).count();
    let (ok, busy, waits) = (
        count(StatusCode::SEE_OTHER),
        count(StatusCode::SERVICE_UNAVAILABLE),
        count(StatusCode::TOO_MANY_REQUESTS),
    );
    let flood = flood_answers.load(Ordering::Relaxed);
    let figures = format!(
        "sign-in flood vs an honest user: {flood} flood sign-ins answered in {:.1} s \
         ({:.0}/s); the honest user: {ok} of {} signed in, {busy} busy, {waits} throttled",
        took.as_secs_f64() + 0.5,
        flood as f64 / (took.as_secs_f64() + 0.5),
        statuses.len()
    );
    eprintln!("{figures}");
    record_figures(&format!("sign-in-honest-user-{backend:?}"), &figures);
    // Each flooder was answered about as often as the user tried: the
    // password checks were shared, not the user's alone.
    assert!(flood >= 4 * statuses.len(), "a real flood: {figures}");
    assert_eq!(waits, 0, "the flood never makes the user wait: {figures}");
    assert!(busy <= 1, "at most one busy answer: {figures}");
    assert_eq!(ok + busy, statuses.len(), "{statuses:?}");
    assert!(
        !throttle_rows(&app)
            .await
            .iter()
            .any(|(scope, _)| scope.contains("198.51.100.7")),
        "the honest user's address carries no count"
    );
    assert!(
        !throttle_rows(&app)
            .await
            .iter()
            .any(|(scope, _)| scope.starts_with("name:")),
        "made-up names are counted against no account"
    );
}

/// One address tries one password over many accounts' names, and signs in
/// to its own account every ten tries: its failures still add up, and it
/// is made to wait once it has spent the address's allowance.
async fn a_sprayer_is_throttled_however_many_good_sign_ins_they_make(backend: TestBackend) {
    let app = proxied_app(backend).await;
    let targets = 40;
    app.with_conn(move |conn| {
        for i in 0..targets {
            onejob::store::users::add_user(conn, &format!("target{i}"), Role::User).unwrap();
        }
        onejob::store::users::add_user(conn, "mallory", Role::User).unwrap();
    })
    .await;
    app.set_password("mallory", "mallory-password").await;
    let sprayer = SignInForm::open(&app).await;
    let mut failures = 0;
    let mut first_wait = None;
    let mut good = 0;
    for i in 0..70 {
        let status = if i % 10 == 9 {
            let status = sprayer
                .post("203.0.113.50", "mallory", "mallory-password")
                .await;
            if status == StatusCode::SEE_OTHER {
                good += 1;
            }
            status
        } else {
            let status = sprayer
                .post(
                    "203.0.113.50",
                    &format!("target{}", failures % targets),
                    "Spring2026!",
                )
                .await;
            if status == StatusCode::UNAUTHORIZED {
                failures += 1;
            }
            status
        };
        if status == StatusCode::TOO_MANY_REQUESTS && first_wait.is_none() {
            first_wait = Some(failures);
        }
    }
    let rows = throttle_rows(&app).await;
    let counted = rows
        .iter()
        .find(|(scope, _)| scope == "addr:203.0.113.50")
        .map(|(_, n)| *n);
    let figures = format!(
        "password spray from one address: {failures} failures, {good} good sign-ins \
         between them, first wait after {first_wait:?} failures; address count {counted:?}"
    );
    eprintln!("{figures}");
    assert!(good >= 3, "the sprayer did sign in between: {figures}");
    assert_eq!(
        first_wait,
        Some(ADDRESS.free as usize + 1),
        "a wait once the allowance is spent: {figures}"
    );
    assert!(
        counted.is_some_and(|n| n as i64 > ADDRESS.free),
        "good sign-ins took back only their own count: {figures}"
    );
    assert!(
        rows.iter()
            .all(|(scope, n)| !scope.starts_with("name:") || *n <= 3),
        "each account's name was tried within its own allowance: {rows:?}"
    );
}

/// Names are compared without regard to case: by the command line, the
/// Users page, the store and the database itself.
async fn admin_cannot_be_created_beside_admin_in_any_case(backend: TestBackend) {
    let app = proxied_app(backend).await;
    // The store refuses, naming the user who has the name.
    let refused = app
        .with_conn(|conn| {
            onejob::store::users::add_user(conn, "ADA", Role::User)
                .err()
                .map(|e| e.to_string())
        })
        .await;
    assert_eq!(
        refused.as_deref(),
        Some("a user named \"ada\" already exists")
    );
    // The command line.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(["users", "add", "Ada"])
        .env("DATABASE_URL", app.db.url.as_str())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("a user named \"ada\" already exists"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The Users page, as an admin.
    app.set_password("ada", "ada-password").await;
    let admin = FormClient::new(&app);
    let csrf = admin.sign_in("ada", "ada-password").await;
    let response = admin
        .post_form(
            "/admin/users",
            &[
                ("csrf", &csrf),
                ("name", "Alice"),
                ("role", "user"),
                ("reason", "a look-alike"),
            ],
        )
        .await;
    assert!(response.status().is_client_error(), "{}", response.status());
    let page = response.text().await.unwrap();
    assert!(
        page.contains("a user named &#34;alice&#34; already exists"),
        "{page}"
    );
    // A rename cannot make a clash either.
    let clash = app
        .with_conn(|conn| onejob::store::users::rename_user(conn, "bob", "ALICE").is_err())
        .await;
    assert!(clash);
    // Bypassing the application, the database refuses a second folded name.
    let raw = app
        .with_conn(|conn| {
            diesel::sql_query(
                "INSERT INTO users (id, name, name_folded, role, created_at) \
                 VALUES ('u-raw', 'SUE', 'sue', 'user', 0)",
            )
            .execute(conn)
        })
        .await;
    assert!(raw.is_err(), "the unique index refuses it");
    let mismatched = app
        .with_conn(|conn| {
            diesel::sql_query(
                "INSERT INTO users (id, name, name_folded, role, created_at) \
                 VALUES ('u-raw', 'Zed', 'zoe', 'user', 0)",
            )
            .execute(conn)
        })
        .await;
    assert!(mismatched.is_err(), "the check refuses a wrong folding");
    let names: Vec<String> = app
        .with_conn(|conn| users::table.select(users::name).load(conn).unwrap())
        .await;
    assert_eq!(names.len(), 4, "nothing was added: {names:?}");
}

/// A real server process on an empty database: the first admin's password
/// goes to a file of mode 0600, never to the logs; nor do passwords made
/// on the Users page, nor a secret typed into the name field.
async fn no_generated_password_or_mistyped_secret_reaches_the_logs(backend: TestBackend) {
    use std::os::unix::fs::PermissionsExt;
    let db = crate::support::harness::TestDb::create_empty(backend);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("onejob.toml");
    std::fs::write(&config, DEFAULT_TEST_PROVIDERS).unwrap();
    let mut server = ServerProcess::spawn(dir.path(), "serve", &config, db.url.as_str());
    server.wait_ready().await;
    let folder = db
        .url
        .sqlite_folder()
        .unwrap_or_else(|| dir.path().to_path_buf());
    let file = folder.join("onejob-first-password.txt");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only its owner may read it");
    let first = std::fs::read_to_string(&file).unwrap().trim().to_owned();
    assert_eq!(first.len(), 20);
    assert!(server
        .stderr()
        .contains(&format!("file={}", file.display())));

    let admin = FormClient::at(&server.base);
    let csrf = admin.sign_in("admin", &first).await;
    let added = admin
        .post_form(
            "/admin/users",
            &[
                ("csrf", &csrf),
                ("name", "zoe"),
                ("role", "user"),
                ("reason", "a new hire"),
            ],
        )
        .await
        .text()
        .await
        .unwrap();
    let shown = |page: &str| {
        let start = page
            .find("id=\"new-password\">")
            .expect("a password is shown")
            + "id=\"new-password\">".len();
        page[start..].split('<').next().unwrap().to_owned()
    };
    let zoe = shown(&added);
    let reset = admin
        .post_form(
            "/admin/users/zoe/act",
            &[
                ("csrf", &csrf),
                ("action", "reset-password"),
                ("reason", "forgotten"),
            ],
        )
        .await
        .text()
        .await
        .unwrap();
    let zoe_again = shown(&reset);
    // A password typed into the name field (generated passwords fit the
    // characters a name may have).
    let anonymous = FormClient::at(&server.base);
    let page = anonymous.get("/login").await.text().await.unwrap();
    let login_csrf = hidden_value(&page, "csrf");
    let status = anonymous
        .post_form(
            "/login",
            &[
                ("name", zoe_again.as_str()),
                ("password", "zoe"),
                ("csrf", &login_csrf),
            ],
        )
        .await
        .status();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    server.terminate();
    server.wait_exit(Duration::from_secs(30)).await;
    let logs = server.stderr() + &server.stdout();
    assert!(logs.contains("failed sign-in for a name that is no account's"));
    for (what, password) in [("first", &first), ("added", &zoe), ("reset", &zoe_again)] {
        assert!(
            !logs.contains(password.as_str()),
            "the {what} password is in the logs"
        );
    }
}

/// A database from before names were folded, holding `Bob` beside `bob`:
/// the migration keeps both (the earlier keeps the folded name), `onejob
/// migrate` names the clash and how to mend it, and a rename mends it.
async fn names_differing_only_in_case_from_before_the_rule_are_kept_and_named(
    backend: TestBackend,
) {
    let app = proxied_app(backend).await;
    let folder = match backend {
        TestBackend::Sqlite => "sqlite",
        TestBackend::Postgres => "postgres",
    };
    let migration = "2026-12-01-000009_user_names_folded";
    let down = std::fs::read_to_string(format!(
        "{}/migrations/{folder}/{migration}/down.sql",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    app.with_conn(move |conn| {
        use diesel::connection::SimpleConnection;
        conn.batch_execute(&down).unwrap();
        diesel::sql_query(format!(
            "DELETE FROM __diesel_schema_migrations WHERE version = '{}'",
            migration.replace(['-', '_'], "").split_at(14).0
        ))
        .execute(conn)
        .unwrap();
        // Made later than every test user.
        diesel::sql_query(
            "INSERT INTO users (id, name, role, created_at) VALUES ('u-legacy', 'Bob', 'user', 9000000000000000)",
        )
        .execute(conn)
        .unwrap();
    })
    .await;
    let migrate = std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .arg("migrate")
        .env("DATABASE_URL", app.db.url.as_str())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&migrate.stderr).into_owned();
    assert!(migrate.status.success(), "{said}");
    assert!(
        said.contains(r#"user "Bob" differs only in case from "bob""#)
            && said.contains("onejob users rename Bob <new-name>"),
        "{said}"
    );
    let folded: Vec<(String, Option<String>)> = app
        .with_conn(|conn| {
            users::table
                .filter(users::name.eq_any(["bob", "Bob"]))
                .order(users::created_at)
                .select((users::name, users::name_folded))
                .load(conn)
                .unwrap()
        })
        .await;
    assert_eq!(
        folded,
        vec![("bob".into(), Some("bob".into())), ("Bob".into(), None)],
        "the earlier user keeps the name"
    );
    app.with_conn(|conn| onejob::store::users::rename_user(conn, "Bob", "bob-2").unwrap())
        .await;
    let clashes = app
        .with_conn(|conn| onejob::store::users::case_clashes(conn).unwrap())
        .await;
    assert!(clashes.is_empty(), "{clashes:?}");
}
