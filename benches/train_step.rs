//! Training-step costs of the candle learners, and whether denormal floats slow them down.
//!
//! Run: `RAYON_NUM_THREADS=1 cargo bench --bench train_step` (one thread is the project's
//! setting on shared cores; `flush_denormals_to_zero` only covers the calling thread).
//! `FEDERICO_BENCH_MALLOPT=1` calls `retain_freed_memory` first.
//! The MLP and denormal groups use the first MNIST samples when `$FEDERICO_DATA_DIR/mnist` holds
//! the IDX files (README, Real data), and random sparse images otherwise.

use criterion::{Criterion, criterion_group, criterion_main};
use federico::learn::runtime::{denormals_flushed, flush_denormals_to_zero, retain_freed_memory};
use federico::learn::{Adam, Dataset, Labels, Learner, ModelSpec};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::hint::black_box;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;
#[cfg(not(target_os = "linux"))]
use std::time::Instant;

fn mlp_spec() -> ModelSpec {
    ModelSpec::Mlp {
        inputs: 784,
        hidden: vec![200],
        classes: 10,
    }
}

/// The data directory, as every federico command finds it (`FEDERICO_DATA_DIR`).
fn data_dir() -> Option<PathBuf> {
    std::env::var_os(federico::scenario::DATA_DIR_ENV).map(PathBuf::from)
}

fn gunzip(path: &Path) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).ok()?)
        .read_to_end(&mut out)
        .ok()?;
    Some(out)
}

/// The first `n` MNIST training samples, pixels in [0, 1].
fn mnist(n: usize) -> Option<Dataset> {
    let dir = data_dir()?.join("mnist");
    let images = gunzip(&dir.join("train-images-idx3-ubyte.gz"))?;
    let labels = gunzip(&dir.join("train-labels-idx1-ubyte.gz"))?;
    let be =
        |b: &[u8], i: usize| u32::from_be_bytes(b[4 * i..4 * i + 4].try_into().unwrap()) as usize;
    if be(&images, 0) != 2051 || be(&labels, 0) != 2049 || be(&images, 1) < n || be(&labels, 1) < n
    {
        return None;
    }
    let features = images[16..16 + n * 784]
        .iter()
        .map(|&p| f32::from(p) / 255.0)
        .collect();
    let ids = labels[8..8 + n].iter().map(|&l| u32::from(l)).collect();
    Dataset::new(
        features,
        vec![784],
        Labels::Class {
            ids,
            num_classes: 10,
        },
    )
    .ok()
}

/// Random images of `shape` (about 80 % zeros, like MNIST) with random labels.
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

fn images(n: usize, rng: &mut StdRng) -> (Dataset, &'static str) {
    match mnist(n) {
        Some(d) => (d, "mnist"),
        None => (random_images(n, vec![784], rng), "random"),
    }
}

fn loss_and_grad(c: &mut Criterion) {
    if std::env::var("FEDERICO_BENCH_MALLOPT").is_ok_and(|v| v == "1") {
        assert!(retain_freed_memory(), "mallopt refused");
        eprintln!("retain_freed_memory: on");
    }
    let mut rng = StdRng::seed_from_u64(1);
    let (data, source) = images(600, &mut rng);
    let mut g = c.benchmark_group(format!("mlp_784_200_10_{source}"));
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let mut l = Learner::new(&mlp_spec(), 50).unwrap();
    let p = l.init_params(&mut rng);
    let first50 = data.subset(&(0..50).collect::<Vec<_>>());
    g.bench_function("loss_and_grad_50", |b| {
        b.iter(|| l.loss_and_grad(black_box(&p), &first50, None).unwrap())
    });
    g.bench_function("loss_and_grad_600", |b| {
        b.iter(|| l.loss_and_grad(black_box(&p), &data, None).unwrap())
    });
    g.bench_function("evaluate_600", |b| {
        b.iter(|| l.evaluate(black_box(&p), &data).unwrap())
    });
    let mut opt = Adam::new(p.len(), 1e-3);
    let mut q = p.clone();
    g.bench_function("train_epoch_600_b50", |b| {
        b.iter(|| l.train_epoch(&mut q, &mut opt, &data, &mut rng).unwrap())
    });
    g.finish();

    let spec = ModelSpec::Cnn {
        channels: 3,
        height: 32,
        width: 32,
        conv: vec![32, 64],
        classes: 10,
    };
    let mut rng = StdRng::seed_from_u64(2);
    let data = random_images(50, vec![3, 32, 32], &mut rng);
    let mut l = Learner::new(&spec, 50).unwrap();
    let p = l.init_params(&mut rng);
    let mut g = c.benchmark_group("cnn_3x32x32_conv32_64");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(6));
    g.bench_function("loss_and_grad_50", |b| {
        b.iter(|| l.loss_and_grad(black_box(&p), &data, None).unwrap())
    });
    g.bench_function("evaluate_50", |b| {
        b.iter(|| l.evaluate(black_box(&p), &data).unwrap())
    });
    g.finish();
}

fn adam(c: &mut Criterion) {
    let n = mlp_spec().num_params();
    let mut rng = StdRng::seed_from_u64(3);
    let mut p: Vec<f32> = (0..n).map(|_| rng.random::<f32>() - 0.5).collect();
    let grad: Vec<f32> = (0..n).map(|_| rng.random::<f32>() - 0.5).collect();
    let mut opt = Adam::new(n, 1e-3);
    let mut g = c.benchmark_group("adam");
    g.sample_size(50)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g.bench_function(format!("step_{n}"), |b| {
        b.iter(|| opt.step(&mut p, black_box(&grad)))
    });
    // Moments that decayed into the subnormal range (as those of rarely active MNIST pixels do):
    // one step on gradients of 1e-38 leaves m = 1e-39, then zero gradients keep it decaying.
    let mut tiny = Adam::new(n, 1e-3);
    tiny.step(&mut p.clone(), &vec![1e-38; n]);
    let zero = vec![0.0f32; n];
    g.bench_function(format!("step_{n}_subnormal_moments"), |b| {
        b.iter_batched_ref(
            || (tiny.clone(), p.clone()),
            |(opt, p)| opt.step(p, black_box(&zero)),
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Counts of subnormal values, for the report printed before the denormal group.
fn subnormals(v: &[f32]) -> usize {
    v.iter().filter(|x| x.is_subnormal()).count()
}

/// The cookbook's Adam, without the subnormal flush of `federico::learn::Adam`: the baseline
/// that shows where this model's denormals came from.
struct PlainAdam {
    m: Vec<f32>,
    v: Vec<f32>,
    t: i32,
    lr: f32,
}

impl PlainAdam {
    fn step(&mut self, p: &mut [f32], g: &[f32]) {
        let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
        self.t += 1;
        let (c1, c2) = (1.0 - b1.powi(self.t), 1.0 - b2.powi(self.t));
        for i in 0..p.len() {
            self.m[i] = b1 * self.m[i] + (1.0 - b1) * g[i];
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * g[i] * g[i];
            p[i] -= self.lr * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + eps);
        }
    }
}

/// Parameters after `FEDERICO_BENCH_PRETRAIN_EPOCHS` (default 3) epochs of 300 plain-Adam
/// steps, and that Adam state. Prints how many values are subnormal.
fn pretrained(data: &Dataset, source: &str) -> (Vec<f32>, PlainAdam) {
    let epochs: usize = std::env::var("FEDERICO_BENCH_PRETRAIN_EPOCHS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut rng = StdRng::seed_from_u64(4);
    let mut l = Learner::new(&mlp_spec(), 50).unwrap();
    let mut p = l.init_params(&mut rng);
    let mut opt = PlainAdam {
        m: vec![0.0; p.len()],
        v: vec![0.0; p.len()],
        t: 0,
        lr: 1e-3,
    };
    for _ in 0..epochs {
        plain_epoch(&mut l, &mut p, &mut opt, data, &mut rng);
    }
    let ev = l.evaluate(&p, data).unwrap();
    let (_, grad) = l
        .loss_and_grad(&p, data, Some(&(0..50).collect::<Vec<_>>()))
        .unwrap();
    let probs = l
        .predict(&p, &data.subset(&(0..1000).collect::<Vec<_>>()))
        .unwrap();
    eprintln!(
        "denormals ({source}, {epochs} epochs of 300 steps): train acc {:.3}, loss {:.4}; \
         subnormal values: params {}/{}, batch gradient {}, probabilities {}/{}, Adam m {}, v {}",
        ev.accuracy(),
        ev.mean_loss(),
        subnormals(&p),
        p.len(),
        subnormals(&grad),
        subnormals(&probs),
        probs.len(),
        subnormals(&opt.m),
        subnormals(&opt.v),
    );
    (p, opt)
}

/// One epoch of batch-mean steps with [`PlainAdam`] (what `Learner::train_epoch` does with
/// `federico::learn::Adam`).
fn plain_epoch(
    l: &mut Learner,
    p: &mut [f32],
    opt: &mut PlainAdam,
    data: &Dataset,
    rng: &mut StdRng,
) {
    use rand::seq::SliceRandom;
    let mut order: Vec<usize> = (0..data.len()).collect();
    order.shuffle(rng);
    for batch in order.chunks(50) {
        let (_, mut g) = l.loss_and_grad(p, data, Some(batch)).unwrap();
        g.iter_mut().for_each(|x| *x /= batch.len() as f32);
        opt.step(p, &g);
    }
}

/// CPU time of the calling thread (Linux), so that the denormal comparison is not blurred by
/// other processes on shared cores; wall time elsewhere.
fn thread_time() -> Duration {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        unsafe extern "C" {
            fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: clock_gettime writes one timespec (two i64 on 64-bit Linux) into `ts`.
        let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime failed");
        Duration::new(ts.sec as u64, ts.nsec as u32)
    }
    #[cfg(not(target_os = "linux"))]
    {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed()
    }
}

fn denormals(c: &mut Criterion) {
    // A model trained for a while, then 300 more Adam steps (one epoch of 15,000 samples)
    // timed from that same state, with and without FTZ/DAZ on the training thread; with the
    // crate's Adam (subnormal moments flushed) and with the cookbook's plain Adam. Times are the
    // training thread's CPU time (needs RAYON_NUM_THREADS=1 to cover all the work).
    let mut rng = StdRng::seed_from_u64(4);
    let (data, source) = images(15_000, &mut rng);
    let state = std::cell::OnceCell::new();
    let mut g = c.benchmark_group(format!("denormals_mlp_300_steps_{source}"));
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for (plain, flush) in [(false, false), (false, true), (true, false), (true, true)] {
        let name = format!(
            "{}_{}",
            if plain { "plain_adam" } else { "crate_adam" },
            if flush { "ftz_daz" } else { "default" }
        );
        g.bench_function(name, |b| {
            let (p0, opt0) = state.get_or_init(|| pretrained(&data, source));
            // The same moments in the crate's Adam (its fields are private: via serde).
            let crate_opt: Adam = serde_json::from_value(serde_json::json!({
                "lr": opt0.lr, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                "m": opt0.m, "v": opt0.v, "t": opt0.t,
            }))
            .unwrap();
            b.iter_custom(|iters| {
                std::thread::scope(|s| {
                    s.spawn(|| {
                        if flush {
                            flush_denormals_to_zero();
                        }
                        assert_eq!(denormals_flushed(), flush || !cfg!(target_arch = "x86_64"));
                        let mut l = Learner::new(&mlp_spec(), 50).unwrap();
                        let mut rng = StdRng::seed_from_u64(5);
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let mut p = p0.clone();
                            let mut plain_opt = PlainAdam {
                                m: opt0.m.clone(),
                                v: opt0.v.clone(),
                                t: opt0.t,
                                lr: opt0.lr,
                            };
                            let mut opt = crate_opt.clone();
                            let start = thread_time();
                            if plain {
                                plain_epoch(&mut l, &mut p, &mut plain_opt, &data, &mut rng);
                            } else {
                                l.train_epoch(&mut p, &mut opt, &data, &mut rng).unwrap();
                            }
                            total += thread_time() - start;
                        }
                        total
                    })
                    .join()
                    .unwrap()
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, loss_and_grad, adam, denormals);
criterion_main!(benches);
