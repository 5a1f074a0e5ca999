//! Fault schedules: what should go wrong in a run, and when (issue 4).
//!
//! Owns: the `[faults]` schema of a scenario file (partition, heal, crash and restart, delay,
//! message loss, leave, late join; triggers by round or, for the swarm, by time), its validation
//! against the federation's size, the [`Timeline`] that says for every round which silos are up,
//! which can reach which and how late or lossy each one is, and the pass/fail [`checks`] computed
//! from the per-round traces both drivers write. The round-by-round
//! [`Timeline`] lives in `timeline.rs`; what a lossy or slow link does to one message, the
//! rule both drivers follow, in `link.rs`.
//! Must not: apply anything. The simulator (`sim`) and the swarm launcher (`launch`) apply a
//! schedule, each in its own way; this module only describes it and judges the outcome.
//!
//! A schedule in a scenario file:
//!
//! ```toml
//! [faults]
//! model_deadline_s = 2.0      # τ_model of every node (both drivers)
//! gradient_deadline_s = 2.0   # τ_grad
//!
//! [[faults.events]]
//! round = 20                  # or at_s = 12.5: seconds after the swarm started the nodes (swarm only)
//! partition = [[0, 1, 2, 3], [4, 5, 6, 7]]
//!
//! [[faults.events]]
//! round = 50
//! heal = true
//!
//! [[faults.events]]
//! round = 30
//! crash = { silo = 5, restart_after_rounds = 3 }   # or restart_after_s = 10 (swarm)
//!
//! [[faults.events]]
//! round = 10
//! delay = { silo = 2, ms = 3000 }   # ms = 0 ends it
//!
//! [[faults.events]]
//! round = 10
//! loss = { fraction = 0.1 }         # silos = [2] limits it to messages to or from silo 2
//!
//! [[faults.events]]
//! round = 40
//! leave = 6
//!
//! [[faults.events]]
//! round = 15
//! join = 7                           # silo 7 is absent until round 15
//!
//! [[faults.events]]
//! round = 5
//! attack = { silos = [3], kind = "scale", factor = 1e6 }   # kind = "none" ends it
//!
//! [[faults.events]]
//! round = 20
//! coordinator_crash = { restart_after_rounds = 3 }   # FedDisco, HCCT, FedSaC (simulator)
//! ```
//!
//! FedDisco, HCCT, FedSaC and FedCollab take `delay`, `loss`, `leave` and `coordinator_crash`
//! (FedDisco, HCCT and FedSaC `attack` too: the model sent is poisoned), with their own deadlines (`update_deadline_s`, `fetch_s`, `excuse_rounds`) and checks
//! ([`checks::evaluate_coordinated`], FedCollab's [`checks::evaluate_collab`]).
//!
//! Attack kinds ([`Attack`], carried out by `crate::silo::attack`): `sign_flip` (factor optional), `scale` (factor),
//! `noise` (factor: its norm over the honest gradient's), `extreme`, `stale`, `free_ride`,
//! `labels`. The attacking silos' own gradients stay honest.

mod attack;
pub mod checks;
pub mod link;
#[cfg(test)]
mod tests;
mod timeline;

pub use attack::Attack;
pub use timeline::{NetState, Presence, Timeline};

use serde::{Deserialize, Serialize};

/// The `[faults]` section of a scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultsConfig {
    /// τ_model: how long a sampler waits for a pulled model (both drivers; the simulator
    /// counts a model that would come later as a timeout).
    pub model_deadline_s: f64,
    /// τ_grad: how long an owner waits for the gradients it expects.
    pub gradient_deadline_s: f64,
    /// Also run the same seed without faults, for the recovery check's accuracy comparison.
    pub baseline: bool,
    /// After a heal, cross-side sampling must resume within this many rounds.
    pub recovery_rounds: u64,
    /// Final accuracy must be within this many points of the fault-free run.
    pub accuracy_tolerance: f64,
    /// A late joiner must be sampled by a peer of its own group within this many rounds.
    pub join_rounds: u64,
    /// Under an attack, the honest silos' final accuracy must be within this many points of
    /// the fault-free run's.
    pub attack_tolerance: f64,
    /// Coordinated runs (simulator): τ, how long a coordinator round waits for updates.
    pub update_deadline_s: f64,
    /// Coordinated runs (simulator): a silo's budget per round for registering and fetching.
    pub fetch_s: f64,
    /// Coordinated runs (simulator): the coordinator's first excuse of a member whose absence
    /// made a round time out, in rounds (0: nobody is excused).
    pub excuse_rounds: u64,
    /// The events, in the order they happen.
    pub events: Vec<EventSpec>,
    /// `[faults.links]`: a wide-area network between the silos, for the whole run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub links: Option<LinksConfig>,
}

/// `[faults.links]`: every silo sits at a site; a message from one silo to another takes the
/// one-way latency between their sites, a jitter, and its bytes at the link speed, queued
/// behind what the sender sent on that link before it ([`link::Wire`]). FedeRiCo runs only,
/// in both drivers. Loss is the `loss` event's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinksConfig {
    /// Each silo's site, from 0, one entry per silo.
    pub sites: Vec<usize>,
    /// One-way latency from site a (row) to site b (column), in milliseconds; the diagonal is
    /// between two silos of one site.
    pub one_way_ms: Vec<Vec<f64>>,
    /// Added latency per message, uniform in [0, jitter_ms).
    #[serde(default)]
    pub jitter_ms: f64,
    /// Each directed link's speed in Mbit/s (absent: bytes take no time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mbit_s: Option<f64>,
}

impl LinksConfig {
    /// Checks the table against a federation of `clients` silos; the error names the field.
    pub fn check(&self, clients: usize) -> Result<(), String> {
        if self.sites.len() != clients {
            return Err(format!(
                "faults.links.sites lists {} silos; the federation has {clients}",
                self.sites.len()
            ));
        }
        let n = self.one_way_ms.len();
        if let Some(s) = self.sites.iter().find(|&&s| s >= n) {
            return Err(format!(
                "faults.links.sites names site {s}, but one_way_ms has rows for sites 0 to {}",
                n.saturating_sub(1)
            ));
        }
        for (a, row) in self.one_way_ms.iter().enumerate() {
            if row.len() != n {
                return Err(format!(
                    "faults.links.one_way_ms must be square: row {a} has {} entries, not {n}",
                    row.len()
                ));
            }
            if let Some(v) = row
                .iter()
                .find(|v| !(v.is_finite() && **v >= 0.0 && **v <= 60e3))
            {
                return Err(format!(
                    "faults.links.one_way_ms must hold milliseconds in [0, 60000], got {v} in row {a}"
                ));
            }
        }
        if !(self.jitter_ms.is_finite() && (0.0..=60e3).contains(&self.jitter_ms)) {
            return Err(format!(
                "faults.links.jitter_ms must be in [0, 60000] ms, got {}",
                self.jitter_ms
            ));
        }
        if let Some(m) = self.mbit_s
            && !(m.is_finite() && m > 0.0)
        {
            return Err(format!(
                "faults.links.mbit_s must be a positive number of Mbit/s, got {m}"
            ));
        }
        Ok(())
    }

    /// The link from silo `from` to silo `to`.
    pub fn link(&self, from: usize, to: usize) -> link::Wan {
        let ms = self.one_way_ms[self.sites[from]][self.sites[to]];
        link::Wan {
            one_way: std::time::Duration::from_secs_f64(ms / 1e3),
            jitter: std::time::Duration::from_secs_f64(self.jitter_ms / 1e3),
            bits_per_s: self.mbit_s.map_or(f64::INFINITY, |m| m * 1e6),
        }
    }
}

impl Default for FaultsConfig {
    fn default() -> Self {
        Self {
            model_deadline_s: 2.0,
            gradient_deadline_s: 2.0,
            baseline: true,
            recovery_rounds: 5,
            accuracy_tolerance: 2.0,
            join_rounds: 10,
            attack_tolerance: 1.0,
            update_deadline_s: 30.0,
            fetch_s: 20.0,
            excuse_rounds: 100,
            events: Vec::new(),
            links: None,
        }
    }
}

/// One `[[faults.events]]` entry as written: one trigger and exactly one action.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// Fires when the federation starts this round (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u64>,
    /// Fires this many seconds after the swarm started the nodes (swarm only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_s: Option<f64>,
    /// Groups of silos that can reach only each other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<Vec<Vec<u32>>>,
    /// `true`: end the partition in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heal: Option<bool>,
    /// Kill a silo (SIGKILL in the swarm), optionally restarting it later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash: Option<CrashSpec>,
    /// Add latency to everything a silo sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<DelaySpec>,
    /// Drop a fraction of messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<LossSpec>,
    /// A silo leaves for good (a clean stop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leave: Option<u32>,
    /// A silo absent so far starts now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<u32>,
    /// Members start (or, with `kind = "none"`, stop) poisoning what they send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attack: Option<AttackSpec>,
    /// The coordinator of FedDisco, HCCT, FedSaC and FedCollab runs is killed (simulator only), and maybe
    /// restarted from its checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator_crash: Option<CoordinatorCrashSpec>,
}

/// `coordinator_crash = { restart_after_rounds = 3 }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorCrashSpec {
    /// Restart it when the federation has run this many more rounds (never if absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_after_rounds: Option<u64>,
}

/// `attack = { silos = [3, 6], kind = "scale", factor = 10 }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttackSpec {
    /// The attacking silos.
    pub silos: Vec<u32>,
    /// `sign_flip`, `scale`, `noise`, `extreme`, `stale`, `free_ride`, `labels`, or `none`.
    pub kind: String,
    /// The kind's magnitude (`scale`, `noise`, `sign_flip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
}

/// `crash = { silo = 5, restart_after_rounds = 3 }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrashSpec {
    /// The silo killed.
    pub silo: u32,
    /// Restart it when the federation has run this many more rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_after_rounds: Option<u64>,
    /// Restart it this many seconds later (swarm only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_after_s: Option<f64>,
}

/// `delay = { silo = 2, ms = 3000 }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelaySpec {
    /// The slow silo.
    pub silo: u32,
    /// Added latency on everything it sends, in milliseconds (0 ends a delay).
    pub ms: u64,
}

/// `loss = { fraction = 0.1, silos = [2] }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossSpec {
    /// Fraction of messages dropped, in [0, 1) (0 ends a loss).
    pub fraction: f64,
    /// Only messages sent by or to these silos (default: every message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silos: Option<Vec<u32>>,
}

/// When an event fires.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trigger {
    /// When the federation starts this round.
    Round(u64),
    /// Seconds after the swarm started the nodes (swarm only).
    Seconds(f64),
}

/// When a crashed silo comes back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Restart {
    /// After this many federation rounds.
    Rounds(u64),
    /// After this many seconds (swarm only).
    Seconds(f64),
}

/// What happens.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Groups of silos that can reach only each other; every present silo is in one group.
    Partition(Vec<Vec<u32>>),
    /// The partition in force ends.
    Heal,
    /// A silo is killed, and maybe restarted from its checkpoint with the same key.
    Crash {
        /// The silo.
        silo: u32,
        /// When it comes back (never if `None`).
        restart: Option<Restart>,
    },
    /// Added latency on everything `silo` sends.
    Delay {
        /// The silo.
        silo: u32,
        /// Milliseconds (0 ends it).
        ms: u64,
    },
    /// A fraction of messages is dropped.
    Loss {
        /// In [0, 1).
        fraction: f64,
        /// Only messages to or from these silos (`None`: all).
        silos: Option<Vec<u32>>,
    },
    /// A silo stops for good.
    Leave(u32),
    /// An absent silo starts.
    Join(u32),
    /// A crashed silo is started again (never written in a file: it follows from a crash's
    /// restart delay; drivers report it when they apply it).
    Restart(u32),
    /// Silos start poisoning what they send (`Some`) or stop (`None`).
    Attack {
        /// The attackers.
        silos: Vec<u32>,
        /// What they do.
        attack: Option<Attack>,
    },
    /// The coordinator of a FedDisco, HCCT or FedSaC run is killed, and restarted from its
    /// checkpoint after `restart_after` rounds (never if `None`).
    CoordinatorCrash {
        /// Federation rounds until the restart.
        restart_after: Option<u64>,
    },
    /// The crashed coordinator is started again (never written in a file: it follows from
    /// the crash's restart delay).
    CoordinatorRestart,
}

impl Fault {
    /// A short name for reports: `partition`, `heal`, `crash`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Partition(_) => "partition",
            Fault::Heal => "heal",
            Fault::Crash { .. } => "crash",
            Fault::Delay { .. } => "delay",
            Fault::Loss { .. } => "loss",
            Fault::Leave(_) => "leave",
            Fault::Join(_) => "join",
            Fault::Restart(_) => "restart",
            Fault::Attack { .. } => "attack",
            Fault::CoordinatorCrash { .. } => "coordinator_crash",
            Fault::CoordinatorRestart => "coordinator_restart",
        }
    }

    /// The one silo the event is about, if any.
    pub fn silo(&self) -> Option<u32> {
        match self {
            Fault::Crash { silo, .. } | Fault::Delay { silo, .. } => Some(*silo),
            Fault::Leave(s) | Fault::Join(s) | Fault::Restart(s) => Some(*s),
            _ => None,
        }
    }
}

/// One validated event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// When.
    pub trigger: Trigger,
    /// What.
    pub fault: Fault,
}

/// A validated schedule for a federation of `clients` silos.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Silos in the federation (late joiners included).
    pub clients: usize,
    /// The events, in firing order.
    pub events: Vec<Event>,
    /// The `[faults]` settings.
    pub config: FaultsConfig,
}

impl Schedule {
    /// Whether the run is fault-free: no event and no wide-area links.
    pub fn is_empty(&self) -> bool {
        self.config.is_empty()
    }

    /// The wide-area links, if the run has them.
    pub fn links(&self) -> Option<&LinksConfig> {
        self.config.links.as_ref()
    }
}

impl FaultsConfig {
    /// Whether nothing is scheduled: no event, no wide-area links.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.links.is_none()
    }

    /// Checks the settings and every event against a federation of `clients` silos; the error
    /// names the event (1-based, in file order) and what is wrong with it.
    pub fn schedule(&self, clients: usize) -> Result<Schedule, String> {
        for (name, v) in [
            ("faults.model_deadline_s", self.model_deadline_s),
            ("faults.gradient_deadline_s", self.gradient_deadline_s),
            ("faults.update_deadline_s", self.update_deadline_s),
            ("faults.fetch_s", self.fetch_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!(
                    "{name} must be a positive number of seconds, got {v}"
                ));
            }
        }
        for (name, v) in [
            ("faults.accuracy_tolerance", self.accuracy_tolerance),
            ("faults.attack_tolerance", self.attack_tolerance),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "{name} must be a non-negative number of points, got {v}"
                ));
            }
        }
        if self.recovery_rounds == 0 || self.join_rounds == 0 {
            return Err("faults.recovery_rounds and faults.join_rounds must be at least 1".into());
        }
        if let Some(l) = &self.links {
            l.check(clients)?;
        }
        let mut events = Vec::with_capacity(self.events.len());
        for (i, e) in self.events.iter().enumerate() {
            let n = i + 1;
            let ev = e
                .to_event(clients)
                .map_err(|msg| format!("faults.events[{n}]: {msg}"))?;
            events.push(ev);
        }
        // File order must be firing order within each kind of trigger, so the state checks
        // below (heal after partition, restart after crash) see what will happen.
        let mut last_round = 0;
        let mut last_s = 0.0;
        for (i, e) in events.iter().enumerate() {
            match e.trigger {
                Trigger::Round(r) if r < last_round => {
                    return Err(format!(
                        "faults.events[{}]: round {r} comes after an event at round {last_round}; list events in the order they happen",
                        i + 1
                    ));
                }
                Trigger::Round(r) => last_round = r,
                Trigger::Seconds(s) if s < last_s => {
                    return Err(format!(
                        "faults.events[{}]: at_s = {s} comes after an event at {last_s} s; list events in the order they happen",
                        i + 1
                    ));
                }
                Trigger::Seconds(s) => last_s = s,
            }
        }
        let schedule = Schedule {
            clients,
            events,
            config: self.clone(),
        };
        schedule.replay()?;
        Ok(schedule)
    }
}

fn silo_in_range(what: &str, s: u32, clients: usize) -> Result<u32, String> {
    if (s as usize) < clients {
        Ok(s)
    } else {
        Err(format!(
            "{what} names silo {s}, but the federation has silos 0..{} only",
            clients.saturating_sub(1)
        ))
    }
}

impl EventSpec {
    fn to_event(&self, clients: usize) -> Result<Event, String> {
        let trigger = match (self.round, self.at_s) {
            (Some(_), Some(_)) => return Err("give either round or at_s, not both".into()),
            (None, None) => return Err("needs a trigger: round = N or at_s = SECONDS".into()),
            (Some(0), _) => return Err("round must be at least 1 (rounds count from 1)".into()),
            (Some(r), _) => Trigger::Round(r),
            (_, Some(s)) if !(s.is_finite() && s >= 0.0) => {
                return Err(format!("at_s must be a non-negative number, got {s}"));
            }
            (_, Some(s)) => Trigger::Seconds(s),
        };
        let mut actions = Vec::new();
        if let Some(groups) = &self.partition {
            let mut seen = vec![false; clients];
            if groups.len() < 2 {
                return Err("a partition needs at least two groups".into());
            }
            for g in groups {
                if g.is_empty() {
                    return Err("a partition group is empty".into());
                }
                for &s in g {
                    silo_in_range("partition", s, clients)?;
                    if std::mem::replace(&mut seen[s as usize], true) {
                        return Err(format!(
                            "partition groups overlap: silo {s} is in more than one group"
                        ));
                    }
                }
            }
            if let Some(s) = seen.iter().position(|x| !x) {
                return Err(format!(
                    "silo {s} is in no group of the partition; list every silo of the federation"
                ));
            }
            actions.push(Fault::Partition(groups.clone()));
        }
        match self.heal {
            Some(true) => actions.push(Fault::Heal),
            Some(false) => {
                return Err("heal = false does nothing; remove it or write heal = true".into());
            }
            None => {}
        }
        if let Some(c) = &self.crash {
            let silo = silo_in_range("crash", c.silo, clients)?;
            let restart = match (c.restart_after_rounds, c.restart_after_s) {
                (Some(_), Some(_)) => {
                    return Err("give restart_after_rounds or restart_after_s, not both".into());
                }
                (Some(0), _) => return Err("restart_after_rounds must be at least 1".into()),
                (Some(r), _) => Some(Restart::Rounds(r)),
                (_, Some(s)) if !(s.is_finite() && s > 0.0) => {
                    return Err(format!("restart_after_s must be positive, got {s}"));
                }
                (_, Some(s)) => Some(Restart::Seconds(s)),
                (None, None) => None,
            };
            actions.push(Fault::Crash { silo, restart });
        }
        if let Some(d) = &self.delay {
            let silo = silo_in_range("delay", d.silo, clients)?;
            actions.push(Fault::Delay { silo, ms: d.ms });
        }
        if let Some(l) = &self.loss {
            if !(l.fraction.is_finite() && (0.0..1.0).contains(&l.fraction)) {
                return Err(format!(
                    "loss.fraction must be in [0, 1), got {}",
                    l.fraction
                ));
            }
            if let Some(ss) = &l.silos {
                for &s in ss {
                    silo_in_range("loss", s, clients)?;
                }
            }
            actions.push(Fault::Loss {
                fraction: l.fraction,
                silos: l.silos.clone(),
            });
        }
        if let Some(s) = self.leave {
            actions.push(Fault::Leave(silo_in_range("leave", s, clients)?));
        }
        if let Some(s) = self.join {
            actions.push(Fault::Join(silo_in_range("join", s, clients)?));
        }
        if let Some(a) = &self.attack {
            if a.silos.is_empty() {
                return Err("attack.silos is empty; name the attacking silos".into());
            }
            for &s in &a.silos {
                silo_in_range("attack", s, clients)?;
            }
            if a.silos.len() >= clients {
                return Err("attack names every silo; leave at least one honest".into());
            }
            let attack = match a.kind.as_str() {
                "none" if a.factor.is_some() => {
                    return Err("attack kind \"none\" takes no factor".into());
                }
                "none" => None,
                k => Some(Attack::parse(k, a.factor)?),
            };
            actions.push(Fault::Attack {
                silos: a.silos.clone(),
                attack,
            });
        }
        if let Some(c) = &self.coordinator_crash {
            if c.restart_after_rounds == Some(0) {
                return Err("coordinator_crash.restart_after_rounds must be at least 1".into());
            }
            actions.push(Fault::CoordinatorCrash {
                restart_after: c.restart_after_rounds,
            });
        }
        match actions.len() {
            1 => Ok(Event {
                trigger,
                fault: actions.pop().expect("one action"),
            }),
            0 => Err(
                "needs one action: partition, heal, crash, delay, loss, leave, join, attack or \
                 coordinator_crash"
                    .into(),
            ),
            _ => Err(format!(
                "has {} actions ({}); write one event per action",
                actions.len(),
                actions
                    .iter()
                    .map(Fault::kind)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}
