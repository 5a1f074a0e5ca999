//! What a hostile member does with its own silo's work (issue 38): the poisoning that fault
//! schedules play, identically in the simulator and in a node, because both run it here.
//!
//! Owns: the kinds of [`Attack`] and their parameters, and [`Poisoner`], which rewrites what
//! one silo releases while an attack is in force: the gradients it sends to *other* owners
//! (sign-flipped, scaled, replaced by noise, set to the largest finite f32, or replayed stale),
//! the model it serves (a free rider serves the model it had when the attack began and sends
//! nothing useful), and the labels it trains on (flipped). Its own gradient stays honest: an
//! attacker wants a good model for itself. In coordinator mode a silo sends its trained model
//! instead: [`Poisoner::sent_model`] rewrites the update in it (the move from the model it
//! started from) the same ways. Noise is drawn from a stream of the run seed and the node id.
//! Must not: decide when an attack runs (a fault schedule does, and its drivers say so through
//! [`crate::silo::federico::FedericoSilo::set_attack`]), touch the network or read a clock.

use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Dataset, Labels};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, StandardNormal};
use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::faults::Attack;

/// An attack in force on one silo, with what it remembers.
#[derive(Debug)]
pub struct Poisoner {
    attack: Attack,
    me: NodeId,
    rng: StdRng,
    /// `Stale`: the first gradient sent to each owner.
    first: BTreeMap<NodeId, Vec<f32>>,
    /// `FreeRide`: the model served.
    frozen: Option<Arc<Vec<f32>>>,
    /// `Labels`: the training rows with flipped labels (built on first use).
    flipped: Option<Arc<Dataset>>,
}

impl Poisoner {
    /// `attack` on the silo of node `me` in a run seeded `seed`.
    pub fn new(attack: Attack, me: NodeId, seed: u64) -> Self {
        Self {
            attack,
            me,
            rng: StdRng::seed_from_u64(stream_seed(seed ^ 0xA77A, me, Stream::Attack)),
            first: BTreeMap::new(),
            frozen: None,
            flipped: None,
        }
    }

    /// The attack in force.
    pub fn attack(&self) -> &Attack {
        &self.attack
    }

    /// Rewrites the gradients a silo is about to send; its own (`me`) is left as it is.
    pub fn gradients(&mut self, grads: &mut [(NodeId, Vec<f32>)]) {
        for (owner, g) in grads.iter_mut() {
            if *owner == self.me {
                continue;
            }
            match &self.attack {
                Attack::SignFlip { factor } => mul(g, -(*factor as f32)),
                Attack::Scale { factor } => mul(g, *factor as f32),
                Attack::Noise { factor } => {
                    let norm = g.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
                    let sd = factor * norm / (g.len().max(1) as f64).sqrt();
                    for x in g.iter_mut() {
                        let z: f64 = StandardNormal.sample(&mut self.rng);
                        *x = (sd * z) as f32;
                    }
                }
                Attack::Extreme => {
                    for x in g.iter_mut() {
                        *x = if *x < 0.0 { -f32::MAX } else { f32::MAX };
                    }
                }
                Attack::Stale => {
                    let first = self.first.entry(*owner).or_insert_with(|| g.clone());
                    if first.len() == g.len() {
                        g.copy_from_slice(first);
                    }
                }
                Attack::FreeRide => g.iter_mut().for_each(|x| *x = 0.0),
                Attack::Labels => {}
            }
        }
    }

    /// Rewrites the model a silo is about to send a coordinator, `trained` from `start`, by
    /// its update `trained − start`: negated and scaled (`SignFlip`), scaled (`Scale`),
    /// replaced by noise of `factor` times its norm (`Noise`), every coordinate ±3.4e38 with
    /// the update's sign (`Extreme`), the first model sent under the attack sent again
    /// (`Stale`), or `start` itself, no update at all (`FreeRide`). `Labels` sends the model
    /// trained on flipped rows ([`Poisoner::train_rows`]) as it is.
    pub fn sent_model(&mut self, start: &[f32], trained: &mut [f32]) {
        if start.len() != trained.len() {
            return;
        }
        // A coordinate its training lost (NaN, after training from a model it poisoned
        // itself) does not move.
        for (x, &s) in trained.iter_mut().zip(start) {
            if x.is_nan() {
                *x = s;
            }
        }
        let moved = |t: &mut [f32], f: f64| {
            for (x, &s) in t.iter_mut().zip(start) {
                *x = (f64::from(s) + f * (f64::from(*x) - f64::from(s))) as f32;
            }
        };
        match &self.attack {
            Attack::SignFlip { factor } => moved(trained, -factor),
            Attack::Scale { factor } => moved(trained, *factor),
            Attack::Noise { factor } => {
                let norm = trained
                    .iter()
                    .zip(start)
                    .map(|(&x, &s)| (f64::from(x) - f64::from(s)).powi(2))
                    .sum::<f64>()
                    .sqrt();
                let sd = factor * norm / (trained.len().max(1) as f64).sqrt();
                for (x, &s) in trained.iter_mut().zip(start) {
                    let z: f64 = StandardNormal.sample(&mut self.rng);
                    *x = (f64::from(s) + sd * z) as f32;
                }
            }
            Attack::Extreme => {
                for (x, &s) in trained.iter_mut().zip(start) {
                    *x = if *x < s { -f32::MAX } else { f32::MAX };
                }
            }
            Attack::Stale => {
                let first = self
                    .frozen
                    .get_or_insert_with(|| Arc::new(trained.to_vec()));
                if first.len() == trained.len() {
                    trained.copy_from_slice(first);
                }
            }
            Attack::FreeRide => trained.copy_from_slice(start),
            Attack::Labels => {}
        }
        // A member speaking the protocol sends finite values (a coordinator refuses others): a
        // move past f32's range stops at its largest finite value.
        for x in trained.iter_mut() {
            *x = if x.is_nan() {
                0.0
            } else {
                x.clamp(-f32::MAX, f32::MAX)
            };
        }
    }

    /// The model the silo serves after a step that produced `params`.
    pub fn served(&mut self, params: Arc<Vec<f32>>) -> Arc<Vec<f32>> {
        match self.attack {
            Attack::FreeRide => self.frozen.get_or_insert(params).clone(),
            _ => params,
        }
    }

    /// The rows the silo trains and measures on: `train` itself, or (`Labels`) a copy with
    /// every class label c turned into C − 1 − c.
    pub fn train_rows(&mut self, train: &Dataset) -> Option<Arc<Dataset>> {
        if self.attack != Attack::Labels {
            return None;
        }
        if self.flipped.is_none() {
            let mut d = train.clone();
            if let Labels::Class { ids, num_classes } = &mut d.labels {
                let top = *num_classes as u32 - 1;
                ids.iter_mut().for_each(|c| *c = top - *c);
            }
            self.flipped = Some(Arc::new(d));
        }
        self.flipped.clone()
    }
}

fn mul(g: &mut [f32], f: f32) {
    g.iter_mut().for_each(|x| *x *= f);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grads() -> Vec<(NodeId, Vec<f32>)> {
        vec![
            (NodeId(1), vec![1.0, -2.0, 0.5]),
            (NodeId(0), vec![3.0, 4.0, 0.0]),
        ]
    }

    #[test]
    fn each_kind_rewrites_what_others_get_and_never_the_own_gradient() {
        let cases: Vec<(Attack, Vec<f32>)> = vec![
            (Attack::SignFlip { factor: 1.0 }, vec![-1.0, 2.0, -0.5]),
            (Attack::Scale { factor: 10.0 }, vec![10.0, -20.0, 5.0]),
            (Attack::Extreme, vec![f32::MAX, -f32::MAX, f32::MAX]),
            (Attack::FreeRide, vec![0.0, 0.0, 0.0]),
            (Attack::Labels, vec![1.0, -2.0, 0.5]),
            (Attack::Stale, vec![1.0, -2.0, 0.5]),
        ];
        for (a, want) in cases {
            let mut p = Poisoner::new(a.clone(), NodeId(0), 7);
            let mut g = grads();
            p.gradients(&mut g);
            assert_eq!(g[0].1, want, "{a:?}");
            assert_eq!(
                g[1].1,
                vec![3.0, 4.0, 0.0],
                "{a:?} touched its own gradient"
            );
        }
    }

    #[test]
    fn stale_replays_the_first_gradient_and_free_ride_the_first_model() {
        let mut p = Poisoner::new(Attack::Stale, NodeId(0), 7);
        p.gradients(&mut grads());
        let mut later = vec![(NodeId(1), vec![9.0, 9.0, 9.0])];
        p.gradients(&mut later);
        assert_eq!(later[0].1, vec![1.0, -2.0, 0.5]);
        let mut f = Poisoner::new(Attack::FreeRide, NodeId(0), 7);
        let first = f.served(Arc::new(vec![1.0]));
        let second = f.served(Arc::new(vec![2.0]));
        assert_eq!(
            (first.as_slice(), second.as_slice()),
            (&[1.0f32][..], &[1.0f32][..])
        );
    }

    #[test]
    fn a_sent_model_carries_the_poisoned_update() {
        let start = [1.0f32, 1.0, 1.0];
        let trained = [2.0f32, 0.0, 1.0];
        let cases: Vec<(Attack, Vec<f32>)> = vec![
            (Attack::SignFlip { factor: 1.0 }, vec![0.0, 2.0, 1.0]),
            (Attack::Scale { factor: 10.0 }, vec![11.0, -9.0, 1.0]),
            (Attack::Extreme, vec![f32::MAX, -f32::MAX, f32::MAX]),
            (Attack::FreeRide, vec![1.0, 1.0, 1.0]),
            (Attack::Labels, vec![2.0, 0.0, 1.0]),
            (Attack::Stale, vec![2.0, 0.0, 1.0]),
        ];
        for (a, want) in cases {
            let mut p = Poisoner::new(a.clone(), NodeId(0), 7);
            let mut t = trained;
            p.sent_model(&start, &mut t);
            assert_eq!(t.to_vec(), want, "{a:?}");
        }
        // Stale: the first model sent, again and again.
        let mut p = Poisoner::new(Attack::Stale, NodeId(0), 7);
        let mut first = trained;
        p.sent_model(&start, &mut first);
        let mut later = [5.0f32, 5.0, 5.0];
        p.sent_model(&[4.0; 3], &mut later);
        assert_eq!(later, trained);
        // Noise: the asked norm around the start.
        let mut n = Poisoner::new(Attack::Noise { factor: 3.0 }, NodeId(0), 7);
        let start = vec![1.0f32; 10_000];
        let mut t: Vec<f32> = start.iter().map(|s| s + 0.01).collect();
        n.sent_model(&start, &mut t);
        let norm = t
            .iter()
            .map(|x| (f64::from(*x) - 1.0).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!((norm - 3.0).abs() < 0.1, "{norm}");
    }

    #[test]
    fn noise_has_the_asked_norm_and_follows_the_seed() {
        let big = |seed| {
            let mut p = Poisoner::new(Attack::Noise { factor: 3.0 }, NodeId(0), seed);
            let mut g = vec![(NodeId(2), vec![0.01f32; 10_000])];
            p.gradients(&mut g);
            g.remove(0).1
        };
        let (a, b, c) = (big(1), big(1), big(2));
        assert_eq!(a, b);
        assert_ne!(a, c);
        let norm = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        // The honest norm is 0.01 × 100 = 1.
        assert!((norm - 3.0).abs() < 0.1, "{norm}");
    }

    #[test]
    fn labels_flip_every_class() {
        let d = Dataset::new(
            vec![0.0; 4],
            vec![1],
            Labels::Class {
                ids: vec![0, 1, 2, 9],
                num_classes: 10,
            },
        )
        .unwrap();
        let mut p = Poisoner::new(Attack::Labels, NodeId(0), 7);
        let f = p.train_rows(&d).unwrap();
        assert!(matches!(&f.labels, Labels::Class { ids, .. } if *ids == vec![9, 8, 7, 0]));
        assert!(
            Poisoner::new(Attack::Extreme, NodeId(0), 7)
                .train_rows(&d)
                .is_none()
        );
    }

    #[test]
    fn a_bad_kind_or_factor_is_refused_by_name() {
        assert!(
            Attack::parse("sacle", None)
                .unwrap_err()
                .contains("unknown attack kind")
        );
        assert!(
            Attack::parse("scale", None)
                .unwrap_err()
                .contains("needs a positive factor")
        );
        assert!(Attack::parse("scale", Some(-1.0)).is_err());
        assert!(
            Attack::parse("extreme", Some(2.0))
                .unwrap_err()
                .contains("takes no factor")
        );
        assert_eq!(
            Attack::parse("sign_flip", None).unwrap(),
            Attack::SignFlip { factor: 1.0 }
        );
    }
}
