//! The `federico` binary: parse the command line, run, print the whole error chain on failure.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Silos are trained in parallel on a worker pool, one silo per core; candle's own per-op
    // threads would only fight them for the same cores (COOKBOOK: a busy neighbour stalls
    // candle's spin barrier). Set before any thread exists; a user's explicit value wins.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // SAFETY: first statement of main, no other thread has been started yet.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", "1") };
    }
    // candle allocates a fresh buffer per op; keeping freed memory in the heap instead of
    // returning it to the kernel made CNN gradients 1.6x faster (benches/train_step.rs).
    federico::learn::runtime::retain_freed_memory();
    let cli = federico::cli::Cli::parse();
    match federico::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
