//! The node processes of a local swarm: starting each one (inside its network namespace when
//! there is one), following them with the progress bar until all have exited, Ctrl-C, and
//! stopping them.
//! Owns: [`Proc`] (a started node process, its lives and how it ended), [`start_node`], the
//! watch loop, the SIGINT and SIGTERM hook, SIGTERM-then-SIGKILL teardown, log tails and resident-set
//! sampling.
//! Must not: write the run directory (`mod.rs`) or read the nodes' run logs (`outcome.rs`).

use super::{SwarmOptions, faults, netns, read_run_log};
use crate::scenario::Scenario;
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
/// Resident set size of a process in KiB (Linux; 0 elsewhere or once it has exited).
pub(super) fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Starts `exe node --config <config>` with its log (stderr) in `log`.
pub fn start_node(exe: &Path, config: &Path, log: &Path) -> anyhow::Result<std::process::Child> {
    spawn_node(std::process::Command::new(exe), exe, config, log)
}

/// Starts silo `silo`'s node, inside its network namespace when there is one.
pub(super) fn start_silo(
    ns: Option<&netns::Netns>,
    silo: usize,
    exe: &Path,
    config: &Path,
    log: &Path,
) -> anyhow::Result<std::process::Child> {
    match ns {
        Some(ns) => spawn_node(ns.command(silo, exe), exe, config, log),
        None => start_node(exe, config, log),
    }
}

pub(super) fn spawn_node(
    mut command: std::process::Command,
    exe: &Path,
    config: &Path,
    log: &Path,
) -> anyhow::Result<std::process::Child> {
    command
        .arg("node")
        .arg("--config")
        .arg(config)
        .env("RAYON_NUM_THREADS", "1")
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| {
            format!(
                "starting {} node --config {}",
                exe.display(),
                config.display()
            )
        })
}

/// Follows the nodes until all have exited, showing progress; Ctrl-C stops them.
pub(super) fn watch(
    procs: &mut [Proc],
    scenario: &Scenario,
    seed: u64,
    opts: &SwarmOptions,
    started: Instant,
    first_round: &mut Option<Duration>,
    mut faults: Option<&mut faults::FaultDriver>,
) -> anyhow::Result<()> {
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = interrupted.clone();
    // SIGINT while the swarm runs: stop the nodes cleanly (they checkpoint), then report.
    let _ = ctrlc_hook(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
    let total = scenario.rounds as u64 * procs.len() as u64;
    let bar = if opts.progress {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {msg}")
                .expect("the template is a valid constant"),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    loop {
        let mut done = 0u64;
        let mut min_round = u64::MAX;
        let mut logged = 0u64;
        let mut acc = Vec::new();
        for p in procs.iter_mut() {
            if p.status.is_none() {
                p.max_rss_kib = p.max_rss_kib.max(rss_kib(p.child.id()));
                p.status = p.child.try_wait()?;
            }
            let rounds = read_run_log(&p.run_log).unwrap_or_default();
            logged = logged.max(rounds.last().map_or(0, |r| r.round));
            done += rounds.len() as u64;
            min_round = min_round.min(rounds.len() as u64);
            if let Some(e) = rounds.iter().rev().find_map(|r| r.eval) {
                acc.push(e.correct as f64 / e.count.max(1) as f64);
            }
        }
        bar.set_position(done);
        if first_round.is_none() && min_round >= 1 && min_round != u64::MAX {
            *first_round = Some(started.elapsed());
        }
        let mean_acc = if acc.is_empty() {
            String::new()
        } else {
            format!(
                "  federico {:.1}%",
                100.0 * acc.iter().sum::<f64>() / acc.len() as f64
            )
        };
        bar.set_message(format!(
            "seed {seed}: {} nodes, slowest at round {}/{}{mean_acc}",
            procs.len(),
            if min_round == u64::MAX { 0 } else { min_round },
            scenario.rounds
        ));
        if let Some(f) = faults.as_deref_mut() {
            // With nobody running, a restart due at a round would wait for ever: fire it.
            let idle = procs.iter().all(|p| p.status.is_some());
            f.tick(procs, if idle { u64::MAX - 1 } else { logged })?;
        }
        let pending = faults.as_deref().is_some_and(|f| f.pending());
        if procs.iter().all(|p| p.status.is_some()) && !pending {
            break;
        }
        if let Some(p) = procs.iter().find(|p| p.status.is_some() && !p.ended_well()) {
            bar.finish_and_clear();
            bail!(
                "node {} exited {}; stopping the swarm. Its log ({}):\n{}",
                p.name,
                p.status.map(|s| s.to_string()).unwrap_or_default(),
                p.log.display(),
                tail(&p.log, 12)
            );
        }
        if interrupted.load(std::sync::atomic::Ordering::SeqCst) {
            bar.finish_and_clear();
            bail!("interrupted: nodes stopped; their checkpoints and logs are in place");
        }
        if started.elapsed() > opts.timeout {
            bar.finish_and_clear();
            bail!("the swarm did not finish within {:?}", opts.timeout);
        }
        // A pending fault is fired within a few milliseconds of its round.
        let pause = if pending { 10 } else { 200 };
        std::thread::sleep(Duration::from_millis(pause));
    }
    bar.finish_and_clear();
    Ok(())
}

/// Installs a SIGINT and SIGTERM handler that runs `f` (once per signal) instead of killing
/// the launcher, so its nodes, relay and network namespaces are stopped and removed, not left
/// behind.
pub(super) fn ctrlc_hook(f: impl Fn() + Send + 'static) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("sigint".into())
        .spawn(move || rt.block_on(on_signals(f)))?;
    Ok(())
}

/// Runs `f` on every SIGINT or SIGTERM (until the signals cannot be listened to).
async fn on_signals(f: impl Fn()) -> std::io::Result<()> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        #[cfg(unix)]
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = term.recv() => {}
        }
        #[cfg(not(unix))]
        tokio::signal::ctrl_c().await?;
        f();
    }
}

/// SIGTERM to every node still running, then SIGKILL after a grace period.
pub(super) fn stop_all(procs: &mut [Proc]) {
    for p in procs.iter_mut().filter(|p| p.status.is_none()) {
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe {
            libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM);
        }
    }
    let grace = Instant::now() + Duration::from_secs(10);
    while Instant::now() < grace && procs.iter().any(|p| p.status.is_none()) {
        for p in procs.iter_mut().filter(|p| p.status.is_none()) {
            p.status = p.child.try_wait().ok().flatten();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in procs.iter_mut().filter(|p| p.status.is_none()) {
        let _ = p.child.kill();
        p.status = p.child.wait().ok();
    }
}

pub(super) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A started node process.
pub(super) struct Proc {
    pub(super) name: String,
    pub(super) child: std::process::Child,
    pub(super) log: PathBuf,
    pub(super) run_log: PathBuf,
    pub(super) status: Option<std::process::ExitStatus>,
    /// Largest resident set seen while it ran (KiB, from /proc).
    pub(super) max_rss_kib: u64,
    /// How each earlier process of this silo ended (a schedule's crashes).
    pub(super) lives: Vec<String>,
    /// Every log this silo's processes wrote.
    pub(super) logs: Vec<PathBuf>,
    /// Killed by the fault schedule and not (yet) restarted, or told to leave.
    pub(super) by_schedule: bool,
}

impl Proc {
    pub(super) fn new(
        name: String,
        child: std::process::Child,
        log: PathBuf,
        run_log: PathBuf,
    ) -> Self {
        Self {
            name,
            child,
            logs: vec![log.clone()],
            log,
            run_log,
            status: None,
            max_rss_kib: 0,
            lives: Vec::new(),
            by_schedule: false,
        }
    }

    pub(super) fn is_running(&self) -> bool {
        self.status.is_none()
    }

    /// SIGKILL now, as a crash.
    pub(super) fn kill_by_schedule(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
        self.lives.push("killed by the schedule".into());
        self.by_schedule = true;
    }

    /// SIGTERM: a clean stop for good.
    pub(super) fn leave(&mut self) {
        if self.status.is_none() {
            // SAFETY: kill(2) on a child we started and have not reaped.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        self.by_schedule = true;
    }

    /// A silo that joins late: nothing runs until the schedule starts it ([`Self::join`]).
    pub(super) fn absent(
        exe: &Path,
        name: String,
        log: PathBuf,
        run_log: PathBuf,
    ) -> anyhow::Result<Self> {
        // A stand-in process that exits at once, so every `Proc` owns a child.
        let child = std::process::Command::new(exe)
            .arg("--help")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut p = Self::new(name, child, log, run_log);
        p.status = p.child.wait().ok();
        p.logs.clear();
        p.by_schedule = true;
        Ok(p)
    }

    /// The late joiner's first process.
    pub(super) fn join(&mut self, child: std::process::Child, log: PathBuf) {
        self.relaunch(child, log);
    }

    /// A new process for the same silo (same config, key, state directory).
    pub(super) fn relaunch(&mut self, child: std::process::Child, log: PathBuf) {
        self.child = child;
        self.status = None;
        self.by_schedule = false;
        self.logs.push(log.clone());
        self.log = log;
    }

    /// Ended as it should: success, or stopped by the schedule.
    pub(super) fn ended_well(&self) -> bool {
        self.status.is_some_and(|s| s.success()) || (self.by_schedule && self.status.is_some())
    }
}
