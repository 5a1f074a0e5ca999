//! The local control channel of a node: how `federico swarm` cuts and restores links for its
//! fault schedules (issue 4).
//!
//! Owns: a TCP listener on a local address, one JSON command per line, the token check, and
//! turning accepted commands into [`Command`]s for the node's event loop.
//! Must not: touch the swarm or the core itself — the event loop applies each command — and
//! must never accept a command without the token (anything else on the machine could reach the
//! port).
//!
//! ```text
//! → {"token": "…", "cmd": "block", "peers": ["12D3Koo…"]}
//! ← {"ok": true}
//! ```
//! `cmd` is `block` (close and refuse connections to the peers, stop dialling them), `unblock`
//! (allow and dial them again), `delay` (hold back what the node sends by `"ms"`; 0 ends it),
//! `loss` (drop `"fraction"` of the messages to or from `"peers"`, every peer when empty; 0
//! ends it), `export` (evaluate at the end of the round in progress and write the model to take
//! home, as `SIGUSR1` does), `attack` (play a poisoning member from the next job on: `"kind"`
//! and `"factor"` as a fault schedule writes them, `"none"` ends it; `crate::silo::attack`) or
//! `status` (the node's round and impairments). An attack the schedule starts at a round is not
//! a command but the config's `[control] attacks` plan, which the node follows by its own round.

use libp2p::PeerId;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

/// `[control]` of a node config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// Local address to listen on; the bound address is written to `<state_dir>/control.addr`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// A file holding the token every command must carry (written by the swarm, mode 0600).
    pub token_file: PathBuf,
    /// The poisoning this node plays by its own round, from a fault schedule's round-triggered
    /// attacks (issue 38's test bed): the node starts each at the first job of that round, as
    /// the simulator's silo does, however far ahead of the launcher's log reading it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attacks: Vec<PlannedAttack>,
    /// The emulated wide-area link to each member that has one, from the scenario's
    /// `[faults.links]` (issue 41): what this node sends to that member waits on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<EmulatedLink>,
}

/// `[[control.links]]`: the link from this node to the member named `to`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmulatedLink {
    /// The member's name in the manifest.
    pub to: String,
    /// One-way latency, in milliseconds.
    pub one_way_ms: f64,
    /// Added latency per message, uniform in [0, jitter_ms).
    #[serde(default)]
    pub jitter_ms: f64,
    /// Speed in Mbit/s (absent: bytes take no time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mbit_s: Option<f64>,
}

impl EmulatedLink {
    /// The link to member `to` of a scenario's wide-area network.
    pub fn new(to: String, wan: &crate::faults::link::Wan) -> Self {
        Self {
            to,
            one_way_ms: wan.one_way.as_secs_f64() * 1e3,
            jitter_ms: wan.jitter.as_secs_f64() * 1e3,
            mbit_s: wan.bits_per_s.is_finite().then(|| wan.bits_per_s / 1e6),
        }
    }

    /// The link, checked; the error names what is wrong.
    pub fn wan(&self) -> Result<crate::faults::link::Wan, String> {
        let ms = |what: &str, v: f64| {
            if v.is_finite() && (0.0..=60e3).contains(&v) {
                Ok(std::time::Duration::from_secs_f64(v / 1e3))
            } else {
                Err(format!(
                    "control.links to {:?}: {what} must be in [0, 60000] ms, got {v}",
                    self.to
                ))
            }
        };
        let bits_per_s = match self.mbit_s {
            None => f64::INFINITY,
            Some(m) if m.is_finite() && m > 0.0 => m * 1e6,
            Some(m) => {
                return Err(format!(
                    "control.links to {:?}: mbit_s must be positive, got {m}",
                    self.to
                ));
            }
        };
        Ok(crate::faults::link::Wan {
            one_way: ms("one_way_ms", self.one_way_ms)?,
            jitter: ms("jitter_ms", self.jitter_ms)?,
            bits_per_s,
        })
    }
}

/// `[[control.attacks]]`: from round `from_round` on (rounds count from 1), play `kind`
/// (`"none"` ends an attack) with its `factor`, as a fault schedule writes them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedAttack {
    /// The node's own round the attack starts at.
    pub from_round: u64,
    /// The attack's kind, or `none`.
    pub kind: String,
    /// Its magnitude, for the kinds that take one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
}

impl PlannedAttack {
    /// What a schedule's attack (`None`: its end) becomes in the plan.
    pub fn new(from_round: u64, attack: Option<&crate::silo::attack::Attack>) -> Self {
        Self {
            from_round,
            kind: attack.map_or("none", |a| a.kind()).into(),
            factor: attack.and_then(|a| a.factor()),
        }
    }

    /// The attack, or `None` for `none`; the error names what is wrong.
    pub fn attack(&self) -> Result<Option<crate::silo::attack::Attack>, String> {
        match self.kind.as_str() {
            "none" => Ok(None),
            k => crate::silo::attack::Attack::parse(k, self.factor).map(Some),
        }
    }
}

/// A node's attack plan, checked and ordered by round: `(from_round, attack)`.
pub fn attack_plan(
    planned: &[PlannedAttack],
) -> Result<Vec<(u64, Option<crate::silo::attack::Attack>)>, String> {
    let mut plan = Vec::with_capacity(planned.len());
    for (i, p) in planned.iter().enumerate() {
        if p.from_round == 0 {
            return Err(format!(
                "control.attacks[{}]: from_round must be at least 1 (rounds count from 1)",
                i + 1
            ));
        }
        let a = p
            .attack()
            .map_err(|e| format!("control.attacks[{}]: {e}", i + 1))?;
        plan.push((p.from_round, a));
    }
    // Stable: of two entries for one round, the later written holds.
    plan.sort_by_key(|(r, _)| *r);
    Ok(plan)
}

fn default_listen() -> String {
    "127.0.0.1:0".into()
}

/// What the event loop is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Close and refuse connections to these peers.
    Block(Vec<PeerId>),
    /// Allow these peers again and dial them.
    Unblock(Vec<PeerId>),
    /// Hold back the models and gradients the node sends by this much (zero ends it).
    Delay(std::time::Duration),
    /// Drop this fraction of the pulls, models and gradients to or from these peers (every
    /// peer when empty; zero ends it).
    Loss {
        /// In [0, 1).
        fraction: f64,
        /// The peers concerned (empty: all).
        peers: Vec<PeerId>,
    },
    /// Evaluate at the end of the round in progress and export the predictor.
    Export,
    /// Poison what this node sends from its next job on (`None`: stop).
    Attack(Option<crate::silo::attack::Attack>),
    /// Report the round.
    Status,
}

/// A command with the channel its answer goes back on.
pub type Request = (Command, oneshot::Sender<serde_json::Value>);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    token: String,
    cmd: String,
    #[serde(default)]
    peers: Vec<String>,
    #[serde(default)]
    ms: Option<u64>,
    #[serde(default)]
    fraction: Option<f64>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    factor: Option<f64>,
}

/// Parses one line against the expected token.
pub fn parse(line: &str, token: &str) -> Result<Command, String> {
    let l: Line = serde_json::from_str(line).map_err(|e| format!("not a command: {e}"))?;
    // Equal-length comparison over every byte: no early exit on the first difference.
    let (a, b) = (l.token.as_bytes(), token.as_bytes());
    let same = a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0;
    if !same {
        return Err("wrong token".into());
    }
    let peers = || -> Result<Vec<PeerId>, String> {
        l.peers
            .iter()
            .map(|p| p.parse().map_err(|e| format!("peer {p:?}: {e}")))
            .collect()
    };
    match l.cmd.as_str() {
        "block" => Ok(Command::Block(peers()?)),
        "unblock" => Ok(Command::Unblock(peers()?)),
        "delay" => {
            let ms = l.ms.ok_or("delay needs \"ms\"")?;
            let max = super::impair::MAX_DELAY.as_millis() as u64;
            if ms > max {
                return Err(format!("delay of {ms} ms is over the {max} ms limit"));
            }
            Ok(Command::Delay(std::time::Duration::from_millis(ms)))
        }
        "loss" => {
            let fraction = l.fraction.ok_or("loss needs \"fraction\"")?;
            if !(0.0..1.0).contains(&fraction) {
                return Err(format!("loss fraction must be in [0, 1), got {fraction}"));
            }
            Ok(Command::Loss {
                fraction,
                peers: peers()?,
            })
        }
        "export" => Ok(Command::Export),
        "attack" => match l.kind.as_deref().ok_or("attack needs \"kind\"")? {
            "none" => Ok(Command::Attack(None)),
            k => Ok(Command::Attack(Some(crate::silo::attack::Attack::parse(
                k, l.factor,
            )?))),
        },
        "status" => Ok(Command::Status),
        other => Err(format!(
            "unknown cmd {other:?}: expected block, unblock, delay, loss, export, attack or status"
        )),
    }
}

/// Accepts connections and forwards each valid command to `tx`, answering with the event
/// loop's reply (or the parse error).
pub async fn serve(listener: tokio::net::TcpListener, token: String, tx: mpsc::Sender<Request>) {
    loop {
        let Ok((stream, from)) = listener.accept().await else {
            continue;
        };
        let token = token.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut lines = BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let reply = match parse(&line, &token) {
                    Ok(cmd) => {
                        let (otx, orx) = oneshot::channel();
                        if tx.send((cmd, otx)).await.is_err() {
                            return;
                        }
                        orx.await.unwrap_or_else(
                            |_| serde_json::json!({"ok": false, "error": "node stopping"}),
                        )
                    }
                    Err(e) => {
                        warn!(%from, "control command refused: {e}");
                        serde_json::json!({"ok": false, "error": e})
                    }
                };
                let mut text = reply.to_string();
                text.push('\n');
                if w.write_all(text.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// Sends one command to a node's control address and returns its reply (used by the swarm).
pub fn send(
    addr: &str,
    token: &str,
    cmd: &str,
    peers: &[PeerId],
) -> Result<serde_json::Value, String> {
    send_with(addr, token, cmd, peers, serde_json::json!({}))
}

/// [`send`] with more fields in the command (`ms` of `delay`, `fraction` of `loss`).
pub fn send_with(
    addr: &str,
    token: &str,
    cmd: &str,
    peers: &[PeerId],
    extra: serde_json::Value,
) -> Result<serde_json::Value, String> {
    use std::io::{BufRead, Write};
    let stream = std::net::TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut line = serde_json::json!({
        "token": token,
        "cmd": cmd,
        "peers": peers.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
    });
    if let (Some(line), Some(extra)) = (line.as_object_mut(), extra.as_object()) {
        line.extend(extra.clone());
    }
    let mut w = &stream;
    writeln!(w, "{line}").map_err(|e| format!("{addr}: {e}"))?;
    let mut reply = String::new();
    std::io::BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(|e| format!("{addr}: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&reply).map_err(|e| format!("{addr}: bad reply {reply:?}: {e}"))?;
    if v["ok"] == true {
        Ok(v)
    } else {
        Err(format!("{addr}: {}", v["error"]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attack_plan_survives_the_config_and_refuses_what_is_wrong() {
        use crate::silo::attack::Attack;
        let scale = Attack::Scale { factor: 10.0 };
        let c = ControlConfig {
            listen: default_listen(),
            token_file: "t".into(),
            links: vec![],
            attacks: vec![
                PlannedAttack::new(9, None),
                PlannedAttack::new(3, Some(&scale)),
                PlannedAttack::new(5, Some(&Attack::Extreme)),
            ],
        };
        let back: ControlConfig = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        assert_eq!(
            attack_plan(&back.attacks).unwrap(),
            vec![(3, Some(scale)), (5, Some(Attack::Extreme)), (9, None)]
        );
        let bad = |from_round, kind: &str, factor| {
            attack_plan(&[PlannedAttack {
                from_round,
                kind: kind.into(),
                factor,
            }])
            .unwrap_err()
        };
        assert!(bad(0, "extreme", None).contains("at least 1"));
        assert!(bad(2, "melt", None).contains("unknown attack kind"));
        assert!(bad(2, "scale", Some(-1.0)).contains("control.attacks[1]"));
        assert!(bad(2, "extreme", Some(2.0)).contains("takes no factor"));
    }

    #[test]
    fn commands_need_the_token() {
        let p = PeerId::random();
        let ok = format!(r#"{{"token": "s3cret", "cmd": "block", "peers": ["{p}"]}}"#);
        assert_eq!(parse(&ok, "s3cret").unwrap(), Command::Block(vec![p]));
        assert_eq!(parse(&ok, "s3cres").unwrap_err(), "wrong token");
        assert_eq!(parse(&ok, "s3cre").unwrap_err(), "wrong token");
        assert_eq!(parse(&ok, "").unwrap_err(), "wrong token");
        let no_token = format!(r#"{{"cmd": "block", "peers": ["{p}"]}}"#);
        assert!(parse(&no_token, "s3cret").unwrap_err().contains("token"));
        let bad = r#"{"token": "s3cret", "cmd": "reboot"}"#;
        assert!(parse(bad, "s3cret").unwrap_err().contains("unknown cmd"));
        let bad_peer = r#"{"token": "s3cret", "cmd": "block", "peers": ["nope"]}"#;
        assert!(parse(bad_peer, "s3cret").unwrap_err().contains("nope"));
        let delay = r#"{"token": "s3cret", "cmd": "delay", "ms": 3000}"#;
        assert_eq!(
            parse(delay, "s3cret").unwrap(),
            Command::Delay(std::time::Duration::from_secs(3))
        );
        let no_ms = r#"{"token": "s3cret", "cmd": "delay"}"#;
        assert!(parse(no_ms, "s3cret").unwrap_err().contains("ms"));
        let long = r#"{"token": "s3cret", "cmd": "delay", "ms": 99999999}"#;
        assert!(parse(long, "s3cret").unwrap_err().contains("limit"));
        let loss =
            format!(r#"{{"token": "s3cret", "cmd": "loss", "fraction": 0.2, "peers": ["{p}"]}}"#);
        assert_eq!(
            parse(&loss, "s3cret").unwrap(),
            Command::Loss {
                fraction: 0.2,
                peers: vec![p]
            }
        );
        for f in ["1.0", "-0.1", "2"] {
            let bad = format!(r#"{{"token": "s3cret", "cmd": "loss", "fraction": {f}}}"#);
            assert!(parse(&bad, "s3cret").unwrap_err().contains("[0, 1)"), "{f}");
        }
        assert!(
            parse("garbage", "s3cret")
                .unwrap_err()
                .contains("not a command")
        );
    }
}
