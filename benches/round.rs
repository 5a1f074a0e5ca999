//! One FedeRiCo round (K = 8, M = 3) for the MLP and the CNN, against the model compute the round
//! must do anyway, on 1 and 2 worker threads.
//!
//! `FEDERICO_DATA_DIR=/path/to/data cargo bench --bench round` (README, Real data)
//!
//! Reports (criterion medians): `round/<model>/<threads>t` and `compute/<model>/<threads>t`.
//! Bookkeeping share = 1 - compute / round; parallel ratio = round(2t) / round(1t).

use criterion::{Criterion, criterion_group, criterion_main};
use federico::scenario::Scenario;
use federico::sim::RoundBench;
use std::time::Duration;

fn scenario(model: &str) -> Scenario {
    let text = match model {
        "mlp" => {
            "[data]\nsource = \"fashion_mnist\"\n[split]\nclients = 8\ngroups = 4\n[model]\nkind = \"mlp\"\nhidden = [200]\n"
        }
        "cnn" => {
            "[data]\nsource = \"cifar10\"\nfraction = 0.25\n[split]\nclients = 8\ngroups = 4\n[model]\nkind = \"cnn\"\nconv = [16, 32]\n"
        }
        _ => unreachable!("only mlp and cnn are benchmarked"),
    };
    Scenario::parse(text).expect("valid scenario")
}

fn rounds(c: &mut Criterion) {
    // As the binary does: one silo per worker thread, candle's own per-op threads off.
    // SAFETY: set before this benchmark starts any thread.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", "1") };
    federico::learn::runtime::retain_freed_memory();
    if std::env::var_os("FEDERICO_DATA_DIR").is_none() {
        panic!(
            "set FEDERICO_DATA_DIR to the data directory (see the Real data section of the README)"
        );
    }
    let mut g = c.benchmark_group("federico_round");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(20));
    for model in ["mlp", "cnn"] {
        let s = scenario(model);
        for threads in [1, 2] {
            let mut b = RoundBench::new(&s, 1, threads, None).expect("bench setup");
            g.bench_function(format!("round/{model}/{threads}t"), |x| {
                x.iter(|| b.federico_round().unwrap())
            });
            g.bench_function(format!("compute/{model}/{threads}t"), |x| {
                x.iter(|| b.compute_only().unwrap())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, rounds);
criterion_main!(benches);
