//! Rate-limited warnings: at most one log line per period for a recurring event, with the
//! number of occurrences it held back since the last line it let through.
//!
//! Owns: the counting and the period. Must not: log, read a clock or know what is being
//! throttled; the caller passes the time and writes the line (so a flood of refusals costs one
//! line per period, not one per refusal).

use std::time::{Duration, Instant};

/// One recurring warning's throttle: [`Throttle::allow`] says whether to log now.
#[derive(Debug, Clone)]
pub(crate) struct Throttle {
    period: Duration,
    /// When the last line was let through (`None`: never).
    last: Option<Instant>,
    /// Occurrences held back since then.
    suppressed: u64,
}

impl Throttle {
    /// At most one line per `period`.
    pub(crate) fn new(period: Duration) -> Self {
        Self {
            period,
            last: None,
            suppressed: 0,
        }
    }

    /// One occurrence at `now`: `Some(n)` to log it, `n` being how many were held back since
    /// the last line let through (to be said in the line); `None` to stay silent (it is counted).
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.period => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_with_the_count_held_back() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut t = Throttle::new(10 * s);
        assert_eq!(t.allow(t0), Some(0), "the first occurrence is logged");
        for i in 1..=500 {
            assert_eq!(t.allow(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(t.allow(t0 + 9 * s), None);
        assert_eq!(
            t.allow(t0 + 10 * s),
            Some(501),
            "the period is over: the count"
        );
        assert_eq!(t.allow(t0 + 11 * s), None);
        assert_eq!(t.allow(t0 + 30 * s), Some(1));
        assert_eq!(t.allow(t0 + 45 * s), Some(0), "nothing held back");
    }
}
