//! Every configuration example the documentation shows is run by the
//! build: each ```toml block in README.md and docs/*.md is parsed as onejob
//! parses a file and the server is started on it (on both backends); a
//! block meant to be refused must be refused with the message it shows.
//!
//! A block is a whole configuration file unless the HTML comment right
//! above it (invisible on the rendered page) says otherwise:
//!
//! - `<!-- example: adds to the built-in configuration -->`: appended to
//!   `src/config/default_config.toml` (a section to add to the file);
//! - `<!-- example: adds to the example above -->`: appended to the file's
//!   previous example, as it was composed;
//! - `<!-- example: refused with the message below -->`: a whole file that
//!   must be refused at start; the next fenced block is the message shown,
//!   which the refusal must contain (`…` stands for any text).
//!
//! The environment variables a block names (`api_key_env`,
//! `callback_secret_env`) are given a value, as the reader would set them;
//! the database and the address are the test's own, as `--database-url`
//! and `--bind` would set them (they win over the file).

use std::net::TcpListener;
use std::path::Path;

use onejob::config::{Config, ConfigError, Environment, DEFAULT_CONFIG_TOML};
use onejob::startup::{open_store, Application};

use crate::support::harness::{TestBackend, TestDb};

/// What the comment above a block says it is.
#[derive(Debug, Clone, PartialEq)]
enum Marker {
    Complete,
    AddsToBuiltIn,
    AddsToAbove,
    Refused { message: String },
}

/// One ```toml block, composed into the whole file it stands for.
#[derive(Debug, Clone)]
struct Example {
    /// `README.md:301`: the file and the line of the opening fence.
    origin: String,
    marker: Marker,
    /// The configuration file the block stands for.
    toml: String,
}

/// The files whose examples are run, relative to the crate.
fn documentation() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn read(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
}

/// A fenced block: its info string, first line number (of the fence) and text.
struct Fence {
    info: String,
    line: usize,
    body: String,
    /// The last non-blank line before the fence.
    above: Option<String>,
}

fn fences(text: &str) -> Result<Vec<Fence>, String> {
    let mut found = Vec::new();
    let mut lines = text.lines().enumerate();
    let mut above: Option<String> = None;
    while let Some((i, line)) = lines.next() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            let mut body = String::new();
            let mut closed = false;
            for (_, inner) in lines.by_ref() {
                if inner.trim_start().starts_with("```") {
                    closed = true;
                    break;
                }
                body.push_str(inner);
                body.push('\n');
            }
            if !closed {
                return Err(format!("line {}: a fenced block is never closed", i + 1));
            }
            found.push(Fence {
                info: info.trim().to_owned(),
                line: i + 1,
                body,
                above: above.take(),
            });
        } else if !line.trim().is_empty() {
            above = Some(line.trim().to_owned());
        }
    }
    Ok(found)
}

fn marker_of(above: Option<&str>) -> Result<Option<Marker>, String> {
    let Some(comment) = above
        .and_then(|l| l.strip_prefix("<!--"))
        .and_then(|l| l.strip_suffix("-->"))
    else {
        return Ok(None);
    };
    let Some(what) = comment.trim().strip_prefix("example:") else {
        return Ok(None);
    };
    match what.trim() {
        "adds to the built-in configuration" => Ok(Some(Marker::AddsToBuiltIn)),
        "adds to the example above" => Ok(Some(Marker::AddsToAbove)),
        "refused with the message below" => Ok(Some(Marker::Refused {
            message: String::new(),
        })),
        other => Err(format!("an example marker onejob does not know: {other:?}")),
    }
}

/// The examples of one file, composed.
fn examples_in(file: &str, text: &str) -> Result<Vec<Example>, String> {
    let fences = fences(text).map_err(|e| format!("{file}: {e}"))?;
    let mut examples: Vec<Example> = Vec::new();
    for (i, fence) in fences.iter().enumerate() {
        if fence.info != "toml" {
            continue;
        }
        let origin = format!("{file}:{}", fence.line);
        let marker = marker_of(fence.above.as_deref())
            .map_err(|e| format!("{origin}: {e}"))?
            .unwrap_or(Marker::Complete);
        let (marker, toml) = match marker {
            Marker::Complete => (Marker::Complete, fence.body.clone()),
            Marker::AddsToBuiltIn => (
                Marker::AddsToBuiltIn,
                format!("{DEFAULT_CONFIG_TOML}\n{}", fence.body),
            ),
            Marker::AddsToAbove => {
                let above = examples
                    .last()
                    .ok_or_else(|| format!("{origin}: adds to an example above, but none is"))?;
                (
                    Marker::AddsToAbove,
                    format!("{}\n{}", above.toml, fence.body),
                )
            }
            Marker::Refused { .. } => {
                let shown = fences
                    .get(i + 1)
                    .filter(|next| next.info != "toml")
                    .ok_or_else(|| {
                        format!("{origin}: a refused example needs the message below it")
                    })?;
                (
                    Marker::Refused {
                        message: shown.body.trim().to_owned(),
                    },
                    fence.body.clone(),
                )
            }
        };
        examples.push(Example {
            origin,
            marker,
            toml,
        });
    }
    Ok(examples)
}

/// A value for every environment variable the file names.
fn environment_for(toml: &str) -> Environment {
    let mut names = Vec::new();
    for line in toml.lines() {
        for key in [
            "api_key_env",
            "bearer_token_env",
            "callback_secret_env",
            "signing_key_env",
        ] {
            let Some(rest) = line.trim().strip_prefix(key) else {
                continue;
            };
            let Some(rest) = rest.trim_start().strip_prefix('=') else {
                continue;
            };
            if let Some(name) = rest
                .trim()
                .strip_prefix('"')
                .and_then(|r| r.split('"').next())
            {
                names.push(name.to_owned());
            }
        }
    }
    // A Bedrock provider reads the standard AWS variables.
    if toml.contains("kind = \"bedrock\"") {
        names.extend(
            ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"].map(str::to_owned),
        );
    }
    Environment::from_pairs(names.iter().map(|n| {
        (
            n.as_str(),
            "an-example-secret-of-more-than-32-bytes-0123456789",
        )
    }))
}

fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `said` contains the message `shown`, where `…` stands for any text.
fn shows(said: &str, shown: &str) -> bool {
    let said = flat(said);
    let mut rest = said.as_str();
    for piece in flat(shown)
        .split('…')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

/// Parses each example as onejob parses a file: the configuration of those
/// that must start; a problem for each one out of step with the code.
fn parse_examples(examples: &[Example]) -> (Vec<(String, Config)>, Vec<String>) {
    let mut accepted = Vec::new();
    let mut problems = Vec::new();
    for example in examples {
        let parsed = Config::from_toml(
            &example.toml,
            &example.origin,
            &environment_for(&example.toml),
        );
        match (&example.marker, parsed) {
            (Marker::Refused { message }, Ok(_)) => problems.push(format!(
                "{}: meant to be refused ({message:?}), but onejob accepts it",
                example.origin
            )),
            (Marker::Refused { message }, Err(error)) => {
                if !shows(&error.to_string(), message) {
                    problems.push(format!(
                        "{}: refused, but not with the message shown:\n  shown: {message}\n  said:  {error}",
                        example.origin
                    ));
                }
            }
            (_, Ok(config)) => accepted.push((example.origin.clone(), config)),
            (_, Err(error)) => {
                problems.push(format!("{}: refused at start: {error}", example.origin))
            }
        }
    }
    (accepted, problems)
}

/// Every example of every documentation file.
fn every_example() -> Vec<Example> {
    let mut all = Vec::new();
    for file in documentation() {
        all.extend(examples_in(&file, &read(&file)).unwrap_or_else(|e| panic!("{e}")));
    }
    all
}

#[test]
fn every_configuration_example_in_the_docs_parses_or_is_refused_as_shown() {
    let examples = every_example();
    for file in [
        "docs/providers.md",
        "docs/configuration.md",
        "docs/deployment.md",
    ] {
        assert!(
            examples
                .iter()
                .any(|e| e.origin.starts_with(&format!("{file}:"))),
            "no example found in {file}"
        );
    }
    let (_, problems) = parse_examples(&examples);
    assert!(
        problems.is_empty(),
        "examples out of step with the code:\n{}",
        problems.join("\n")
    );
    assert!(
        examples
            .iter()
            .any(|e| matches!(e.marker, Marker::Refused { .. })),
        "the refused example is run too"
    );
}

/// The check is not vacuous: the configuration page's example, edited out
/// of step with the code (a misspelt key, a chain left without its golden
/// example, a refusal's message reworded), is caught, with its line.
#[test]
fn an_example_edited_out_of_step_with_the_code_is_caught() {
    let page = read("docs/configuration.md");
    let (_, problems) = parse_examples(&examples_in("docs/configuration.md", &page).unwrap());
    assert_eq!(problems, Vec::<String>::new(), "as written, it is in step");

    let misspelt = page.replacen("late_result_ms = ", "late_results_ms = ", 1);
    assert_ne!(misspelt, page);
    let (_, problems) = parse_examples(&examples_in("docs/configuration.md", &misspelt).unwrap());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("docs/configuration.md:")
            && problems[0].contains("refused at start")
            && problems[0].contains("late_results_ms"),
        "{}",
        problems[0]
    );

    let without_golden = page
        .replacen("\n[[tasks.golden]]", "\n# [[tasks.golden]]", 1)
        .replacen("\ninput = { text = ", "\n# input = { text = ", 1);
    assert_ne!(without_golden, page);
    let (_, problems) =
        parse_examples(&examples_in("docs/configuration.md", &without_golden).unwrap());
    assert!(
        problems.iter().any(|p| p.contains("no golden examples")),
        "{problems:?}"
    );

    let reworded = page.replacen("never fail over", "always fail over", 1);
    assert_ne!(reworded, page, "the refusal's message is on the page");
    let (_, problems) = parse_examples(&examples_in("docs/configuration.md", &reworded).unwrap());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("not with the message shown"),
        "{}",
        problems[0]
    );

    let unknown_marker = page.replacen(
        "<!-- example: adds to the built-in configuration -->",
        "<!-- example: adds to something -->",
        1,
    );
    assert!(examples_in("docs/configuration.md", &unknown_marker)
        .unwrap_err()
        .contains("an example marker onejob does not know"));
}

/// Each example that onejob accepts starts a server: migrated, listening
/// and ready, on the test's database.
async fn every_configuration_example_in_the_docs_starts_a_server(backend: TestBackend) {
    let (accepted, problems) = parse_examples(&every_example());
    assert!(problems.is_empty(), "{problems:?}");
    for (origin, config) in accepted {
        let db = TestDb::create(backend);
        let store = {
            let (url, config) = (db.url.clone(), config.clone());
            tokio::task::spawn_blocking(move || open_store(&url, &config))
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("{origin}: {e}"))
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let application = Application::build(config, store, listener)
            .await
            .unwrap_or_else(|e| panic!("{origin}: the server does not start: {e}"));
        let base = format!("http://127.0.0.1:{}", application.port());
        let server = tokio::spawn(application.run_until_stopped());
        for path in ["/healthz", "/readyz"] {
            let status = reqwest::get(format!("{base}{path}"))
                .await
                .unwrap_or_else(|e| panic!("{origin}: {path}: {e}"))
                .status();
            assert_eq!(status, 200, "{origin}: {path}");
        }
        server.abort();
        let _ = server.await;
    }
}

#[test]
fn a_refusal_shown_with_an_ellipsis_matches_any_text_there() {
    let error = ConfigError::Invalid {
        origin: "onejob.toml".into(),
        key: "tasks[0].golden".into(),
        message: "task \"t\" has fallback providers (b) but no golden examples".into(),
    };
    assert!(shows(
        &error.to_string(),
        "configuration …: `tasks[0].golden`: task \"t\" has … no golden examples"
    ));
    assert!(!shows(&error.to_string(), "`tasks[1].golden`"));
}

on_both_backends!(every_configuration_example_in_the_docs_starts_a_server);

/// Every screenshot the README and the docs show is in `docs/screenshots/`
/// at both widths, and a browser test takes it (into `target/screenshots/`,
/// from where it is copied after a page changes). The README links them as
/// `docs/screenshots/…`, a page under `docs/` as `screenshots/…`.
#[test]
fn every_screenshot_the_readme_shows_is_taken_by_a_browser_test() {
    let readme: String = documentation().iter().map(|file| read(file)).collect();
    let browser_tests = [
        "submit",
        "console",
        "users",
        "job_search",
        "usage",
        "traces",
    ]
    .iter()
    .map(|page| read(&format!("tests/api/browser/{page}.rs")))
    .collect::<String>()
        + &read("tests/api/browser_pages.rs");
    let mut shown: Vec<&str> = readme
        .split("screenshots/")
        .skip(1)
        .filter_map(|rest| rest.split(".png").next())
        .filter(|name| {
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        .collect();
    shown.sort();
    shown.dedup();
    assert!(shown.len() >= 16, "{shown:?}");
    for image in shown {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("docs/screenshots/{image}.png"));
        assert!(
            path.exists(),
            "README shows {image}.png, which is not there"
        );
        let (name, width) = image.rsplit_once('-').unwrap();
        assert!(["1280", "390"].contains(&width), "{image}");
        assert!(
            browser_tests.contains(&format!("\"{name}\"")),
            "no browser test takes the screenshot {name}"
        );
    }
}
