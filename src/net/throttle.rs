//! A throttle for log lines that a peer can make the node repeat: the first line for a key in
//! each period is written, the rest are counted, and the next line written carries that count.
//!
//! Owns: deciding whether a line for a key may be written now, and how many were held back.
//! Must not: log, count metrics, read a clock or know what the keys mean (its callers do). A
//! single recurring warning uses the key `()`.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Entries kept before old ones are swept, so a flood of distinct keys cannot grow the map
/// without bound.
const SWEEP_AT: usize = 4096;

/// One line per key per period.
#[derive(Debug)]
pub(crate) struct Throttle<K> {
    period: Duration,
    keys: Mutex<HashMap<K, Slot>>,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// When the last line for this key was written.
    written: Instant,
    /// Lines held back since.
    held: u64,
}

impl<K: Hash + Eq + Clone> Throttle<K> {
    /// One line per key per `period`.
    pub(crate) fn new(period: Duration) -> Self {
        Self {
            period,
            keys: Mutex::default(),
        }
    }

    /// `Some(held back since the last line)` when a line for `key` may be written at `now`;
    /// `None` (and one more held back) when it may not.
    pub(crate) fn allow(&self, key: &K, now: Instant) -> Option<u64> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if keys.len() >= SWEEP_AT {
            let period = self.period;
            keys.retain(|_, s| now.saturating_duration_since(s.written) < period);
        }
        match keys.get_mut(key) {
            Some(s) if now.saturating_duration_since(s.written) < self.period => {
                s.held += 1;
                None
            }
            Some(s) => {
                let held = s.held;
                *s = Slot {
                    written: now,
                    held: 0,
                };
                Some(held)
            }
            None => {
                keys.insert(
                    key.clone(),
                    Slot {
                        written: now,
                        held: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_key_per_period_and_the_next_says_how_many_were_held() {
        let t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.allow(&"a", t0), Some(0));
        assert_eq!(t.allow(&"b", t0), Some(0), "keys are independent");
        for i in 1..=5 {
            assert_eq!(t.allow(&"a", t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(t.allow(&"a", t0 + Duration::from_secs(10)), Some(5));
        assert_eq!(t.allow(&"a", t0 + Duration::from_secs(11)), None);
        assert_eq!(t.allow(&"b", t0 + Duration::from_secs(30)), Some(0));
    }
}
