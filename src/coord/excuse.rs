//! The excuse rule, shared by the coordinator's round engine (a member whose absence made a
//! round wait its full deadline) and FedCollab's member engine (a coalition member whose model
//! did not come in a round): the one who made a round wait is not waited for during the next
//! `first` rounds, each later time twice as long as the time before (at most
//! [`MAX_EXCUSE_FACTOR`] times `first`), so one silent key costs its waiters one deadline per
//! excuse, ever fewer.
//! Owns: who is excused until which round, and the strikes so far.
//! Must not: decide when a round waited or whom to blame (its callers' rules do), or read a
//! clock (rounds only).

use std::borrow::Borrow;
use std::collections::BTreeMap;

/// The longest excuse, in first excuses.
pub const MAX_EXCUSE_FACTOR: u64 = 64;

/// One member's excuse: not waited for before round `until`.
#[derive(Clone, Copy, Debug)]
struct Excuse {
    until: u64,
    strikes: u32,
}

/// The excuses of one waiter (a coordinator, or one FedCollab member), by member.
#[derive(Clone, Debug)]
pub struct Excuses<K> {
    first: u64,
    excuses: BTreeMap<K, Excuse>,
}

impl<K: Ord + Clone> Excuses<K> {
    /// No excuses yet; a first excuse lasts `first` rounds (0: nobody is ever excused).
    pub fn new(first: u64) -> Self {
        Self {
            first,
            excuses: BTreeMap::new(),
        }
    }

    /// Whether excuses are given at all.
    pub fn enabled(&self) -> bool {
        self.first > 0
    }

    /// Whether `who` is excused in `round`.
    pub fn is_excused<Q>(&self, who: &Q, round: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.excuses.get(who).is_some_and(|e| round < e.until)
    }

    /// `who` made `round` wait: it is excused until the round returned (with its strikes so
    /// far); `None` when excuses are off.
    pub fn strike(&mut self, who: &K, round: u64) -> Option<(u64, u32)> {
        if self.first == 0 {
            return None;
        }
        let e = self.excuses.entry(who.clone()).or_insert(Excuse {
            until: 0,
            strikes: 0,
        });
        e.strikes = e.strikes.saturating_add(1);
        let factor = 1u64
            .checked_shl(e.strikes - 1)
            .unwrap_or(u64::MAX)
            .min(MAX_EXCUSE_FACTOR);
        e.until = round
            .saturating_add(1)
            .saturating_add(self.first.saturating_mul(factor));
        Some((e.until, e.strikes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_excuse_is_twice_the_one_before_up_to_64_times_the_first() {
        let mut x = Excuses::new(5);
        assert!(!x.is_excused(&"a", 1));
        assert_eq!(x.strike(&"a", 1), Some((7, 1)));
        assert!(x.is_excused(&"a", 6) && !x.is_excused(&"a", 7));
        assert!(!x.is_excused(&"b", 2));
        assert_eq!(x.strike(&"a", 7), Some((7 + 1 + 10, 2)));
        for _ in 0..10 {
            x.strike(&"a", 100);
        }
        assert_eq!(x.strike(&"a", 100), Some((100 + 1 + 5 * 64, 13)));
    }

    #[test]
    fn no_excuse_when_the_first_is_zero() {
        let mut x = Excuses::new(0);
        assert!(!x.enabled());
        assert_eq!(x.strike(&1u32, 3), None);
        assert!(!x.is_excused(&1u32, 4));
    }
}
