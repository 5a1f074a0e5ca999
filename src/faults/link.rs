//! One message on an impaired link (issue 4): the rule both drivers follow, the simulator's
//! fault network (`sim::network`) and a node's scheduled impairment (`net::impair`), so a loss
//! or a delay in a scenario means the same in `simulate` and in a swarm.
//! Owns: whether a message is lost (one draw from the sender's fault stream, made only when the
//! link is lossy, so a loss-free run draws nothing) and how long a kept one is held back.
//! Must not: hold messages, know peers or read a clock.

use rand::RngExt;
use std::time::Duration;

/// What happens to one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// It never arrives: the other side waits out its deadline.
    Lost,
    /// It arrives after this delay (zero: at once).
    After(Duration),
}

/// The fate of one message on a link that loses a `loss` fraction of messages and delays the
/// sender's by `delay`.
pub fn fate(rng: &mut impl rand::Rng, loss: f64, delay: Duration) -> Fate {
    if lost(rng, loss) {
        Fate::Lost
    } else {
        Fate::After(delay)
    }
}

/// Whether one message on a link that loses a `loss` fraction is lost (no draw when `loss` is
/// 0 or less).
pub fn lost(rng: &mut impl rand::Rng, loss: f64) -> bool {
    loss > 0.0 && rng.random::<f64>() < loss
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn a_loss_free_link_draws_nothing_and_a_lossy_one_loses_its_fraction() {
        let mut a = StdRng::seed_from_u64(7);
        let mut b = StdRng::seed_from_u64(7);
        let d = Duration::from_millis(30);
        assert!((0..100).all(|_| fate(&mut a, 0.0, d) == Fate::After(d)));
        // No draw was made: `a` is where `b` is.
        assert_eq!(a.random::<u64>(), b.random::<u64>());
        let lost = (0..10_000)
            .filter(|_| fate(&mut a, 0.25, d) == Fate::Lost)
            .count();
        assert!(
            (2_200..2_800).contains(&lost),
            "{lost} of 10000 lost at 0.25"
        );
        assert!((0..100).all(|_| fate(&mut a, 1.0, d) == Fate::Lost));
    }
}
