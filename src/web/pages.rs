//! Server-rendered pages (askama). For now: the front page and the problem-type
//! descriptions that `type` URIs point at.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use askama::Template;

use super::error::{ApiError, ProblemType};
use super::AppState;

#[derive(Template)]
#[template(path = "home.html")]
struct HomePage<'a> {
    tasks: Vec<(&'a str, String)>,
}

pub async fn home(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let tasks = state
        .config
        .tasks
        .iter()
        .map(|t| (t.name.as_str(), t.providers.join(" → ")))
        .collect();
    render(&HomePage { tasks })
}

#[derive(Template)]
#[template(path = "problem.html")]
struct ProblemPage {
    slug: &'static str,
    status: u16,
    title: &'static str,
    description: &'static str,
}

/// `GET /problems/{slug}`: what a problem `type` means.
pub async fn problem(path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let problem = ProblemType::from_slug(&path).ok_or_else(ApiError::not_found)?;
    let (slug, status, title, description) = problem.describe();
    render(&ProblemPage {
        slug,
        status: status.as_u16(),
        title,
        description,
    })
}

pub async fn stylesheet() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .body(include_str!("../../static/style.css"))
}

fn render(page: &impl Template) -> Result<HttpResponse, ApiError> {
    let html = page.render().map_err(|e| {
        tracing::error!(error = %e, "template rendering failed");
        ApiError::internal()
    })?;
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(html))
}
