//! A fault schedule applied to real node processes (`federico swarm`, issue 4).
//!
//! Owns: firing each event of the schedule when its trigger holds (the federation's round, read
//! from the nodes' run logs, or seconds since the swarm started), and applying it: partitions
//! and heals as `block`/`unblock` commands on each node's control channel (real disconnections:
//! the nodes close and refuse the connections), delays and message loss as `delay`/`loss`
//! commands (each node holds back or drops what it sends), crashes as SIGKILL followed by a
//! read of the silo's checkpoint, restarts with the same config and key (what is in force is
//! imposed on the new process), leaves as SIGTERM. It records what
//! it applied, when, on the nodes' clock (Unix seconds), for the checks.
//! Must not: take part in a round, or judge the outcome (`faults::checks` does).

use super::netns::Netns;
use super::{Proc, start_silo};
use crate::faults::checks::{Applied, CrashEvidence};
use crate::faults::{Fault, Restart, Schedule, Trigger};
use crate::net::Checkpoint;
use crate::net::control;
use anyhow::{Context, bail};
use libp2p::PeerId;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// When a pending restart is due.
#[derive(Clone, Copy, Debug)]
enum Due {
    Round(u64),
    At(Instant),
}

/// The schedule's state during one seed of a swarm.
pub(crate) struct FaultDriver {
    schedule: Schedule,
    token: String,
    peer_ids: Vec<PeerId>,
    configs: Vec<PathBuf>,
    state_dirs: Vec<PathBuf>,
    nodes_dir: PathBuf,
    exe: PathBuf,
    started: Instant,
    next: usize,
    restarts: Vec<(Due, usize)>,
    /// Each silo's partition group while a partition is in force.
    groups: Option<Vec<usize>>,
    /// Each silo's delay in force, in milliseconds.
    delays: Vec<u64>,
    /// The message loss in force: fraction and the silos it is limited to.
    loss: Option<(f64, Option<Vec<u32>>)>,
    /// Each silo's poisoning attack in force, of those timed in seconds.
    attacks: Vec<Option<crate::silo::attack::Attack>>,
    /// The nodes' network namespaces (`--netns`): partitions are cut there, in the kernel.
    netns: Option<std::sync::Arc<Netns>>,
    pub(crate) applied: Vec<Applied>,
    pub(crate) crashes: Vec<CrashEvidence>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Each silo's attacks triggered by round, for its config's `[control] attacks`: the node
/// starts each at its own round, as the simulator's silo does.
pub(crate) fn attack_plans(schedule: &Schedule) -> Vec<Vec<control::PlannedAttack>> {
    let mut plans = vec![Vec::new(); schedule.clients];
    for e in &schedule.events {
        if let (Trigger::Round(r), Fault::Attack { silos, attack }) = (e.trigger, &e.fault) {
            for &s in silos {
                plans[s as usize].push(control::PlannedAttack::new(r, attack.as_ref()));
            }
        }
    }
    plans
}

/// Writes a fresh random token for the nodes' control channels (mode 0600) and returns it.
pub(crate) fn write_token(path: &Path) -> anyhow::Result<String> {
    use rand::RngExt;
    let mut rng = rand::rng();
    let token: String = (0..32)
        .map(|_| format!("{:x}", rng.random_range(0..16u8)))
        .collect();
    std::fs::write(path, &token).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(token)
}

impl FaultDriver {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        schedule: Schedule,
        token: String,
        peer_ids: Vec<PeerId>,
        configs: Vec<PathBuf>,
        state_dirs: Vec<PathBuf>,
        nodes_dir: PathBuf,
        exe: PathBuf,
        netns: Option<std::sync::Arc<Netns>>,
    ) -> Self {
        let k = peer_ids.len();
        Self {
            schedule,
            token,
            peer_ids,
            configs,
            state_dirs,
            nodes_dir,
            exe,
            started: Instant::now(),
            next: 0,
            restarts: Vec::new(),
            groups: None,
            delays: vec![0; k],
            loss: None,
            attacks: vec![None; k],
            netns,
            applied: Vec::new(),
            crashes: Vec::new(),
        }
    }

    /// Whether an event or restart is still to come (the launcher then polls faster).
    pub(crate) fn pending(&self) -> bool {
        self.next < self.schedule.events.len() || !self.restarts.is_empty()
    }

    /// Fires what is due. `logged` is the highest round any node has logged.
    pub(crate) fn tick(&mut self, procs: &mut [Proc], logged: u64) -> anyhow::Result<()> {
        let now = Instant::now();
        let due = |d: Due| match d {
            Due::Round(r) => logged + 1 >= r,
            Due::At(t) => now >= t,
        };
        let ready: Vec<usize> = self
            .restarts
            .iter()
            .filter(|(d, _)| due(*d))
            .map(|x| x.1)
            .collect();
        self.restarts.retain(|(d, _)| !due(*d));
        for silo in ready {
            self.restart(procs, silo)?;
        }
        while let Some(e) = self.schedule.events.get(self.next) {
            let fire = match e.trigger {
                Trigger::Round(r) => due(Due::Round(r)),
                Trigger::Seconds(s) => now >= self.started + Duration::from_secs_f64(s),
            };
            if !fire {
                break;
            }
            let fault = e.fault.clone();
            self.next += 1;
            if let (Trigger::Round(_), Fault::Attack { .. }) = (e.trigger, &fault) {
                // The attackers' configs carry it ([`attack_plans`]): each starts it at its own
                // round, whenever the launcher reads the logs. Recorded here, as seen.
                self.applied.push(Applied {
                    at: unix_now(),
                    fault,
                });
                continue;
            }
            self.apply(procs, &fault, logged + 1)?;
        }
        Ok(())
    }

    fn control_addr(&self, silo: usize) -> anyhow::Result<String> {
        let path = self.state_dirs[silo].join("control.addr");
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(a) = std::fs::read_to_string(&path) {
                if !a.trim().is_empty() {
                    return Ok(a.trim().to_string());
                }
            }
            if Instant::now() > until {
                bail!(
                    "silo {silo} never opened its control channel ({})",
                    path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Blocks, on `silo`, every peer outside its partition group: in the kernel of its
    /// namespace (`--netns`), else by its block list.
    fn cut(&self, silo: usize, groups: &[usize]) -> anyhow::Result<()> {
        let apart: Vec<usize> = (0..self.peer_ids.len())
            .filter(|&j| groups[j] != groups[silo])
            .collect();
        if let Some(ns) = &self.netns {
            return ns
                .cut(silo, &apart)
                .with_context(|| format!("cutting silo {silo} off in the kernel"));
        }
        let others: Vec<PeerId> = apart.iter().map(|&j| self.peer_ids[j]).collect();
        control::send(&self.control_addr(silo)?, &self.token, "block", &others)
            .map_err(|e| anyhow::anyhow!("blocking on silo {silo}: {e}"))?;
        Ok(())
    }

    /// Tells `silo` its scheduled delay.
    fn send_delay(&self, silo: usize) -> anyhow::Result<()> {
        let extra = serde_json::json!({ "ms": self.delays[silo] });
        control::send_with(&self.control_addr(silo)?, &self.token, "delay", &[], extra)
            .map_err(|e| anyhow::anyhow!("setting the delay of silo {silo}: {e}"))?;
        Ok(())
    }

    /// Tells `silo` the loss in force on what it sends: to every peer when no silos are named
    /// or `silo` is one of them, else to the named silos only (the loss is "to or from" them).
    fn send_loss(&self, silo: usize) -> anyhow::Result<()> {
        let Some((fraction, silos)) = &self.loss else {
            return Ok(());
        };
        let peers: Vec<PeerId> = match silos {
            Some(named) if !named.contains(&(silo as u32)) => {
                named.iter().map(|&j| self.peer_ids[j as usize]).collect()
            }
            _ => Vec::new(),
        };
        let extra = serde_json::json!({ "fraction": fraction });
        control::send_with(
            &self.control_addr(silo)?,
            &self.token,
            "loss",
            &peers,
            extra,
        )
        .map_err(|e| anyhow::anyhow!("setting the message loss on silo {silo}: {e}"))?;
        Ok(())
    }

    /// Tells `silo` the attack it plays (or that it plays none).
    fn send_attack(&self, silo: usize) -> anyhow::Result<()> {
        let extra = match &self.attacks[silo] {
            None => serde_json::json!({ "kind": "none" }),
            Some(a) => serde_json::to_value(a)?,
        };
        control::send_with(&self.control_addr(silo)?, &self.token, "attack", &[], extra)
            .map_err(|e| anyhow::anyhow!("setting the attack of silo {silo}: {e}"))?;
        Ok(())
    }

    /// What is in force applies to a process that starts late or again: the partition, its
    /// delay, the message loss and its attack timed in seconds (one by round is in its config).
    fn impose(&self, silo: usize) -> anyhow::Result<()> {
        if let Some(g) = &self.groups {
            self.cut(silo, g)?;
        }
        if self.delays[silo] > 0 {
            self.send_delay(silo)?;
        }
        if self.loss.as_ref().is_some_and(|l| l.0 > 0.0) {
            self.send_loss(silo)?;
        }
        if self.attacks[silo].is_some() {
            self.send_attack(silo)?;
        }
        Ok(())
    }

    fn apply(&mut self, procs: &mut [Proc], fault: &Fault, round: u64) -> anyhow::Result<()> {
        let k = self.peer_ids.len();
        match fault {
            Fault::Partition(groups) => {
                let mut g = vec![0; k];
                for (n, members) in groups.iter().enumerate() {
                    for &s in members {
                        g[s as usize] = n;
                    }
                }
                for silo in (0..k).filter(|&s| procs[s].is_running()) {
                    self.cut(silo, &g)?;
                }
                self.groups = Some(g);
            }
            Fault::Heal if self.netns.is_some() => {
                // Routes live in the namespaces: restore them whether the node runs or not.
                let ns = self.netns.as_ref().expect("checked");
                for silo in 0..k {
                    ns.restore(silo)
                        .with_context(|| format!("healing silo {silo} in the kernel"))?;
                }
                self.groups = None;
            }
            Fault::Heal => {
                for silo in (0..k).filter(|&s| procs[s].is_running()) {
                    let addr = self.control_addr(silo)?;
                    control::send(&addr, &self.token, "unblock", &self.peer_ids)
                        .map_err(|e| anyhow::anyhow!("unblocking on silo {silo}: {e}"))?;
                }
                self.groups = None;
            }
            Fault::Crash { silo, restart } => {
                let s = *silo as usize;
                procs[s].kill_by_schedule();
                let checkpoint = Checkpoint::read(&self.state_dirs[s].join("checkpoint.bin"));
                let peer_ids = match &checkpoint {
                    Ok(Some(c)) => Some((self.peer_ids[s].to_string(), c.peer_id.clone())),
                    _ => None,
                };
                self.crashes.push(CrashEvidence {
                    silo: *silo,
                    checkpoint: checkpoint.map(|c| c.map(|c| c.round)),
                    peer_ids,
                });
                match restart {
                    Some(Restart::Rounds(d)) => self.restarts.push((Due::Round(round + d), s)),
                    Some(Restart::Seconds(t)) => self
                        .restarts
                        .push((Due::At(Instant::now() + Duration::from_secs_f64(*t)), s)),
                    None => {}
                }
            }
            Fault::Leave(silo) => procs[*silo as usize].leave(),
            Fault::Join(silo) => {
                // The silo's first process: its state directory is fresh.
                let s = *silo as usize;
                let log = self.nodes_dir.join(format!("{}.log", procs[s].name));
                let child =
                    start_silo(self.netns.as_deref(), s, &self.exe, &self.configs[s], &log)?;
                procs[s].join(child, log);
                self.impose(s)?;
            }
            Fault::Delay { silo, ms } => {
                let s = *silo as usize;
                self.delays[s] = *ms;
                if procs[s].is_running() {
                    self.send_delay(s)?;
                }
            }
            Fault::Loss { fraction, silos } => {
                self.loss = Some((*fraction, silos.clone()));
                for s in (0..k).filter(|&s| procs[s].is_running()) {
                    self.send_loss(s)?;
                }
            }
            Fault::Attack { silos, attack } => {
                for &s in silos {
                    self.attacks[s as usize] = attack.clone();
                    if procs[s as usize].is_running() {
                        self.send_attack(s as usize)?;
                    }
                }
            }
            Fault::Restart(_) => bail!("restart is not an event of a schedule file"),
            Fault::CoordinatorCrash { .. } | Fault::CoordinatorRestart => {
                bail!("a FedeRiCo swarm has no coordinator to crash")
            }
        }
        self.applied.push(Applied {
            at: unix_now(),
            fault: fault.clone(),
        });
        Ok(())
    }

    fn restart(&mut self, procs: &mut [Proc], silo: usize) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(self.state_dirs[silo].join("control.addr"));
        let life = procs[silo].lives.len() + 1;
        let log = self
            .nodes_dir
            .join(format!("{}.{life}.log", procs[silo].name));
        let child = start_silo(
            self.netns.as_deref(),
            silo,
            &self.exe,
            &self.configs[silo],
            &log,
        )?;
        procs[silo].relaunch(child, log);
        self.impose(silo)?;
        self.applied.push(Applied {
            at: unix_now(),
            fault: Fault::Restart(silo as u32),
        });
        Ok(())
    }
}
