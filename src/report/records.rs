//! The machine-readable records of a run: one `rounds.jsonl` line per round, a `summary.json`
//! per seed and one for the whole scenario.
//! Owns: their serde form (what a reader of a run's files sees).
//! Must not: compute metrics; the driver fills them in.

use serde::{Deserialize, Serialize};

/// One algorithm's scores at one round.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AlgorithmRound {
    /// Algorithm name.
    pub algorithm: String,
    /// Test accuracy pooled over clients (classification).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Test mean squared error pooled over clients (regression).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mse: Option<f64>,
    /// Mean test loss pooled over clients (cross-entropy of the predictive distribution, or MSE).
    pub loss: f64,
    /// Per-client test accuracy (classification) or MSE (regression).
    pub per_client: Vec<f64>,
    /// Per-client mean test loss.
    pub per_client_loss: Vec<f64>,
}

/// FedeRiCo's collaboration state at the end of a round.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FedericoRound {
    /// w_ij: row i = silo, column j = model, self included.
    pub weights: Vec<Vec<f64>>,
    /// The peers each silo sampled this round.
    pub sampled: Vec<Vec<u32>>,
    /// Mean over silos of the weight on same-group peers, self included (known groups only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_group_mass: Option<f64>,
    /// Mean over silos of the weight on models trained with its own group's data
    /// (`report::summary::Provenance`; known groups only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained_group_mass: Option<f64>,
    /// Mean over silos of the share of their weight on *others* that sits on their own group
    /// (known groups only; silos that weigh nobody else are left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_mass: Option<f64>,
    /// Mean over silos of the weight on their own model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_weight: Option<f64>,
}

/// How FedeRiCo's silos weigh their collaborators at the end of a run, beside same-group mass
/// (which counts a silo's own weight as its group's, so a silo that trusts only itself reads
/// 1.0): `report::summary::reliance`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reliance {
    /// Mean over silos of the share of their weight on others that sits on their own group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_mass: Option<f64>,
    /// Mean over silos of the weight on their own model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_weight: Option<f64>,
    /// Each silo's peer mass (`None`: it weighs nobody else, or its group is itself alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_client_peer_mass: Vec<Option<f64>>,
    /// Each silo's weight on its own model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_client_self_weight: Vec<f64>,
}

/// One line of `rounds.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RoundRecord {
    /// Run seed.
    pub seed: u64,
    /// Round, counted from 1.
    pub round: usize,
    /// Scores (empty on rounds that were not evaluated).
    pub algorithms: Vec<AlgorithmRound>,
    /// FedeRiCo's weights, when it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub federico: Option<FedericoRound>,
}

/// One algorithm's final result on one seed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AlgorithmResult {
    /// Algorithm name.
    pub algorithm: String,
    /// Final test accuracy, pooled over clients (weighted by test-set size, as the paper reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Final test MSE, pooled over clients (regression).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mse: Option<f64>,
    /// Per-client final accuracy or MSE.
    pub per_client: Vec<f64>,
    /// FedeRiCo only: final mean weight mass on same-group peers, self included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_group_mass: Option<f64>,
    /// FedeRiCo only: final mean weight on models trained with the silo's own group's data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained_group_mass: Option<f64>,
    /// FedeRiCo only: final peer mass and self-weight, per silo and their means.
    #[serde(flatten, default)]
    pub reliance: Reliance,
    /// FedeRiCo under `[privacy]`: what each silo spent of its budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privacy: Option<PrivacySpent>,
    /// FedeRiCo under `simulate --audit`: a curious member's membership-inference attack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<MembershipAudit>,
}

/// A curious member's membership-inference attack on every silo's own model at the end of a run
/// (`simulate --audit`, [`crate::privacy::audit`]): a loss threshold separating the silo's
/// training rows from its held-out rows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MembershipAudit {
    /// Mean over silos of the attack's AUC on the silo's own rows (0.5: a coin).
    pub auc: f64,
    /// Each silo's AUC (over seeds: the mean).
    pub per_client_auc: Vec<f64>,
    /// The ε that one loss threshold over every silo's rows together proves at 95 %
    /// confidence (over seeds: the mean).
    pub epsilon_lower_bound: f64,
    /// Rows scored, members (training rows) and non-members (held-out rows), over all silos.
    pub members: usize,
    /// See [`Self::members`].
    pub non_members: usize,
    /// Mean loss of the members and of the non-members (nats; squared error in regression):
    /// the gap a loss threshold feeds on.
    #[serde(default)]
    pub member_loss: f64,
    /// See [`Self::member_loss`].
    #[serde(default)]
    pub non_member_loss: f64,
}

/// What FedeRiCo's silos spent of their privacy budget by the end of a run (`[privacy]`,
/// `docs/privacy.md`): ε against everyone together, each at the silo's δ. Under the default
/// recipe every release reaches every member, so the view against any one peer is the same.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PrivacySpent {
    /// The budget ε, per silo.
    pub budget: f64,
    /// Mean over silos of the ε spent.
    pub epsilon: f64,
    /// Each silo's ε spent (over seeds: the mean).
    pub per_client_epsilon: Vec<f64>,
    /// Each silo's δ.
    pub per_client_delta: Vec<f64>,
    /// Each silo's noise multiplier σ (configured, or calibrated to the budget).
    #[serde(default)]
    pub per_client_noise: Vec<f64>,
    /// Silos whose budget ran out before the last round (over seeds: the mean).
    pub exhausted: f64,
}

impl PrivacySpent {
    /// What the silos' ledgers say (`records`, one per silo that ran under `[privacy]`);
    /// `None` when no silo did.
    pub fn of(records: &[crate::trace::PrivacyRecord]) -> Option<Self> {
        let first = records.first()?;
        let per_client_epsilon: Vec<f64> = records.iter().map(|p| p.epsilon).collect();
        Some(Self {
            budget: first.budget,
            epsilon: per_client_epsilon.iter().sum::<f64>() / records.len() as f64,
            per_client_epsilon,
            per_client_delta: records.iter().map(|p| p.delta).collect(),
            per_client_noise: records.iter().map(|p| p.noise_multiplier).collect(),
            exhausted: records.iter().filter(|p| p.exhausted).count() as f64,
        })
    }
}

/// `seed-N/summary.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunSummary {
    /// Run seed.
    pub seed: u64,
    /// Rounds run.
    pub rounds: usize,
    /// Final results per algorithm.
    pub algorithms: Vec<AlgorithmResult>,
    /// The fault checks of a run with a `[faults]` schedule (`faults::checks::Report`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults: Option<serde_json::Value>,
    /// The fault checks of each coordinated algorithm run under the schedule, by name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub coordinated_faults: std::collections::BTreeMap<String, serde_json::Value>,
}

/// One algorithm across seeds, in the scenario's `summary.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AlgorithmSummary {
    /// Algorithm name.
    pub algorithm: String,
    /// Mean over seeds of the final pooled accuracy (classification).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Sample standard deviation over seeds of the accuracy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy_std: Option<f64>,
    /// Mean over seeds of the final pooled MSE (regression).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mse: Option<f64>,
    /// Sample standard deviation over seeds of the MSE.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mse_std: Option<f64>,
    /// The metric on each seed, in seed order.
    pub per_seed: Vec<f64>,
    /// Per-client metric, averaged over seeds (client i of every seed's split).
    pub per_client: Vec<f64>,
    /// FedeRiCo only: mean over seeds of `same_group_mass`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_group_mass: Option<f64>,
    /// FedeRiCo only: mean over seeds of `trained_group_mass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained_group_mass: Option<f64>,
    /// FedeRiCo only: peer mass and self-weight averaged over seeds (per silo: silo i of
    /// every seed's split).
    #[serde(flatten, default)]
    pub reliance: Reliance,
    /// FedeRiCo under `[privacy]`: the budget spent, averaged over seeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privacy: Option<PrivacySpent>,
    /// FedeRiCo under `simulate --audit`: the attack's figures, averaged over seeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<MembershipAudit>,
}

/// The scenario's `summary.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    /// Scenario name.
    pub scenario: String,
    /// "accuracy" or "mse".
    pub metric: String,
    /// The architecture, as a JSON value.
    pub model: serde_json::Value,
    /// Parameters per model.
    pub num_params: usize,
    /// Number of silos.
    pub clients: usize,
    /// Rounds per run.
    pub rounds: usize,
    /// Seeds run.
    pub seeds: Vec<u64>,
    /// One entry per algorithm.
    pub algorithms: Vec<AlgorithmSummary>,
    /// Every seed's own summary.
    pub runs: Vec<RunSummary>,
}

/// `seed-N/timing.json`: wall-clock figures, kept out of `summary.json` so that the summary of a
/// seed is bit-identical from run to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Timing {
    /// Run seed.
    pub seed: u64,
    /// Worker threads used.
    pub threads: usize,
    /// Seconds for the whole seed (data split, training, evaluation, files).
    pub total_seconds: f64,
    /// Per algorithm: seconds spent training and evaluating it (FedAvg's training is charged to
    /// both FedAvg and FedAvg+).
    pub algorithms: Vec<AlgorithmTiming>,
    /// The machine that computed the seed (its L1 data cache decides the last bits of matrix
    /// products: [`crate::report::machine`]); empty in files written before it was recorded.
    #[serde(default)]
    pub machine: crate::report::machine::Machine,
}

/// One algorithm's time on one seed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AlgorithmTiming {
    /// Algorithm name.
    pub algorithm: String,
    /// Training seconds over all rounds.
    pub train_seconds: f64,
    /// Evaluation seconds over all evaluated rounds.
    pub eval_seconds: f64,
    /// Median training seconds of one round.
    pub median_round_seconds: f64,
}
