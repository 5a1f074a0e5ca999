//! DP-SGD's private step against the plain step on the same batch (issue: private step at most
//! 2× the plain one for the MLP).
//!
//! Run: `RAYON_NUM_THREADS=1 cargo bench --bench private_step`.
//!
//! Reports (criterion medians), for the quality suite's MLP (784-200-10) and the benchmark CNN
//! (CIFAR-10 shape, conv [16, 32]), a batch of 50 and 1 or 4 models (a silo's own and M = 3
//! peers'): `plain/<models>` is each model's summed gradient (`loss_and_grad`, what a plain
//! sub-step computes), `private/<models>` the jointly clipped per-example sum with its noise
//! (`private_grads`, σ = 1). Ratio = private / plain. Random sparse images: the cost does not
//! depend on the pixel values.

use criterion::{Criterion, criterion_group, criterion_main};
use federico::learn::{Dataset, Labels, Learner, ModelSpec};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

fn random_images(n: usize, shape: Vec<usize>, rng: &mut StdRng) -> Dataset {
    let d: usize = shape.iter().product();
    let features = (0..n * d)
        .map(|_| {
            if rng.random::<f32>() < 0.8 {
                0.0
            } else {
                rng.random::<f32>()
            }
        })
        .collect();
    let ids = (0..n).map(|_| rng.random_range(0..10u32)).collect();
    Dataset::new(
        features,
        shape,
        Labels::Class {
            ids,
            num_classes: 10,
        },
    )
    .unwrap()
}

fn steps(c: &mut Criterion) {
    let cases = [
        (
            "mlp_784_200_10",
            ModelSpec::Mlp {
                inputs: 784,
                hidden: vec![200],
                classes: 10,
            },
        ),
        (
            "cnn_3x32x32_16_32",
            ModelSpec::Cnn {
                channels: 3,
                height: 32,
                width: 32,
                conv: vec![16, 32],
                classes: 10,
            },
        ),
    ];
    for (name, spec) in cases {
        let mut rng = StdRng::seed_from_u64(1);
        let data = random_images(200, spec.input_shape(), &mut rng);
        let rows: Vec<usize> = (0..50).map(|i| i * 3 + 1).collect();
        let mut l = Learner::new(&spec, 50).unwrap();
        let params: Vec<Vec<f32>> = (0..4).map(|_| l.init_params(&mut rng)).collect();
        let mut g = c.benchmark_group(name);
        g.sample_size(20)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(4));
        for m in [1, 4] {
            let models: Vec<&[f32]> = params[..m].iter().map(Vec::as_slice).collect();
            g.bench_function(format!("plain/{m}"), |b| {
                b.iter(|| {
                    for p in &models {
                        black_box(l.loss_and_grad(p, &data, Some(&rows)).unwrap());
                    }
                })
            });
            let mut noise = StdRng::seed_from_u64(2);
            g.bench_function(format!("private/{m}"), |b| {
                b.iter(|| {
                    black_box(
                        l.private_grads(&models, &data, &rows, 1.0, 1.0, &mut noise)
                            .unwrap(),
                    )
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, steps);
criterion_main!(benches);
