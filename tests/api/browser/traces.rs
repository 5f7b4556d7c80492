//! A traced job's page: the console's timeline of a job that failed over
//! and whose late answer lost agrees with the span tree its trace was
//! exported as (one row a provider call, in order, with its verdict), and
//! the two, side by side, are the picture in docs/tracing.md.

use crate::support::collector::brief_tree;
use crate::support::harness::TestBackend;
use crate::support::webdriver::Browser;
use crate::traces::failover_with_a_lost_race;

on_both_backends!(the_timeline_of_a_traced_job_agrees_with_its_span_tree);

/// A new password for `admin`, from `onejob users password`.
fn admin_password(traced: &crate::traces::FailoverTrace) -> String {
    let dir = traced.dir.path();
    crate::traces::onejob_command(
        dir,
        &dir.join("traced.toml"),
        traced.db.url.as_str(),
        &["users", "password", "admin"],
    )
    .trim()
    .to_owned()
}

async fn the_timeline_of_a_traced_job_agrees_with_its_span_tree(backend: TestBackend) {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let traced = failover_with_a_lost_race(backend).await;
    let base = traced.server.base.clone();
    browser.client.goto(&format!("{base}/login")).await.unwrap();
    browser.fill("input[name=name]", "admin").await;
    browser
        .fill("input[name=password]", &admin_password(&traced))
        .await;
    browser.click("form[action='/login'] button").await;
    browser.wait_for_path(|p| p == "/jobs/new").await;
    let page = format!("/jobs/{}", traced.job_id);
    browser.client.goto(&format!("{base}{page}")).await.unwrap();
    browser.wait_for_path(|p| p == page).await;

    // The timeline's rows, in order, as the page shows them.
    let rows = browser
        .eval(
            "return [...document.querySelectorAll('.tl-row')].map(r =>
               r.querySelector('.tl-label').textContent.replace(/\\s+/g, ' ').trim());",
        )
        .await;
    let rows: Vec<String> = serde_json::from_value(rows).unwrap();
    // The provider calls of the trace, in the attempts' order, with what
    // became of each.
    let job_spans = traced.job_spans();
    let mut calls: Vec<_> = job_spans
        .iter()
        .filter(|s| s.attr("gen_ai.operation.name").is_some())
        .collect();
    calls.sort_by_key(|s| s.int("onejob.attempt.number"));
    let verdict = |call: &crate::support::collector::Span| {
        job_spans
            .iter()
            .filter(|s| s.parent_span_id == call.span_id && s.name == "compare-and-swap")
            .map(|s| s.text("onejob.cas.verdict").to_owned())
            .next()
            .unwrap_or_else(|| call.text("onejob.attempt.outcome").to_owned())
    };
    let from_trace: Vec<String> = calls
        .iter()
        .map(|call| {
            format!(
                "#{} {} {}",
                call.int("onejob.attempt.number"),
                call.text("onejob.provider"),
                verdict(call)
            )
        })
        .collect();
    assert_eq!(
        rows, from_trace,
        "the timeline's rows are the trace's provider calls"
    );
    assert_eq!(
        from_trace,
        ["#1 broken failed", "#2 slow lost", "#3 fast won"]
    );

    // The picture: the page, with the decoded span tree beside it.
    let tree = brief_tree(&job_spans);
    browser
        .eval(&format!(
            "const pre = document.createElement('pre');
             pre.id = 'span-tree';
             pre.textContent = 'The job\\'s trace, as the collector decoded it\\n\\n' + {tree};
             pre.style.cssText = 'position:fixed;top:0;right:0;width:46%;height:100%;margin:0;\
               padding:12px;overflow:auto;background:#fbfbf8;border-left:1px solid #bbb;\
               font-size:11px;line-height:1.45;white-space:pre-wrap;z-index:10';
             document.body.appendChild(pre);
             document.body.style.marginRight = '47%';
             return true;",
            tree = serde_json::to_string(&tree).unwrap()
        ))
        .await;
    browser.screenshot_at("trace-failover", 1280, 900).await;
    browser.close().await;
}
