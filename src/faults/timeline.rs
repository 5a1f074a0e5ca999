//! What a validated fault schedule means round by round: which silos are up, which can reach
//! which, and how late or lossy each one is.
//! Owns: [`Presence`], [`NetState`] (and how one fault changes it), [`Timeline`], and the
//! schedule's replay check and per-round expansion.
//! Must not: parse or validate the schema (`mod.rs`), apply anything (the drivers), or judge
//! a run (`checks`).

use super::Attack;
use super::{Event, Fault, Restart, Schedule, Trigger};
use serde::Serialize;
/// Whether a silo is running, as far as the schedule is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    /// Not started yet (a late joiner before its round).
    Absent,
    /// Running.
    Up,
    /// Killed; comes back if a restart is scheduled.
    Crashed,
    /// Gone for good.
    Left,
}

/// The network as the schedule has it at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct NetState {
    /// Per silo.
    pub presence: Vec<Presence>,
    /// Per silo: its partition group, when a partition is in force.
    pub group: Option<Vec<usize>>,
    /// Per silo: added latency on what it sends, in ms.
    pub delay_ms: Vec<u64>,
    /// Message loss in force: fraction and the silos it concerns (`None`: all).
    pub loss: Option<(f64, Option<Vec<u32>>)>,
    /// Per silo: the poisoning attack it plays, if any.
    pub attack: Vec<Option<Attack>>,
    /// The coordinator (of a coordinated run) is running.
    pub coordinator_up: bool,
}

impl NetState {
    fn start(schedule: &Schedule) -> Self {
        let mut presence = vec![Presence::Up; schedule.clients];
        for e in &schedule.events {
            if let Fault::Join(s) = e.fault {
                presence[s as usize] = Presence::Absent;
            }
        }
        Self {
            presence,
            group: None,
            delay_ms: vec![0; schedule.clients],
            loss: None,
            attack: vec![None; schedule.clients],
            coordinator_up: true,
        }
    }

    /// Whether `silo` is running.
    pub fn is_up(&self, silo: u32) -> bool {
        self.presence[silo as usize] == Presence::Up
    }

    /// Whether a message from `a` can reach `b` at all (both up, same side of any partition).
    pub fn connected(&self, a: u32, b: u32) -> bool {
        self.is_up(a)
            && self.is_up(b)
            && self
                .group
                .as_ref()
                .is_none_or(|g| g[a as usize] == g[b as usize])
    }

    /// The fraction of messages between `a` and `b` that are dropped.
    pub fn loss_between(&self, a: u32, b: u32) -> f64 {
        match &self.loss {
            None => 0.0,
            Some((f, None)) => *f,
            Some((f, Some(ss))) if ss.contains(&a) || ss.contains(&b) => *f,
            Some(_) => 0.0,
        }
    }

    /// Applies one fault; `Err` names what does not make sense in this state.
    pub fn apply(&mut self, fault: &Fault) -> Result<(), String> {
        let need_up = |st: &NetState, s: u32, what: &str| -> Result<(), String> {
            match st.presence[s as usize] {
                Presence::Up => Ok(()),
                p => Err(format!("{what} silo {s}, which is {p:?} at that point").to_lowercase()),
            }
        };
        match fault {
            Fault::Partition(groups) => {
                if self.group.is_some() {
                    return Err("a partition is already in force; heal it first".into());
                }
                let mut g = vec![0; self.presence.len()];
                for (k, members) in groups.iter().enumerate() {
                    for &s in members {
                        g[s as usize] = k;
                    }
                }
                self.group = Some(g);
            }
            Fault::Heal => {
                if self.group.take().is_none() {
                    return Err("heal without a partition in force".into());
                }
            }
            Fault::Crash { silo, .. } => {
                need_up(self, *silo, "crash of")?;
                self.presence[*silo as usize] = Presence::Crashed;
            }
            Fault::Delay { silo, ms } => self.delay_ms[*silo as usize] = *ms,
            Fault::Loss { fraction, silos } => {
                self.loss = (*fraction > 0.0).then(|| (*fraction, silos.clone()));
            }
            Fault::Leave(s) => {
                need_up(self, *s, "leave of")?;
                self.presence[*s as usize] = Presence::Left;
            }
            Fault::Join(s) => {
                if self.presence[*s as usize] != Presence::Absent {
                    return Err(format!("join of silo {s}, which has already started"));
                }
                self.presence[*s as usize] = Presence::Up;
            }
            Fault::Restart(s) => {
                if self.presence[*s as usize] != Presence::Crashed {
                    return Err(format!("restart of silo {s}, which has not crashed"));
                }
                self.presence[*s as usize] = Presence::Up;
            }
            Fault::Attack { silos, attack } => {
                for &s in silos {
                    self.attack[s as usize] = attack.clone();
                }
            }
            Fault::CoordinatorCrash { .. } => {
                if !self.coordinator_up {
                    return Err("coordinator_crash while the coordinator is down".into());
                }
                self.coordinator_up = false;
            }
            Fault::CoordinatorRestart => {
                if self.coordinator_up {
                    return Err("coordinator restart while it is up".into());
                }
                self.coordinator_up = true;
            }
        }
        Ok(())
    }
}

impl Schedule {
    /// Replays the schedule (time triggers after round triggers, restarts by rounds at their
    /// round) and reports the first event that makes no sense.
    pub(super) fn replay(&self) -> Result<(), String> {
        let mut st = NetState::start(self);
        let mut pending: Vec<(u64, u32)> = Vec::new();
        let mut order: Vec<(usize, &Event)> = self.events.iter().enumerate().collect();
        order.sort_by_key(|(i, e)| match e.trigger {
            Trigger::Round(r) => (0, r, *i),
            Trigger::Seconds(_) => (1, 0, *i),
        });
        for (i, e) in order {
            if let Trigger::Round(r) = e.trigger {
                pending.sort();
                while let Some(&(at, s)) = pending.first() {
                    if at > r {
                        break;
                    }
                    st.apply(&restart_of(s))
                        .map_err(|m| format!("faults: {m}"))?;
                    pending.remove(0);
                }
                if let Some(p) = pending_restart(r, &e.fault) {
                    pending.push(p);
                }
            }
            st.apply(&e.fault)
                .map_err(|m| format!("faults.events[{}]: {m}", i + 1))?;
        }
        Ok(())
    }

    /// Whether every trigger and restart is by round (what `federico simulate` can run).
    pub fn rounds_only(&self) -> Result<(), String> {
        for (i, e) in self.events.iter().enumerate() {
            let timed = matches!(e.trigger, Trigger::Seconds(_))
                || matches!(
                    e.fault,
                    Fault::Crash {
                        restart: Some(Restart::Seconds(_)),
                        ..
                    }
                );
            if timed {
                return Err(format!(
                    "faults.events[{}] is timed in seconds; `federico simulate` runs in rounds: use round = N and restart_after_rounds",
                    i + 1
                ));
            }
        }
        Ok(())
    }

    /// The round-by-round network for `rounds` rounds (round triggers only).
    pub fn timeline(&self, rounds: u64) -> Timeline {
        let mut st = NetState::start(self);
        let mut states = Vec::with_capacity(rounds as usize);
        let mut fired: Vec<Vec<Fault>> = Vec::with_capacity(rounds as usize);
        let mut pending: Vec<(u64, u32)> = Vec::new();
        for r in 1..=rounds {
            let mut now = Vec::new();
            pending.retain(|&(at, s)| {
                if at == r {
                    // Validated by `replay`: the silo (or the coordinator) is crashed here.
                    let _ = st.apply(&restart_of(s));
                    now.push(restart_of(s));
                    false
                } else {
                    true
                }
            });
            for e in &self.events {
                if e.trigger == Trigger::Round(r) {
                    let _ = st.apply(&e.fault);
                    if let Some(p) = pending_restart(r, &e.fault) {
                        pending.push(p);
                    }
                    now.push(e.fault.clone());
                }
            }
            states.push(st.clone());
            fired.push(now);
        }
        Timeline { states, fired }
    }
}

/// Who a pending restart is for: a silo, or (`COORDINATOR`) the coordinator.
const COORDINATOR: u32 = u32::MAX;

/// The restart of `who` (a silo, or [`COORDINATOR`]).
fn restart_of(who: u32) -> Fault {
    if who == COORDINATOR {
        Fault::CoordinatorRestart
    } else {
        Fault::Restart(who)
    }
}

/// The restart a crash at round `r` schedules by rounds: `(round, who)`.
fn pending_restart(r: u64, fault: &Fault) -> Option<(u64, u32)> {
    match *fault {
        Fault::Crash {
            silo,
            restart: Some(Restart::Rounds(d)),
        } => Some((r + d, silo)),
        Fault::CoordinatorCrash {
            restart_after: Some(d),
        } => Some((r + d, COORDINATOR)),
        _ => None,
    }
}

/// The network of every round, from a round-triggered schedule.
#[derive(Clone, Debug)]
pub struct Timeline {
    states: Vec<NetState>,
    fired: Vec<Vec<Fault>>,
}

impl Timeline {
    /// The network during round `round` (1-based); rounds past the end keep the last state.
    pub fn at(&self, round: u64) -> &NetState {
        let i = (round.max(1) as usize - 1).min(self.states.len() - 1);
        &self.states[i]
    }

    /// What fired at the start of `round`, restarts included.
    pub fn fired(&self, round: u64) -> &[Fault] {
        self.fired
            .get(round.max(1) as usize - 1)
            .map_or(&[], |v| v.as_slice())
    }
}
