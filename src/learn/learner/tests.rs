//! Unit tests of `learn::learner` (moved unchanged from its inline `mod tests`).
//! Owns: the module's unit tests and their fixtures.
//! Must not: hold code the module itself uses.

use super::*;
use crate::learn::fixtures::{random_data, tiny_specs};
use rand::SeedableRng;

#[test]
fn features_are_the_classifiers_input() {
    let mut rng = StdRng::seed_from_u64(11);
    for spec in tiny_specs().iter().filter(|s| !s.is_regression()) {
        let data = random_data(spec, 9, &mut rng);
        let mut l = Learner::new(spec, 4).unwrap();
        let p = l.init_params(&mut rng);
        let rows = [8, 0, 3];
        let h = l.features(&p, &data, &rows).unwrap();
        let width = l.feature_width();
        assert_eq!(h.len(), rows.len() * width, "{spec:?}");
        // The last layer (`fc{last}.bias`, then `.weight` as [in, out]) applied to the
        // features gives the model's own predictions.
        let (mut offset, mut bias, mut weight) = (0, 0, 0);
        let last = format!("fc{}.", Plan::of(spec).dense.len() - 1);
        for (name, dims) in l.vars.layout() {
            if name == format!("{last}bias") {
                bias = offset;
            } else if name == format!("{last}weight") {
                weight = offset;
            }
            offset += dims.iter().product::<usize>();
        }
        let k = l.outputs();
        let probs = l.predict(&p, &data.subset(&rows)).unwrap();
        for (r, feats) in h.chunks(width).enumerate() {
            if matches!(spec, ModelSpec::Softmax { .. }) {
                assert_eq!(feats, data.row(rows[r]));
            } else {
                assert!(feats.iter().all(|&x| x >= 0.0), "post-ReLU");
            }
            let logits: Vec<f32> = (0..k)
                .map(|o| {
                    p[bias + o]
                        + feats
                            .iter()
                            .enumerate()
                            .map(|(i, &f)| f * p[weight + i * k + o])
                            .sum::<f32>()
                })
                .collect();
            let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let z: f32 = logits.iter().map(|v| (v - max).exp()).sum();
            for o in 0..k {
                let want = (logits[o] - max).exp() / z;
                assert!((probs[r * k + o] - want).abs() < 1e-5, "{spec:?}");
            }
        }
    }
}

/// Central differences of the summed loss (from `evaluate`, the inference path) against
/// the summed gradient (from `loss_and_grad`, backprop), coordinate by coordinate.
fn check_gradient(spec: &ModelSpec, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let data = random_data(spec, 7, &mut rng);
    let mut l = Learner::new(spec, 3).unwrap();
    let p = l.init_params(&mut rng);
    let (loss, g) = l.loss_and_grad(&p, &data, None).unwrap();
    let ev = l.evaluate(&p, &data).unwrap();
    assert!(
        (loss - ev.loss_sum).abs() <= 1e-4 * ev.loss_sum.abs().max(1.0),
        "{loss} vs {}",
        ev.loss_sum
    );
    let norm: f64 = g.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
    assert!(
        norm > 1e-2,
        "{spec:?}: gradient norm {norm} too small to test anything"
    );
    let h = 3e-4f32;
    let mut q = p.clone();
    for j in 0..p.len() {
        q[j] = p[j] + h;
        let up = l.evaluate(&q, &data).unwrap().loss_sum;
        q[j] = p[j] - h;
        let down = l.evaluate(&q, &data).unwrap().loss_sum;
        let width = f64::from(p[j] + h) - f64::from(p[j] - h);
        q[j] = p[j];
        let fd = (up - down) / width;
        let gj = f64::from(g[j]);
        assert!(
            (fd - gj).abs() <= 2e-3 + 1e-2 * fd.abs().max(gj.abs()),
            "{spec:?}: parameter {j}: finite difference {fd}, backprop {gj}"
        );
    }
}

#[test]
fn gradients_match_finite_differences_for_every_architecture() {
    for (i, spec) in tiny_specs().iter().enumerate() {
        check_gradient(spec, 10 + i as u64);
    }
}

#[test]
fn loss_and_grad_sums_over_samples() {
    let spec = ModelSpec::Mlp {
        inputs: 4,
        hidden: vec![6],
        classes: 3,
    };
    let mut rng = StdRng::seed_from_u64(1);
    let data = random_data(&spec, 7, &mut rng);
    let mut l = Learner::new(&spec, 3).unwrap();
    let p = l.init_params(&mut rng);
    let (loss, grad) = l.loss_and_grad(&p, &data, None).unwrap();
    let (mut loss_rows, mut grad_rows) = (0.0, vec![0.0f32; p.len()]);
    for i in 0..data.len() {
        let (li, gi) = l.loss_and_grad(&p, &data, Some(&[i])).unwrap();
        loss_rows += li;
        grad_rows.iter_mut().zip(&gi).for_each(|(a, b)| *a += b);
    }
    assert!(
        (loss - loss_rows).abs() < 1e-5 * loss.abs(),
        "{loss} vs {loss_rows}"
    );
    for (j, (a, b)) in grad.iter().zip(&grad_rows).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 + 1e-4 * a.abs(),
            "parameter {j}: {a} vs {b}"
        );
    }
}

#[test]
fn loss_and_grad_on_rows_equals_the_subset() {
    let spec = ModelSpec::Cnn {
        channels: 1,
        height: 6,
        width: 6,
        conv: vec![2],
        classes: 4,
    };
    let mut rng = StdRng::seed_from_u64(2);
    let data = random_data(&spec, 9, &mut rng);
    let mut l = Learner::new(&spec, 2).unwrap();
    let p = l.init_params(&mut rng);
    let rows = [4, 1, 8, 1, 5];
    let (loss, grad) = l.loss_and_grad(&p, &data, Some(&rows)).unwrap();
    let (loss_sub, grad_sub) = l.loss_and_grad(&p, &data.subset(&rows), None).unwrap();
    assert_eq!(loss, loss_sub);
    assert_eq!(grad, grad_sub);
    let (all, _) = l.loss_and_grad(&p, &data, None).unwrap();
    assert_ne!(loss, all);
    let (none, zero) = l.loss_and_grad(&p, &data, Some(&[])).unwrap();
    assert_eq!(none, 0.0);
    assert!(zero.iter().all(|&v| v == 0.0));
    assert!(matches!(
        l.loss_and_grad(&p, &data, Some(&[9])),
        Err(LearnError::Shape(_))
    ));
}

#[test]
fn flatten_order_is_the_same_in_every_learner() {
    // Each VarMap is a HashMap with its own random order: without sorting, these differ.
    let spec = ModelSpec::Mlp {
        inputs: 5,
        hidden: vec![4, 3, 4],
        classes: 3,
    };
    let mut rng = StdRng::seed_from_u64(3);
    let data = random_data(&spec, 6, &mut rng);
    let p = Learner::new(&spec, 4).unwrap().init_params(&mut rng);
    let reference = Learner::new(&spec, 4)
        .unwrap()
        .loss_and_grad(&p, &data, None)
        .unwrap();
    for _ in 0..8 {
        let mut l = Learner::new(&spec, 4).unwrap();
        assert_eq!(l.loss_and_grad(&p, &data, None).unwrap(), reference);
    }
    let names: Vec<String> = Learner::new(&spec, 4)
        .unwrap()
        .vars
        .layout()
        .map(|(n, _)| n.to_string())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(names[0], "fc0.bias");
}

#[test]
fn wrong_sizes_are_errors_not_panics() {
    let spec = ModelSpec::Softmax {
        inputs: 4,
        classes: 3,
    };
    let mut rng = StdRng::seed_from_u64(4);
    let data = random_data(&spec, 5, &mut rng);
    let mut l = Learner::new(&spec, 2).unwrap();
    let p = l.init_params(&mut rng);
    let short = &p[..p.len() - 1];
    let shape_err = |r: Result<(), LearnError>| match r {
        Err(LearnError::Shape(m)) => m,
        other => panic!("expected a shape error, got {other:?}"),
    };
    let m = shape_err(l.evaluate(short, &data).map(drop));
    assert!(m.contains("15") && m.contains("14"), "{m}");
    shape_err(l.loss_and_grad(short, &data, None).map(drop));
    shape_err(l.predict(short, &data).map(drop));
    let mut long = p.clone();
    long.push(0.0);
    let mut opt = Adam::new(p.len(), 0.1);
    shape_err(
        l.train_epoch(&mut long, &mut opt, &data, &mut rng)
            .map(drop),
    );
    shape_err(
        l.train_epoch(&mut p.clone(), &mut Adam::new(3, 0.1), &data, &mut rng)
            .map(drop),
    );

    let wide = random_data(
        &ModelSpec::Softmax {
            inputs: 5,
            classes: 3,
        },
        5,
        &mut rng,
    );
    let m = shape_err(l.evaluate(&p, &wide).map(drop));
    assert!(m.contains('4') && m.contains('5'), "{m}");
    let many = random_data(
        &ModelSpec::Softmax {
            inputs: 4,
            classes: 9,
        },
        50,
        &mut rng,
    );
    shape_err(l.loss_and_grad(&p, &many, None).map(drop));
    let real = random_data(
        &ModelSpec::Linear {
            inputs: 4,
            outputs: 1,
        },
        5,
        &mut rng,
    );
    shape_err(l.evaluate(&p, &real).map(drop));

    assert!(
        Learner::new(
            &ModelSpec::Linear {
                inputs: 3,
                outputs: 2
            },
            4
        )
        .is_err()
    );
    assert!(Learner::new(&spec, 0).is_err());
    assert!(
        Learner::new(
            &ModelSpec::Cnn {
                channels: 1,
                height: 8,
                width: 8,
                conv: vec![2, 2],
                classes: 2
            },
            4
        )
        .is_err()
    );
    assert!(
        Learner::new(
            &ModelSpec::Mlp {
                inputs: 3,
                hidden: vec![0],
                classes: 2
            },
            4
        )
        .is_err()
    );
}

#[test]
fn a_learner_can_move_to_a_trainer_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<Learner>();
}

#[test]
fn cnn_takes_flat_samples_of_the_right_size() {
    let spec = ModelSpec::Cnn {
        channels: 2,
        height: 6,
        width: 6,
        conv: vec![2],
        classes: 3,
    };
    let mut rng = StdRng::seed_from_u64(5);
    let data = random_data(&spec, 4, &mut rng);
    let flat = Dataset {
        sample_shape: vec![72],
        ..data.clone()
    };
    let mut l = Learner::new(&spec, 3).unwrap();
    let p = l.init_params(&mut rng);
    assert_eq!(
        l.evaluate(&p, &data).unwrap(),
        l.evaluate(&p, &flat).unwrap()
    );
    let transposed = Dataset {
        sample_shape: vec![6, 6, 2],
        ..data.clone()
    };
    assert!(matches!(
        l.evaluate(&p, &transposed),
        Err(LearnError::Shape(_))
    ));
}

/// Three well-separated clusters in the plane (centres 3 apart on a circle, noise in a
/// unit square): linearly separable.
fn clusters(n: usize, rng: &mut StdRng) -> Dataset {
    let centres = [(3.0f32, 0.0f32), (-1.5, 2.6), (-1.5, -2.6)];
    let mut features = Vec::with_capacity(2 * n);
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let c = rng.random_range(0..3u32);
        let (x, y) = centres[c as usize];
        features.push(x + rng.random::<f32>() * 2.0 - 1.0);
        features.push(y + rng.random::<f32>() * 2.0 - 1.0);
        ids.push(c);
    }
    Dataset::new(
        features,
        vec![2],
        Labels::Class {
            ids,
            num_classes: 3,
        },
    )
    .unwrap()
}

#[test]
fn softmax_learns_separable_clusters() {
    let spec = ModelSpec::Softmax {
        inputs: 2,
        classes: 3,
    };
    let mut rng = StdRng::seed_from_u64(6);
    let (train, test) = (clusters(300, &mut rng), clusters(200, &mut rng));
    let mut l = Learner::new(&spec, 20).unwrap();
    let mut p = l.init_params(&mut rng);
    let mut opt = Adam::new(p.len(), 0.05);
    let before = l.evaluate(&p, &test).unwrap();
    let mut losses = Vec::new();
    for _ in 0..20 {
        losses.push(l.train_epoch(&mut p, &mut opt, &train, &mut rng).unwrap());
    }
    assert_eq!(opt.steps(), 20 * 15);
    let after = l.evaluate(&p, &test).unwrap();
    assert!(
        after.accuracy() > 0.95,
        "accuracy {} (before {})",
        after.accuracy(),
        before.accuracy()
    );
    assert!(losses[19] < losses[0] / 2.0, "{losses:?}");
    assert!(after.mean_loss() < before.mean_loss());
}

#[test]
fn linear_regression_fits_a_line() {
    let spec = ModelSpec::Linear {
        inputs: 1,
        outputs: 1,
    };
    let mut rng = StdRng::seed_from_u64(7);
    let xs: Vec<f32> = (0..200).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
    let ys = xs.iter().map(|x| 2.0 * x + 1.0).collect();
    let data = Dataset::new(xs, vec![1], Labels::Real(ys)).unwrap();
    let mut l = Learner::new(&spec, 10).unwrap();
    let mut p = l.init_params(&mut rng);
    let mut opt = Adam::new(p.len(), 0.05);
    for epoch in 0..60 {
        if epoch == 40 {
            opt.lr = 0.005;
        }
        l.train_epoch(&mut p, &mut opt, &data, &mut rng).unwrap();
    }
    // Name order: fc0.bias, then fc0.weight.
    assert!(
        (p[0] - 1.0).abs() < 0.02 && (p[1] - 2.0).abs() < 0.02,
        "{p:?}"
    );
    let ev = l.evaluate(&p, &data).unwrap();
    assert!(ev.mean_loss() < 1e-3, "{}", ev.mean_loss());
    assert_eq!(ev.correct, 0);
    let out = l.predict(&p, &data).unwrap();
    assert_eq!(out.len(), data.len());
    assert!((out[0] - (2.0 * data.features[0] + 1.0)).abs() < 0.05);
}

#[test]
fn predicted_probabilities_sum_to_one() {
    for spec in &tiny_specs()[1..] {
        let mut rng = StdRng::seed_from_u64(8);
        let data = random_data(spec, 11, &mut rng);
        let mut l = Learner::new(spec, 4).unwrap();
        let p = l.init_params(&mut rng);
        let probs = l.predict(&p, &data).unwrap();
        assert_eq!(probs.len(), 11 * 3);
        for row in probs.chunks(3) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{row:?}");
            assert!(row.iter().all(|&q| q > 0.0 && q < 1.0));
        }
        // The most probable class is the one evaluate counts as the prediction.
        let Labels::Class { ids, .. } = &data.labels else {
            unreachable!()
        };
        let hits = probs
            .chunks(3)
            .zip(ids)
            .filter(|(row, y)| log_loss_and_argmax(row, 0).1 == **y as usize)
            .count();
        assert_eq!(hits, l.evaluate(&p, &data).unwrap().correct);
    }
}

#[test]
fn init_is_seeded_and_bounded_by_fan_in() {
    let spec = ModelSpec::Mlp {
        inputs: 16,
        hidden: vec![4],
        classes: 2,
    };
    let l = Learner::new(&spec, 4).unwrap();
    let a = l.init_params(&mut StdRng::seed_from_u64(9));
    assert_eq!(a, l.init_params(&mut StdRng::seed_from_u64(9)));
    assert_ne!(a, l.init_params(&mut StdRng::seed_from_u64(10)));
    // Sorted: fc0.bias (4), fc0.weight (64): fan-in 16; fc1.bias (2), fc1.weight (8): fan-in 4.
    assert!(a[..68].iter().all(|v| v.abs() <= 0.25));
    assert!(a[..68].iter().any(|v| v.abs() > 0.2));
    assert!(a[68..].iter().any(|v| v.abs() > 0.25) && a[68..].iter().all(|v| v.abs() <= 0.5));
}

#[test]
fn inference_builds_no_graph() {
    let spec = ModelSpec::Mlp {
        inputs: 3,
        hidden: vec![4],
        classes: 2,
    };
    let l = Learner::new(&spec, 4).unwrap();
    let x = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
    assert!(!l.eval_net.forward(&x).unwrap().track_op());
    assert!(l.train_net.forward(&x).unwrap().track_op());
}

#[test]
fn row_losses_sum_to_the_evaluated_loss_and_expose_a_memorised_silo() {
    let mut rng = StdRng::seed_from_u64(13);
    for spec in tiny_specs() {
        let data = random_data(&spec, 11, &mut rng);
        let mut l = Learner::new(&spec, 4).unwrap();
        let p = l.init_params(&mut rng);
        let rows = l.row_losses(&p, &data).unwrap();
        let ev = l.evaluate(&p, &data).unwrap();
        assert_eq!(rows.len(), 11, "{spec:?}");
        let sum: f64 = rows.iter().sum();
        assert!(
            (sum - ev.loss_sum).abs() < 1e-6 * (1.0 + sum.abs()),
            "{spec:?}"
        );
    }
    // The attack the audit plays: a model fitted hard to random labels gives its training rows
    // lower losses than held-out rows of the same distribution, and the audit sees it.
    let spec = ModelSpec::Mlp {
        inputs: 16,
        hidden: vec![64],
        classes: 3,
    };
    let train = random_data(&spec, 100, &mut rng);
    let held_out = random_data(&spec, 100, &mut rng);
    let mut l = Learner::new(&spec, 8).unwrap();
    let mut p = l.init_params(&mut rng);
    let mut opt = Adam::new(p.len(), 0.01);
    for _ in 0..300 {
        l.train_epoch(&mut p, &mut opt, &train, &mut rng).unwrap();
    }
    let members = l.row_losses(&p, &train).unwrap();
    let non = l.row_losses(&p, &held_out).unwrap();
    let found = crate::privacy::audit::audit(&members, &non, 0.0);
    assert!(found.auc > 0.9, "{found:?}");
    assert!(found.epsilon_lower_bound > 1.0, "{found:?}");
}

#[test]
fn a_confident_rows_loss_keeps_its_digits() {
    // Margins of 50 and 60: as lse − x_y both would be exactly 0 (a tie to an attacker).
    let (a, arg) = log_loss_and_argmax(&[50.0, 0.0, 0.0], 0);
    let (b, _) = log_loss_and_argmax(&[60.0, 0.0, 0.0], 0);
    assert_eq!(arg, 0);
    assert!((a / (2.0 * (-50f64).exp()) - 1.0).abs() < 1e-12, "{a}");
    assert!(b > 0.0 && b < a, "{b} {a}");
    // A wrong or tied row as before.
    let (c, arg) = log_loss_and_argmax(&[0.0, 2.0, 0.0], 0);
    let lse = (2.0 + 2f64.exp()).ln();
    assert_eq!(arg, 1);
    assert!((c - lse).abs() < 1e-12, "{c} {lse}");
    let (d, _) = log_loss_and_argmax(&[1.0, 1.0], 1);
    assert!((d - 2f64.ln()).abs() < 1e-15, "{d}");
}
