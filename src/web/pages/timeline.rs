//! The job page's timeline: one row per attempt on a shared time axis, so a
//! race can be seen at a glance. Each row is an HTML label (readable at any
//! width: beside its bar on a wide screen, above it on a phone) and a bar in
//! an inline SVG track that stretches to the row's width.

use crate::app::Attempt;
use crate::domain::{AttemptState, RaceResult, Timestamp};

/// The track's width in SVG user units; it is drawn stretched to the page.
pub const TRACK: f64 = 1000.0;
/// The narrowest bar drawn, so an instant failure is still seen.
const MIN_BAR: f64 = 6.0;

#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// `#1 sim-slow`.
    pub label: String,
    pub x: f64,
    pub width: f64,
    /// A CSS class and the word shown: won, lost, failed, unknown,
    /// abandoned, running, queued.
    pub class: &'static str,
    /// Where the soft timeout fell, if it is on the axis.
    pub timeout_x: Option<f64>,
    /// Tooltip text.
    pub title: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    pub track: f64,
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
pub fn layout(created_at: Timestamp, attempts: &[Attempt], now: Timestamp) -> Timeline {
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
    let x_of = |t: Timestamp| ((t - created_at).max(0) as f64 / span) * TRACK;
    let bars = attempts
        .iter()
        .map(|a| {
            let start = a.started_at.unwrap_or(a.created_at);
            let stop = end_of(a).max(start);
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
            let x = x_of(start).min(TRACK - MIN_BAR);
            Bar {
                label: format!("#{} {}", a.number, a.provider),
                x,
                width: (x_of(stop) - x).max(MIN_BAR),
                class,
                timeout_x: a.timeout_at.filter(|t| *t <= end).map(x_of),
                title,
            }
        })
        .collect::<Vec<_>>();
    Timeline {
        track: TRACK,
        axis_end_label: format!("+{}", seconds(end - created_at)),
        bars,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AttemptId, JobId, UserId};

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn attempt(
        number: i32,
        started: i64,
        finished: Option<i64>,
        state: AttemptState,
        outcome: Option<RaceResult>,
    ) -> Attempt {
        let started = at(started);
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
            finished_at: finished.map(at),
            error: None,
            sent_at: Some(started),
            not_before: None,
            error_kind: None,
            error_detail: None,
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
        let t = layout(at(0), &attempts, at(5000));
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
        let t = layout(at(0), &attempts, at(2000));
        let bar = &t.bars[0];
        assert_eq!(bar.class, "unknown");
        assert!(
            (bar.x + bar.width - TRACK).abs() < 0.01,
            "reaches the right edge"
        );
    }

    #[test]
    fn bars_stay_inside_the_drawing() {
        let attempts = [attempt(1, 10, Some(10), AttemptState::Failed, None)];
        let t = layout(at(0), &attempts, at(10));
        let bar = &t.bars[0];
        assert!(bar.x >= 0.0 && bar.x + bar.width <= TRACK);
        assert!(bar.width >= MIN_BAR, "an instant failure is still visible");
        assert_eq!(bar.label, "#1 p1", "the label is text beside the bar");
    }
}
