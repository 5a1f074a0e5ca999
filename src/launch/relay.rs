//! The relay of a swarm behind NAT (`federico swarm --nat`): `federico relay` in its namespace,
//! with the swarm's manifest, kept up for as long as the nodes run. A relay that dies (killed
//! by a test, or crashed) is started again at once with the same key and port, as an operator's
//! service manager would; its log (`nodes/relay.log`) runs on, and `nodes/relay.pid` names the
//! process of the moment.
//!
//! Owns: starting, watching, restarting and stopping the relay process.
//! Must not: touch the namespaces (`netns`) or the nodes.

use super::netns::Netns;
use super::procs::tail;
use anyhow::{Context, bail};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The relay's port behind NAT (TCP and QUIC).
pub(super) const RELAY_PORT: u16 = 4100;

/// The running relay; stopped when dropped.
pub(super) struct Relay {
    stop: Arc<AtomicBool>,
    child: Arc<Mutex<Child>>,
    watcher: Option<JoinHandle<()>>,
}

/// How to start the relay again: `ip` and its arguments, the log and the pid file.
struct Launch {
    args: Vec<OsString>,
    log: PathBuf,
    pid: PathBuf,
}

impl Launch {
    fn spawn(&self) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new("ip")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting federico relay")?;
        std::fs::write(&self.pid, child.id().to_string())?;
        Ok(child)
    }

    /// Times the relay has logged that it started.
    fn starts(&self) -> usize {
        std::fs::read_to_string(&self.log).map_or(0, |l| l.matches("relay started").count())
    }
}

impl Relay {
    /// Starts the relay in `ns`'s relay namespace and returns once it listens.
    pub(super) fn start(ns: &Netns, exe: &Path, dir: &Path) -> anyhow::Result<Self> {
        let r = ns.relay_addr();
        let mut args: Vec<OsString> = vec![
            "netns".into(),
            "exec".into(),
            ns.relay_namespace().into(),
            exe.into(),
            "relay".into(),
            "--key".into(),
            dir.join("keys").join("relay.key").into(),
            "--manifest".into(),
            dir.join("manifest.toml").into(),
        ];
        for a in [
            format!("--listen=/ip4/0.0.0.0/tcp/{RELAY_PORT}"),
            format!("--listen=/ip4/0.0.0.0/udp/{RELAY_PORT}/quic-v1"),
            format!("--external=/ip4/{r}/tcp/{RELAY_PORT}"),
            format!("--external=/ip4/{r}/udp/{RELAY_PORT}/quic-v1"),
        ] {
            args.push(a.into());
        }
        let launch = Launch {
            args,
            log: dir.join("nodes").join("relay.log"),
            pid: dir.join("nodes").join("relay.pid"),
        };
        let mut child = launch.spawn()?;
        let until = Instant::now() + Duration::from_secs(10);
        while launch.starts() == 0 {
            if let Some(status) = child.try_wait()? {
                bail!("the relay exited {status}:\n{}", tail(&launch.log, 8));
            }
            if Instant::now() > until {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the relay did not start within 10 s:\n{}",
                    tail(&launch.log, 8)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let child = Arc::new(Mutex::new(child));
        let watcher = {
            let (stop, child) = (stop.clone(), child.clone());
            std::thread::spawn(move || keep_up(&launch, &stop, &child))
        };
        Ok(Self {
            stop,
            child,
            watcher: Some(watcher),
        })
    }
}

/// Restarts the relay whenever it exits, until `stop`.
fn keep_up(launch: &Launch, stop: &AtomicBool, child: &Mutex<Child>) {
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        let mut c = child.lock().unwrap_or_else(|e| e.into_inner());
        if stop.load(Ordering::SeqCst) {
            return;
        }
        if let Ok(Some(status)) = c.try_wait() {
            tracing::warn!("the relay exited ({status}); starting it again");
            match launch.spawn() {
                Ok(next) => *c = next,
                Err(e) => {
                    tracing::warn!("the relay could not be started again: {e:#}");
                    return;
                }
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        {
            let mut c = self.child.lock().unwrap_or_else(|e| e.into_inner());
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }
}
