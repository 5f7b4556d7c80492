//! The console's Users page, as an admin uses it.

use serde_json::{json, Value};

use crate::support::db::*;
use crate::support::harness::{spawn_app, FormClient, TestBackend};
use crate::support::webdriver::Browser;

/// Applies `action` to the user called `name` from their row of the Users
/// page, with `reason`, and waits for the answer; returns its path.
async fn act_on_user(browser: &Browser, name: &str, action: &str, reason: &str) -> String {
    let row = format!("tr.user-row[data-user='{name}']");
    browser
        .select(&format!("{row} select[name=action]"), action)
        .await;
    browser
        .fill(&format!("{row} input[name=reason]"), reason)
        .await;
    browser
        .click_and_wait(&format!("{row} button"), |p| p.starts_with("/admin/users"))
        .await
}

/// Asserts that `secret` is nowhere in the page, nor in the page's web
/// storage (where htmx would keep its history cache).
async fn assert_not_kept(browser: &Browser, secret: &str) {
    let source = browser.client.source().await.unwrap();
    assert!(
        !source.contains(secret),
        "the password is still in the page at {}",
        browser.path().await
    );
    let stored = browser
        .client
        .execute(
            "const found = [];
             for (const store of [localStorage, sessionStorage]) {
               for (let i = 0; i < store.length; i++) {
                 const key = store.key(i);
                 if ((key + store.getItem(key)).includes(arguments[0])) found.push(key);
               }
             }
             return found;",
            vec![json!(secret)],
        )
        .await
        .unwrap();
    assert_eq!(stored, json!([]), "the password is kept in web storage");
}

/// The Users page's rows: (name, role, disabled, tokens) each.
async fn listed_users(browser: &Browser) -> Value {
    browser
        .eval(
            "return [...document.querySelectorAll('tr.user-row')].map(row => [
               row.dataset.user,
               row.querySelector('td[data-label=Role]').textContent.trim(),
               row.querySelector('td[data-label=State]').textContent.trim(),
               row.querySelector('td[data-label=Tokens]').textContent.trim(),
             ]);",
        )
        .await
}

async fn an_admin_adds_resets_disables_enables_promotes_and_revokes_on_the_users_page(
    backend: TestBackend,
) {
    let app = spawn_app(backend).await;
    app.set_password("ada", "ada-pw").await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.sign_in(&app, "ada", "ada-pw").await;
    browser.goto(&app, "/admin").await;
    let mark = browser.mark_content().await;
    browser.click_link("Users").await;
    browser
        .wait_for_fresh_content(&mark, |p| p == "/admin/users")
        .await;
    assert_eq!(
        listed_users(&browser).await,
        json!([
            ["ada", "admin", "active", "1"],
            ["alice", "user", "active", "1"],
            ["bob", "user", "active", "1"],
            ["sue", "support", "active", "1"],
        ])
    );

    // Add a support user: the password is shown once, on the answer page.
    browser.fill("form.add-user input[name=name]", "zoe").await;
    browser
        .select("form.add-user select[name=role]", "support")
        .await;
    browser
        .fill("form.add-user input[name=reason]", "new support hire")
        .await;
    browser
        .click_and_wait("form.add-user button", |p| p == "/admin/users")
        .await;
    assert_eq!(
        browser.text_of("#user-done h1").await,
        "added zoe as support"
    );
    let password = browser.text_of("#new-password").await;
    assert_eq!(password.len(), 20, "a generated password: {password:?}");
    let zoe = user_row(&app, "zoe").await.expect("zoe is stored");
    assert_eq!((zoe.role.as_str(), zoe.disabled_at), ("support", None));
    let hash = zoe.password_hash.clone().expect("zoe has a password");
    assert!(
        hash.starts_with("$argon2id$") && !hash.contains(&password),
        "only the password's hash is stored"
    );
    // Back to the list: the password is gone from the page and is kept
    // nowhere in the browser; going Back does not bring it again.
    browser
        .click_and_wait("#user-done a.button", |p| p == "/admin/users")
        .await;
    assert_eq!(
        browser
            .count("tr.user-row[data-user=zoe][data-role=support]")
            .await,
        1
    );
    assert_not_kept(&browser, &password).await;
    let mark = browser.mark_content().await;
    browser.client.back().await.unwrap();
    browser
        .wait_for_fresh_content(&mark, |p| p == "/admin/users")
        .await;
    assert_eq!(browser.count("#new-password").await, 0);
    assert_eq!(browser.count("tr.user-row").await, 5, "the list, again");
    assert_not_kept(&browser, &password).await;

    // The shown password is zoe's: she signs in with it. She is support:
    // the console opens, the Users page refuses her with a readable page.
    browser.sign_out().await;
    browser.sign_in(&app, "zoe", &password).await;
    browser.goto(&app, "/admin").await;
    assert_eq!(browser.text_of("main h1").await, "Console");
    assert_eq!(browser.count("a[href='/admin/users']").await, 0);
    browser.goto(&app, "/admin/users").await;
    assert_eq!(browser.text_of("main h1").await, "Not allowed");
    let refusal = browser.text_of("main").await;
    assert!(
        refusal.contains("This is for admins.") && refusal.contains("HTTP 403"),
        "{refusal}"
    );
    assert_eq!(browser.count("tr.user-row").await, 0, "no user is listed");
    browser.goto(&app, "/jobs/new").await;
    browser.sign_out().await;

    // Reset zoe's password: a new one is shown once; it works, the old
    // one does not.
    browser.sign_in(&app, "ada", "ada-pw").await;
    browser.goto(&app, "/admin/users").await;
    act_on_user(&browser, "zoe", "reset-password", "forgot her password").await;
    assert_eq!(
        browser.text_of("#user-done h1").await,
        "new password for zoe; their sessions ended"
    );
    let new_password = browser.text_of("#new-password").await;
    assert_eq!(new_password.len(), 20);
    assert_ne!(new_password, password);
    browser.assert_fits_at_each_width("user-done", false).await;
    let stored = user_row(&app, "zoe").await.unwrap().password_hash.unwrap();
    assert_ne!(stored, hash, "a new hash is stored");
    FormClient::new(&app).sign_in("zoe", &new_password).await;
    let old = FormClient::new(&app);
    let page = old.get("/login").await.text().await.unwrap();
    let csrf = crate::support::harness::hidden_value(&page, "csrf");
    let refused = old
        .post_form(
            "/login",
            &[("name", "zoe"), ("password", &password), ("csrf", &csrf)],
        )
        .await;
    assert_ne!(refused.status(), 303, "the old password no longer signs in");
    browser
        .click_and_wait("#user-done a.button", |p| p == "/admin/users")
        .await;
    assert_not_kept(&browser, &new_password).await;

    // Disable bob, then enable him again.
    assert_eq!(
        act_on_user(&browser, "bob", "disable", "left the team").await,
        "/admin/users"
    );
    assert_eq!(
        browser
            .attr_of("tr.user-row[data-user=bob]", "data-disabled")
            .await
            .as_deref(),
        Some("true")
    );
    assert_eq!(
        browser
            .text_of("tr.user-row[data-user=bob] td[data-label=State]")
            .await,
        "disabled"
    );
    assert!(user_row(&app, "bob").await.unwrap().disabled_at.is_some());
    assert_eq!(
        browser
            .count("tr.user-row[data-user=bob] option[value=enable]")
            .await,
        1,
        "a disabled user can be enabled"
    );
    act_on_user(&browser, "bob", "enable", "back from leave").await;
    assert_eq!(
        browser
            .attr_of("tr.user-row[data-user=bob]", "data-disabled")
            .await
            .as_deref(),
        Some("false")
    );
    assert_eq!(user_row(&app, "bob").await.unwrap().disabled_at, None);

    // Make alice support.
    act_on_user(&browser, "alice", "role-support", "joined the support team").await;
    assert_eq!(
        browser
            .attr_of("tr.user-row[data-user=alice]", "data-role")
            .await
            .as_deref(),
        Some("support")
    );
    assert_eq!(user_row(&app, "alice").await.unwrap().role, "support");

    // Revoke alice's API tokens: her token stops working.
    assert_eq!(token_count(&app, "alice").await, 1);
    assert_eq!(
        app.get(&app.alice.token, "/api/v1/jobs").await.status(),
        200
    );
    act_on_user(&browser, "alice", "revoke-tokens", "laptop lost").await;
    assert_eq!(token_count(&app, "alice").await, 0);
    assert_eq!(
        app.get(&app.alice.token, "/api/v1/jobs").await.status(),
        401
    );
    assert_eq!(
        listed_users(&browser).await,
        json!([
            ["ada", "admin", "active", "1"],
            ["alice", "support", "active", "0"],
            ["bob", "user", "active", "1"],
            ["sue", "support", "active", "1"],
            ["zoe", "support", "active", "0"],
        ])
    );

    // Each action is audited as ada's, on its user, with its reason.
    let audit = user_audit(&app).await;
    let expected = [
        ("add_user", "zoe", "added zoe as support: new support hire"),
        (
            "reset_password",
            "zoe",
            "new password for zoe; their sessions ended: forgot her password",
        ),
        ("disable_user", "bob", "disabled bob: left the team"),
        ("enable_user", "bob", "enabled bob: back from leave"),
        (
            "set_role",
            "alice",
            "alice is now support: joined the support team",
        ),
        (
            "revoke_tokens",
            "alice",
            "revoked 1 API token(s) of alice: laptop lost",
        ),
    ];
    let expected: Vec<UserAudit> = expected
        .iter()
        .map(|(action, subject, reason)| {
            (
                "ada".to_owned(),
                (*action).to_owned(),
                (*subject).to_owned(),
                (*reason).to_owned(),
            )
        })
        .collect();
    assert_eq!(audit, expected);

    // The longest name allowed, with nowhere to break it, still fits.
    let longest = "w".repeat(64);
    app.with_conn(move |conn| {
        onejob::store::users::add_user(conn, &longest, onejob::domain::Role::User).map(drop)
    })
    .await
    .unwrap();
    browser.goto(&app, "/admin/users").await;
    browser
        .assert_fits_at_each_width("users", backend == TestBackend::Sqlite)
        .await;
    // So does its owner's own name in the page header.
    app.set_password(&"w".repeat(64), "long-pw").await;
    browser.sign_out().await;
    browser.sign_in(&app, &"w".repeat(64), "long-pw").await;
    browser
        .assert_fits_at_each_width("long-name", backend == TestBackend::Sqlite)
        .await;
    browser.close().await;
}

on_both_backends!(an_admin_adds_resets_disables_enables_promotes_and_revokes_on_the_users_page,);
