//! One message on an impaired link (issue 4): the rule both drivers follow, the simulator's
//! fault network (`sim::network`) and a node's scheduled impairment (`net::impair`), so a loss
//! or a delay in a scenario means the same in `simulate` and in a swarm.
//! Owns: whether a message is lost (one draw from the sender's fault stream, made only when the
//! link is lossy, so a loss-free run draws nothing) and how long a kept one is held back; and
//! the wide-area link model of `[faults.links]` (issue 41): a message waits for the messages
//! before it on its directed link, takes its bytes at the link's speed, then the link's one-way
//! latency plus a jitter drawn uniformly in `[0, jitter)` (one draw from the sender's fault
//! stream, only when there is jitter).
//! Must not: hold messages, know peers or read a clock (the caller says what time it is).

use rand::RngExt;
use std::time::{Duration, Instant};

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

/// Bytes on the wire for a message carrying `floats` parameters: their f32s and a frame's
/// worth of header (both drivers charge a link this much).
pub fn wire_bytes(floats: usize) -> u64 {
    64 + 4 * floats as u64
}

/// One directed wide-area link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Wan {
    /// One-way latency.
    pub one_way: Duration,
    /// Added latency, uniform in `[0, jitter)`.
    pub jitter: Duration,
    /// Speed in bits per second (infinite: bytes take no time).
    pub bits_per_s: f64,
}

/// The sending side of one directed link: when it is free again.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wire {
    busy_until: Option<Instant>,
}

impl Wire {
    /// How long after `now` a message of `bytes` sent on this link `wan` arrives; the link is
    /// busy with it meanwhile.
    pub fn send(
        &mut self,
        rng: &mut impl rand::Rng,
        wan: &Wan,
        now: Instant,
        bytes: u64,
    ) -> Duration {
        let start = self.busy_until.map_or(now, |b| b.max(now));
        let on_wire = if wan.bits_per_s.is_finite() && wan.bits_per_s > 0.0 {
            Duration::from_secs_f64(bytes as f64 * 8.0 / wan.bits_per_s)
        } else {
            Duration::ZERO
        };
        self.busy_until = Some(start + on_wire);
        let jitter = if wan.jitter > Duration::ZERO {
            wan.jitter.mul_f64(rng.random::<f64>())
        } else {
            Duration::ZERO
        };
        (start - now) + on_wire + wan.one_way + jitter
    }
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

    #[test]
    fn a_wan_link_charges_latency_bytes_at_its_speed_and_queues_what_follows() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut other = StdRng::seed_from_u64(1);
        let wan = Wan {
            one_way: Duration::from_millis(80),
            jitter: Duration::ZERO,
            bits_per_s: 50e6,
        };
        let t0 = Instant::now();
        let mut w = Wire::default();
        // 636 KB at 50 Mbit/s is 101.76 ms, then 80 ms of latency.
        let model = wire_bytes(159_010);
        let first = w.send(&mut rng, &wan, t0, model);
        let expect = 80_000.0 + model as f64 * 8.0 / 50.0;
        assert!(
            (first.as_secs_f64() * 1e6 - expect).abs() < 1.0,
            "{first:?}"
        );
        // A second message sent at once waits for the first to leave the wire.
        let second = w.send(&mut rng, &wan, t0, 64);
        assert!(second > first, "{second:?} after {first:?}");
        // Once the wire is free, a small message costs the latency and its few bytes.
        let later = t0 + Duration::from_secs(1);
        let small = w.send(&mut rng, &wan, later, 64);
        assert_eq!(small.as_micros(), 80_010, "80 ms and 64 bytes");
        // No jitter, no draw.
        assert_eq!(rng.random::<u64>(), other.random::<u64>());
        let jittery = Wan {
            jitter: Duration::from_millis(10),
            ..wan
        };
        let mut w = Wire::default();
        let d: Vec<Duration> = (0..200)
            .map(|i| w.send(&mut rng, &jittery, later + Duration::from_secs(i), 0))
            .collect();
        assert!(
            d.iter()
                .all(|d| *d >= wan.one_way && *d < wan.one_way + jittery.jitter)
        );
        assert!(d.iter().any(|x| *x != d[0]), "jitter must vary");
    }
}
