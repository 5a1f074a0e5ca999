//! Test helpers for the sans-IO engines' virtual-clock tests.
//! Owns: a virtual clock that serves an engine's timeouts in order, with a step bound (quinn's
//! `drive_bounded`: a busy loop fails the test instead of hanging it).
//! Must not: hold anything the engines use (compiled for tests only).

use std::time::Instant;

/// The most timeouts one [`Clock::run_until`] serves.
const STEP_BOUND: usize = 100_000;

/// A clock that moves only when a test moves it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    now: Instant,
}

impl Clock {
    /// A clock at an arbitrary start.
    pub(crate) fn new() -> Self {
        Self {
            now: Instant::now(),
        }
    }

    /// A clock at `now`.
    pub(crate) fn at(now: Instant) -> Self {
        Self { now }
    }

    /// Now, on this clock.
    pub(crate) fn now(&self) -> Instant {
        self.now
    }

    /// Moves the clock to `t`, or leaves it where it is when `t` has passed (nothing is served
    /// on the way).
    pub(crate) fn advance_to(&mut self, t: Instant) {
        self.now = self.now.max(t);
    }

    /// Moves the clock `by` forward (nothing is served on the way).
    pub(crate) fn advance(&mut self, by: std::time::Duration) {
        self.now += by;
    }

    /// Moves the clock to `until`, serving on the way every timeout `target` asks for
    /// (`next`) with `fire`, in order; a timeout in the past is served at the present.
    pub(crate) fn run_until<T>(
        &mut self,
        until: Instant,
        target: &mut T,
        next: impl Fn(&T) -> Option<Instant>,
        mut fire: impl FnMut(&mut T, Instant),
    ) {
        for _ in 0..STEP_BOUND {
            match next(target) {
                Some(t) if t <= until => {
                    self.now = self.now.max(t);
                    fire(target, self.now);
                }
                _ => {
                    self.now = self.now.max(until);
                    return;
                }
            }
        }
        panic!("more than {STEP_BOUND} timeouts before the clock reached its target: a busy loop");
    }
}
