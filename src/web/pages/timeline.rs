//! The job page's timeline: one bar per attempt on a shared time axis, drawn
//! as inline SVG on the server so a race can be seen at a glance.

use crate::app::Attempt;
use crate::domain::{AttemptState, RaceResult};

/// SVG user units; the drawing scales to the page width.
const WIDTH: f64 = 640.0;
const LABEL_WIDTH: f64 = 120.0;
const ROW_HEIGHT: f64 = 28.0;
const TOP: f64 = 8.0;
const AXIS_HEIGHT: f64 = 22.0;

#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    pub label_y: f64,
    pub y: f64,
    pub x: f64,
    pub width: f64,
    /// A CSS class: won, lost, failed, unknown, abandoned, running, queued.
    pub class: &'static str,
    /// Where the soft timeout fell, if it is on the axis.
    pub timeout_x: Option<f64>,
    /// Tooltip text.
    pub title: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    pub width: f64,
    pub height: f64,
    pub bar_height: f64,
    pub plot_left: f64,
    pub axis_y: f64,
    pub axis_end_label: String,
    pub bars: Vec<Bar>,
}

fn class_of(attempt: &Attempt) -> &'static str {
    match (attempt.state, attempt.outcome) {
        (_, Some(RaceResult::Won)) => "won",
        (_, Some(RaceResult::Lost)) => "lost",
        (AttemptState::Failed, _) => "failed",
        (AttemptState::Unknown, _) => "unknown",
        (AttemptState::Abandoned, _) => "abandoned",
        (AttemptState::Running, _) => "running",
        _ => "queued",
    }
}

fn seconds(ms: i64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// Lays out the attempts of a job created at `created_at`, as of `now`.
pub fn layout(created_at: i64, attempts: &[Attempt], now: i64) -> Timeline {
    let end_of = |a: &Attempt| {
        a.finished_at
            .unwrap_or(if a.state.is_live() || a.state == AttemptState::Abandoned {
                now
            } else {
                a.started_at.unwrap_or(a.created_at)
            })
    };
    let end = attempts
        .iter()
        .map(end_of)
        .chain([created_at + 1])
        .max()
        .unwrap_or(created_at + 1);
    let span = (end - created_at).max(1) as f64;
    let plot = WIDTH - LABEL_WIDTH - 8.0;
    let x_of = |t: i64| LABEL_WIDTH + ((t - created_at).max(0) as f64 / span) * plot;
    let bars = attempts
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let start = a.started_at.unwrap_or(a.created_at);
            let stop = end_of(a).max(start);
            let y = TOP + i as f64 * ROW_HEIGHT;
            let class = class_of(a);
            let mut title = format!("attempt {} on {}: {}", a.number, a.provider, class);
            if let Some(not_before) = a.not_before {
                title.push_str(&format!(
                    ", a retry not sent before +{}",
                    seconds(not_before - created_at)
                ));
            }
            if a.started_at.is_some() {
                title.push_str(&format!(", sent at +{}", seconds(start - created_at)));
            }
            if let Some(finished) = a.finished_at {
                title.push_str(&format!(
                    ", answered at +{}",
                    seconds(finished - created_at)
                ));
            }
            Bar {
                label: format!("#{} {}", a.number, a.provider),
                label_y: y + ROW_HEIGHT * 0.6,
                y: y + 4.0,
                x: x_of(start),
                width: (x_of(stop) - x_of(start)).max(3.0),
                class,
                timeout_x: a.timeout_at.filter(|t| *t <= end).map(x_of),
                title,
            }
        })
        .collect::<Vec<_>>();
    let rows_height = TOP + attempts.len().max(1) as f64 * ROW_HEIGHT;
    Timeline {
        width: WIDTH,
        height: rows_height + AXIS_HEIGHT,
        bar_height: ROW_HEIGHT - 8.0,
        plot_left: LABEL_WIDTH,
        axis_y: rows_height + 14.0,
        axis_end_label: format!("+{}", seconds(end - created_at)),
        bars,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AttemptId, JobId, UserId};

    fn attempt(
        number: i32,
        started: i64,
        finished: Option<i64>,
        state: AttemptState,
        outcome: Option<RaceResult>,
    ) -> Attempt {
        Attempt {
            id: AttemptId::new(),
            job_id: JobId::new(),
            owner_id: UserId::new(),
            number,
            provider: format!("p{number}"),
            state,
            outcome,
            version_read: Some(0),
            lease_owner: None,
            lease_expires_at: None,
            created_at: started,
            started_at: Some(started),
            timeout_at: Some(started + 500),
            finished_at: finished,
            error: None,
            sent_at: Some(started),
            not_before: None,
        }
    }

    #[test]
    fn a_reverse_order_race_shows_the_loser_ending_after_the_winner() {
        let attempts = [
            attempt(
                1,
                0,
                Some(3000),
                AttemptState::Succeeded,
                Some(RaceResult::Lost),
            ),
            attempt(
                2,
                1000,
                Some(1300),
                AttemptState::Succeeded,
                Some(RaceResult::Won),
            ),
        ];
        let t = layout(0, &attempts, 5000);
        let (loser, winner) = (&t.bars[0], &t.bars[1]);
        assert_eq!((loser.class, winner.class), ("lost", "won"));
        assert!(loser.x < winner.x, "the loser started first");
        assert!(
            loser.x + loser.width > winner.x + winner.width,
            "and answered last"
        );
        assert_eq!(t.axis_end_label, "+3.0 s");
        assert!(loser.timeout_x.is_some());
    }

    #[test]
    fn live_and_unknown_attempts_extend_to_now() {
        let attempts = [attempt(1, 0, None, AttemptState::Unknown, None)];
        let t = layout(0, &attempts, 2000);
        let bar = &t.bars[0];
        assert_eq!(bar.class, "unknown");
        assert!(
            (bar.x + bar.width - (WIDTH - 8.0)).abs() < 0.01,
            "reaches the right edge"
        );
    }

    #[test]
    fn bars_stay_inside_the_drawing() {
        let attempts = [attempt(1, 10, Some(10), AttemptState::Failed, None)];
        let t = layout(0, &attempts, 10);
        let bar = &t.bars[0];
        assert!(bar.x >= LABEL_WIDTH && bar.x + bar.width <= WIDTH);
        assert!(bar.width >= 3.0, "an instant failure is still visible");
    }
}
