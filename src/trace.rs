//! The per-round trace of one silo: what a node writes to its `rounds.jsonl`, and what the
//! simulator records for the same silo when it runs a fault schedule.
//! Owns: the record and its serde form (every field added later has a serde default, so older
//! logs still read), and cutting a run log back to the round of its checkpoint.
//! Must not: compute anything; drivers fill it, `faults::checks` and `launch` read it.

use crate::learn::Evaluation;
use serde::{Deserialize, Serialize};

/// One line of a node's run log (`rounds.jsonl` in its state directory).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeRound {
    /// This node's index in the manifest.
    pub node: u32,
    /// The round completed.
    pub round: u64,
    /// The node's model version after the round's step.
    pub version: u64,
    /// Peers sampled this round.
    pub sampled: Vec<u32>,
    /// Sampled peers whose model arrived in time.
    pub answered: Vec<u32>,
    /// Gradients (self included) the step summed.
    pub gradients: usize,
    /// The weight row after the E-step: `(peer, w)`, self included, by id.
    pub weights: Vec<(u32, f64)>,
    /// The test score of the inference mixture, on evaluation rounds.
    pub eval: Option<EvalRecord>,
    /// Wall time of the round.
    pub seconds: f64,
    /// Encoded message bytes this process has sent so far (frames of both protocols).
    #[serde(default)]
    pub bytes_sent: u64,
    /// Stream bytes this process has sent so far (libp2p's bandwidth metrics: frames plus
    /// protocol negotiation; not Noise, Yamux or TCP framing).
    #[serde(default)]
    pub stream_bytes_sent: u64,
    /// When the round ended: Unix seconds (a node) or seconds on the simulated network's
    /// virtual clock (the simulator). Checks compare it with the times the faults were applied.
    #[serde(default)]
    pub at: f64,
    /// When the round started, on the same clock as `at`.
    #[serde(default)]
    pub start: f64,
    /// L̂ per known peer after the E-step, `(peer, tracked loss)`, self included.
    #[serde(default)]
    pub tracked: Vec<(u32, f64)>,
    /// ℓ per known peer after the E-step, `(peer, last measured loss)` (kept when not measured).
    #[serde(default)]
    pub last: Vec<(u32, f64)>,
    /// Peers excluded from sampling (suspects) after the round.
    #[serde(default)]
    pub suspects: Vec<u32>,
    /// The first round after the node resumed from a checkpoint.
    #[serde(default)]
    pub resumed: bool,
    /// Under `[privacy]`: the silo's ledger after the round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privacy: Option<PrivacyRecord>,
}

/// A silo's privacy ledger after a round, as its run log says it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrivacyRecord {
    /// ε spent so far against everyone (under this recipe also against each peer:
    /// `docs/privacy.md`).
    pub epsilon: f64,
    /// The budget ε.
    pub budget: f64,
    /// The δ of both.
    pub delta: f64,
    /// The noise multiplier σ of its releases.
    pub noise_multiplier: f64,
    /// The budget is spent: the silo releases nothing new from its rows.
    pub exhausted: bool,
}

impl NodeRound {
    /// The record of round report `rep` of node `node`, which ended at `at` (seconds, on the
    /// clock the driver's fault times use), with the bytes sent so far.
    pub fn from_report(
        node: u32,
        rep: crate::core::round::RoundReport,
        at: f64,
        bytes_sent: u64,
        stream_bytes_sent: u64,
    ) -> Self {
        let seconds = rep.duration.as_secs_f64();
        let ids = |v: Vec<crate::ids::NodeId>| v.into_iter().map(|b| b.0).collect();
        let pairs =
            |v: Vec<(crate::ids::NodeId, f64)>| v.into_iter().map(|(b, x)| (b.0, x)).collect();
        Self {
            node,
            round: rep.round,
            version: rep.version,
            sampled: ids(rep.sampled),
            answered: ids(rep.answered),
            gradients: rep.gradients,
            weights: pairs(rep.weights),
            eval: rep.eval.map(EvalRecord::from),
            seconds,
            bytes_sent,
            stream_bytes_sent,
            at,
            start: at - seconds,
            tracked: pairs(rep.tracked),
            last: pairs(rep.last),
            suspects: ids(rep.suspects),
            resumed: rep.resumed,
            privacy: None,
        }
    }
}

/// A test score in a node's run log.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct EvalRecord {
    /// Summed loss.
    pub loss_sum: f64,
    /// Correct predictions.
    pub correct: usize,
    /// Test samples.
    pub count: usize,
}

impl From<crate::core::round::Score> for EvalRecord {
    fn from(e: crate::core::round::Score) -> Self {
        Self {
            loss_sum: e.loss_sum,
            correct: e.correct,
            count: e.count,
        }
    }
}

impl From<Evaluation> for EvalRecord {
    fn from(e: Evaluation) -> Self {
        Self {
            loss_sum: e.loss_sum,
            correct: e.correct,
            count: e.count,
        }
    }
}

/// The longest run-log line [`trim_log`] reads whole; a longer one (no record is near it: a
/// record is a few hundred bytes per peer) is garbage and goes, read past in pieces.
pub const MAX_LOG_LINE: usize = 1 << 20;

/// Cuts the run log at `path` back to the rounds a restart will not run again: lines of
/// rounds before `next_round` (the first round the restart runs) stay; later rounds, lines
/// without a round (a coordinated node's final line), a line torn by a kill and a line over
/// [`MAX_LOG_LINE`] go; blank lines are left out. Streams: one pass counts what goes, and only
/// when something does a second writes the kept lines to a temporary file that replaces the
/// log atomically; memory stays within one line of at most [`MAX_LOG_LINE`] bytes, whatever
/// the log's size. Returns how many lines went. A missing log is an empty one.
pub fn trim_log(path: &std::path::Path, next_round: u64) -> Result<usize, String> {
    let at = |e: std::io::Error| format!("{}: {e}", path.display());
    let open = || match std::fs::File::open(path) {
        Ok(f) => Ok(Some(std::io::BufReader::with_capacity(1 << 16, f))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(at(e)),
    };
    let Some(reader) = open()? else {
        return Ok(0);
    };
    let mut dropped = 0;
    each_log_line(reader, next_round, |_, keep| {
        dropped += usize::from(!keep);
        Ok(())
    })
    .map_err(at)?;
    if dropped == 0 {
        return Ok(0);
    }
    let reader = open()?.ok_or_else(|| format!("{}: vanished while cut", path.display()))?;
    crate::store::write_atomic_with(path, |out| {
        each_log_line(reader, next_round, |line, keep| {
            if keep {
                use std::io::Write;
                out.write_all(line)?;
                out.write_all(b"\n")?;
            }
            Ok(())
        })
    })
    .map_err(at)?;
    Ok(dropped)
}

/// Calls `each(line, keep)` for every non-blank line of a run log (without its newline; an
/// overlong line is handed over empty, never kept): `keep` when it records a round before
/// `next_round`.
fn each_log_line(
    mut reader: impl std::io::BufRead,
    next_round: u64,
    mut each: impl FnMut(&[u8], bool) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::io::{BufRead, Read};
    #[derive(Deserialize)]
    struct Round {
        round: u64,
    }
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader
            .by_ref()
            .take(MAX_LOG_LINE as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        } else if line.len() > MAX_LOG_LINE {
            // Overlong: skip the rest of it, keep nothing of it.
            reader.skip_until(b'\n')?;
            each(&[], false)?;
            continue;
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        let keep = matches!(serde_json::from_slice::<Round>(&line), Ok(r) if r.round < next_round);
        each(&line, keep)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(round: u64) -> String {
        let r = NodeRound {
            node: 0,
            round,
            version: round,
            sampled: vec![],
            answered: vec![],
            gradients: 1,
            weights: vec![(0, 1.0)],
            eval: None,
            seconds: 0.1,
            bytes_sent: 0,
            stream_bytes_sent: 0,
            at: 0.0,
            start: 0.0,
            tracked: vec![],
            last: vec![],
            suspects: vec![],
            resumed: false,
            privacy: None,
        };
        serde_json::to_string(&r).unwrap()
    }

    fn rounds(path: &std::path::Path) -> Vec<u64> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<NodeRound>(l).unwrap().round)
            .collect()
    }

    #[test]
    fn a_log_is_cut_back_to_its_checkpoint_and_a_torn_line_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rounds.jsonl");
        let torn = &line(4)[..20];
        let text = format!("{}\n{}\n{}\n{}\n{torn}", line(1), line(2), line(3), line(4));
        std::fs::write(&path, text).unwrap();
        assert_eq!(trim_log(&path, 3).unwrap(), 3);
        assert_eq!(rounds(&path), vec![1, 2]);
        // Nothing past the checkpoint: the file is left as it is.
        assert_eq!(trim_log(&path, 3).unwrap(), 0);
        assert_eq!(rounds(&path), vec![1, 2]);
        // No checkpoint: a stale log goes whole.
        assert_eq!(trim_log(&path, 1).unwrap(), 2);
        assert!(rounds(&path).is_empty());
        assert_eq!(trim_log(&dir.path().join("none.jsonl"), 5).unwrap(), 0);
    }

    /// A large log (about 20 MB, with an overlong garbage line and a torn last line) is cut
    /// back line by line: every round before the cut stays, in order, once; nothing after it.
    #[test]
    fn a_large_log_is_cut_back_line_by_line() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rounds.jsonl");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let n = 60_000u64;
        for r in 0..n {
            writeln!(f, "{}", line(r)).unwrap();
            if r == n / 2 {
                // Garbage longer than a line may be, and a blank line.
                f.write_all(&vec![b'x'; MAX_LOG_LINE + 10]).unwrap();
                f.write_all(b"\n   \n").unwrap();
            }
        }
        f.write_all(&line(n).as_bytes()[..30]).unwrap();
        drop(f);
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size > 14 << 20, "{size} bytes");
        let cut = n - 1000;
        // Dropped: rounds cut..n, the garbage line, the torn line.
        assert_eq!(trim_log(&path, cut).unwrap(), 1000 + 2);
        assert_eq!(rounds(&path), (0..cut).collect::<Vec<_>>());
        assert_eq!(trim_log(&path, cut).unwrap(), 0);
        // No stray temporary file beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
