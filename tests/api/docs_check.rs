//! The documentation cannot point at what is not there, nor leave out a
//! setting: every backticked repository path in a `*.md` file exists, and
//! every key the configuration file accepts is listed in
//! docs/configuration.md, in its section.
//!
//! A backticked span is a repository path when it has no spaces and its
//! first segment is an entry at the repository's root (`src/…`,
//! `tests/…`, `.ci/run`, `Cargo.toml`); `target/`, which a build makes, is
//! not. A `:line` suffix is allowed. The keys are the configuration file's
//! own: each section is given a key it does not know, and the parser's
//! refusal lists the keys it does.

use std::path::{Path, PathBuf};

use onejob::config::{Config, ConfigError, Environment};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap()
}

/// The names at the repository's root, but those a build or git makes.
fn root_entries() -> Vec<String> {
    std::fs::read_dir(root())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "target" && name != ".git")
        .collect()
}

/// Every `*.md` file of the repository, relative to its root, sorted.
fn markdown_files() -> Vec<String> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>, depth: usize) {
        assert!(depth < 16, "{} is nested too deep", dir.display());
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if name == "target" || name == ".git" {
                continue;
            }
            if path.is_dir() {
                walk(&path, found, depth + 1);
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(root(), &mut found, 0);
    let mut files: Vec<String> = found
        .iter()
        .map(|p| p.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    files.sort();
    files
}

/// The inline code spans of a Markdown text, outside fenced blocks, with
/// the line each starts on.
fn code_spans(text: &str) -> Vec<(usize, String)> {
    let mut spans = Vec::new();
    let mut in_fence = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        spans.extend(
            line.split('`')
                .skip(1)
                .step_by(2)
                .map(|span| (i + 1, span.to_owned())),
        );
    }
    spans
}

/// The repository path a code span names, if it names one.
fn repository_path<'a>(span: &'a str, roots: &[String]) -> Option<&'a str> {
    let path = match span.rsplit_once(':') {
        Some((path, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => path,
        _ => span,
    };
    let plain = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b));
    let first = path.split('/').next()?;
    (plain && !path.is_empty() && roots.iter().any(|r| r == first)).then_some(path)
}

/// `file:line: `path`` for each repository path of `text` that does not exist.
fn broken_paths(file: &str, text: &str, roots: &[String]) -> Vec<String> {
    code_spans(text)
        .into_iter()
        .filter_map(|(line, span)| {
            let path = repository_path(&span, roots)?;
            (!root().join(path).exists()).then(|| format!("{file}:{line}: `{path}` does not exist"))
        })
        .collect()
}

/// The keys a section of the configuration file accepts: what the parser
/// lists when `toml` (which puts an unknown key first in the section) is
/// refused.
fn accepted_keys(toml: &str) -> Vec<String> {
    let message = match Config::from_toml(toml, "docs_check", &Environment::from_pairs([])) {
        Err(ConfigError::Parse { source, .. }) => source.message().to_owned(),
        other => panic!("{toml:?} was not refused for its unknown key: {other:?}"),
    };
    let (_, expected) = message
        .split_once("expected")
        .unwrap_or_else(|| panic!("{toml:?}: the refusal lists no keys: {message}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

const UNKNOWN: &str = "zz_not_a_setting = 1\n";

/// Each section of the file: its heading on the configuration page, and a
/// file whose first key in that section is unknown.
fn sections() -> Vec<(&'static str, String)> {
    let task = "[[tasks]]\nname = \"t\"\nproviders = [\"p\"]\n";
    vec![
        ("## `[server]`", format!("[server]\n{UNKNOWN}")),
        ("## `[database]`", format!("[database]\n{UNKNOWN}")),
        ("## `[worker]`", format!("[worker]\n{UNKNOWN}")),
        ("## `[retention]`", format!("[retention]\n{UNKNOWN}")),
        ("## `[webhooks]`", format!("[webhooks]\n{UNKNOWN}")),
        ("## `[ledger]`", format!("[ledger]\n{UNKNOWN}")),
        (
            "## `[ledger]`",
            format!("[[ledger.prices]]\nprovider = \"p\"\ninput = 1\noutput = 1\n{UNKNOWN}"),
        ),
        ("## `[[providers]]`", format!("[[providers]]\n{UNKNOWN}")),
        ("## `[[tasks]]`", format!("[[tasks]]\n{UNKNOWN}")),
        (
            "## `[[tasks]]`",
            format!("{task}[[tasks.golden]]\n{UNKNOWN}"),
        ),
    ]
}

/// `section: key` for each key the file accepts that `page` does not list,
/// backticked, in the section's part of the page (up to the next `## `).
fn unlisted_settings(page: &str) -> Vec<String> {
    let top = accepted_keys(UNKNOWN);
    assert!(top.len() >= 6, "{top:?}");
    let mut missing: Vec<String> = top
        .iter()
        .filter(|section| {
            !page.contains(&format!("`[{section}]`")) && !page.contains(&format!("`[[{section}]]`"))
        })
        .map(|section| format!("the section {section}"))
        .collect();
    for (heading, toml) in sections() {
        let Some(start) = page.find(&format!("\n{heading}\n")) else {
            missing.push(format!("the heading {heading}"));
            continue;
        };
        let rest = &page[start + 1..];
        let end = rest[3..].find("\n## ").map_or(rest.len(), |at| at + 3);
        let part = &rest[..end];
        for key in accepted_keys(&toml) {
            // A key is listed as `key`, or a table of them as `[[tasks.key]]`.
            if !part.contains(&format!("`{key}`")) && !part.contains(&format!(".{key}]]`")) {
                missing.push(format!("{heading}: `{key}`"));
            }
        }
    }
    missing
}

#[test]
fn every_backticked_path_in_the_docs_exists() {
    let roots = root_entries();
    let files = markdown_files();
    for file in [
        "README.md",
        "ARCHITECTURE.md",
        "docs/design.md",
        "docs/api.md",
    ] {
        assert!(files.iter().any(|f| f == file), "{file} is read: {files:?}");
    }
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in &files {
        let text = read(file);
        checked += code_spans(&text)
            .iter()
            .filter(|(_, span)| repository_path(span, &roots).is_some())
            .count();
        broken.extend(broken_paths(file, &text, &roots));
    }
    assert!(checked >= 40, "only {checked} paths were found to check");
    assert!(
        broken.is_empty(),
        "the docs name paths that do not exist:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_setting_is_listed_in_docs_configuration() {
    let missing = unlisted_settings(&read("docs/configuration.md"));
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not list:\n{}",
        missing.join("\n")
    );
}

/// The checks are not vacuous: a path that does not exist, and a setting
/// taken off the page, are each caught, with where.
#[test]
fn a_broken_path_and_an_unlisted_setting_are_caught() {
    let roots = root_entries();
    let readme = read("README.md");
    assert_eq!(
        broken_paths("README.md", &readme, &roots),
        Vec::<String>::new()
    );
    let broken = readme.replacen("`scripts/sdk_check.py`", "`scripts/sdk_checks.py`", 1);
    assert!(broken != readme, "the README names scripts/sdk_check.py");
    let found = broken_paths("README.md", &broken, &roots);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("README.md:")
            && found[0].ends_with("`scripts/sdk_checks.py` does not exist"),
        "{}",
        found[0]
    );
    let fictional = "See `tests/api/providers.rs` and `src/config/default_config.toml:3`.";
    assert_eq!(
        broken_paths("x.md", fictional, &roots),
        vec!["x.md:1: `tests/api/providers.rs` does not exist"]
    );

    let page = read("docs/configuration.md");
    let row = page
        .lines()
        .find(|line| line.starts_with("| `max_response_bytes` |"))
        .expect("the page lists max_response_bytes");
    let without = page.replacen(&format!("{row}\n"), "", 1);
    assert_eq!(
        unlisted_settings(&without),
        vec!["## `[[providers]]`: `max_response_bytes`"]
    );
}
