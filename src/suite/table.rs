//! The quality suite's table: every column's accuracy per algorithm (mean ± std over seeds),
//! FedeRiCo against Local (the difference and per-silo wins/ties/losses), FedeRiCo's same-group
//! weight mass (by owner and by whose data trained the models), its rank, the targets
//! counted over the columns, and the variants' ablation.
//! Owns: [`ColumnResult`], [`render`] and the definitions of a per-silo win and of a target met.
//! Must not: run anything or read files (it is handed the columns' summaries).

use crate::report::machine::Machine;
use crate::report::names::display_label;
use crate::report::records::{AlgorithmSummary, Summary};
use crate::report::table::mean_std;

/// A per-silo difference of at least this (1 point) is a win or a loss; less is a tie.
pub const TIE: f64 = 0.01;
/// "Never worse than alone": FedeRiCo's mean at least Local's minus this (0.5 points).
pub const NEVER_WORSE: f64 = 0.005;
/// Where Local is below [`LOW_LOCAL`], FedeRiCo should lead it by [`LEAD`] (3 points).
pub const LEAD: f64 = 0.03;
/// See [`LEAD`]: 85 %.
pub const LOW_LOCAL: f64 = 0.85;
/// The same-group mass target.
pub const MASS: f64 = 0.9;

/// One column's results.
#[derive(Clone, Debug)]
pub struct ColumnResult {
    /// Folder name.
    pub id: String,
    /// Data label.
    pub data: String,
    /// Split label.
    pub split: String,
    /// Training samples per silo.
    pub size: usize,
    /// The column's summary (every algorithm).
    pub summary: Summary,
    /// Each variant's label and summary (FedeRiCo only).
    pub variants: Vec<(String, Summary)>,
    /// The machines that computed the column and its variants, each once, from the seeds'
    /// `timing.json` (an empty [`Machine`] for seeds that did not record it).
    pub machines: Vec<Machine>,
}

/// FedeRiCo against Local over every silo of every seed: (wins, ties, losses).
pub fn silo_record(fed: &Summary, local: &Summary) -> (usize, usize, usize) {
    let mut wtl = (0, 0, 0);
    for (f_run, l_run) in fed.runs.iter().zip(&local.runs) {
        let find = |run: &crate::report::records::RunSummary, name: &str| {
            run.algorithms
                .iter()
                .find(|a| a.algorithm == name)
                .map(|a| a.per_client.clone())
        };
        let (Some(f), Some(l)) = (find(f_run, "federico"), find(l_run, "local")) else {
            continue;
        };
        for (a, b) in f.iter().zip(&l) {
            let d = a - b;
            if d >= TIE - 1e-12 {
                wtl.0 += 1;
            } else if d <= -TIE + 1e-12 {
                wtl.2 += 1;
            } else {
                wtl.1 += 1;
            }
        }
    }
    wtl
}

fn alg<'a>(s: &'a Summary, name: &str) -> Option<&'a AlgorithmSummary> {
    s.algorithms.iter().find(|a| a.algorithm == name)
}

fn acc(a: &AlgorithmSummary) -> f64 {
    a.accuracy.unwrap_or(f64::NAN)
}

fn pct(x: f64) -> String {
    format!("{:.1}", 100.0 * x)
}

fn signed(x: f64) -> String {
    format!("{:+.1}", 100.0 * x)
}

fn mass(x: Option<f64>) -> String {
    x.map_or("–".into(), |m| format!("{m:.2}"))
}

fn ordinal(n: usize) -> String {
    match n {
        1 => "1st".into(),
        2 => "2nd".into(),
        3 => "3rd".into(),
        n => format!("{n}th"),
    }
}

/// FedeRiCo's rank by mean accuracy among the column's algorithms (1 = best; a tie with a
/// better mean counts as sharing its rank).
pub fn rank(s: &Summary) -> Option<usize> {
    Some(rank_of(s, acc(alg(s, "federico")?)))
}

/// FedeRiCo's rank in the column had it scored `f`: 1 + the other algorithms scoring more
/// (how a variant would rank in place of the default).
fn rank_of(s: &Summary, f: f64) -> usize {
    1 + s
        .algorithms
        .iter()
        .filter(|a| a.algorithm != "federico" && acc(a) > f + 1e-12)
        .count()
}

/// One line on a finished column: Local, FedeRiCo, Δ and the masses, then each variant.
pub fn progress_line(c: &ColumnResult) -> String {
    let (Some(f), Some(l)) = (alg(&c.summary, "federico"), alg(&c.summary, "local")) else {
        return String::new();
    };
    let mut line = format!(
        "Local {} FedeRiCo {} ({}) mass {} / {}",
        pct(acc(l)),
        pct(acc(f)),
        signed(acc(f) - acc(l)),
        mass(f.same_group_mass),
        mass(f.trained_group_mass)
    );
    for (label, s) in &c.variants {
        if let Some(v) = alg(s, "federico") {
            line += &format!("; {label} {} ({})", pct(acc(v)), signed(acc(v) - acc(l)));
        }
    }
    line
}

/// The whole table as Markdown.
pub fn render(title: &str, command: &str, columns: &[ColumnResult]) -> String {
    let mut out = format!("# {title}\n\n`{command}`\n\n");
    let Some(first) = columns.first() else {
        return out + "No columns.\n";
    };
    let names: Vec<String> = first
        .summary
        .algorithms
        .iter()
        .map(|a| a.algorithm.clone())
        .collect();
    out += &format!(
        "Accuracy (%) at the last round, mean ± std over seeds {:?}, {} rounds, {} silos. \
         Δ = FedeRiCo − Local (points). Silos W/T/L: FedeRiCo against Local on every silo of \
         every seed, a tie being a difference under {} point. Mass: FedeRiCo's mean weight on \
         its own group, by the models' owners / by whose data trained the models.\n\n",
        first.summary.seeds,
        first.summary.rounds,
        first.summary.clients,
        100.0 * TIE
    );
    out += "| column | n/silo |";
    for n in &names {
        out += &format!(" {} |", display_label(n));
    }
    out += " Δ | silos W/T/L | mass owner / trained | FedeRiCo rank |\n|---|---|";
    out += &"---|".repeat(names.len() + 4);
    out += "\n";
    let mut tally = Tally::default();
    for c in columns {
        out += &format!("| {} {} | {} |", c.data, c.split, c.size);
        for n in &names {
            out += &match alg(&c.summary, n) {
                Some(a) => {
                    let (m, s) = mean_std(&a.per_seed);
                    format!(" {} ± {} |", pct(m), pct(s))
                }
                None => " – |".into(),
            };
        }
        let (Some(f), Some(l)) = (alg(&c.summary, "federico"), alg(&c.summary, "local")) else {
            out += " – | – | – | – |\n";
            continue;
        };
        let d = acc(f) - acc(l);
        let (w, t, lo) = silo_record(&c.summary, &c.summary);
        let r = rank(&c.summary).unwrap_or(0);
        out += &format!(
            " {} | {w}/{t}/{lo} | {} / {} | {} |\n",
            signed(d),
            mass(f.same_group_mass),
            mass(f.trained_group_mass),
            ordinal(r)
        );
        tally.add(
            c,
            acc(l),
            acc(f),
            f.same_group_mass,
            f.trained_group_mass,
            r,
        );
    }
    out += "\n";
    out += &tally.render(columns.len());
    if !first.variants.is_empty() {
        out += &variants(columns);
    }
    if !out.ends_with("\n\n") {
        out.push('\n');
    }
    out += &machines(columns);
    out
}

/// Which machine computed which columns. The last bits of every matrix product, and so a
/// chaotic run's accuracy, depend on it ([`crate::report::machine`]).
fn machines(columns: &[ColumnResult]) -> String {
    let mut seen: Vec<(&Machine, Vec<&str>)> = Vec::new();
    for c in columns {
        for m in &c.machines {
            match seen.iter_mut().find(|(k, _)| *k == m) {
                Some((_, ids)) => {
                    if ids.last() != Some(&c.id.as_str()) {
                        ids.push(&c.id)
                    }
                }
                None => seen.push((m, vec![&c.id])),
            }
        }
    }
    let describe = |m: &Machine| {
        if *m == Machine::default() {
            "not recorded (run before federico recorded it)".to_string()
        } else {
            m.describe()
        }
    };
    let mut out = String::from(
        "## Machine\n\nThe level-1 data cache decides in what order matrix products add their \
         terms, so the same command gives slightly different numbers on another machine \
         (docs/quality.md, \"Results depend on the machine\").\n\n",
    );
    match seen.as_slice() {
        [] => out += "No column recorded its machine.\n",
        [(m, _)] => out += &format!("Every column: {}.\n", describe(m)),
        _ => {
            for (m, ids) in &seen {
                out += &format!("- {}: {}\n", describe(m), ids.join(", "));
            }
        }
    }
    out
}

/// The targets counted over the columns.
#[derive(Default)]
struct Tally {
    never_worse: Vec<String>,
    worse: Vec<String>,
    low: usize,
    low_lead: usize,
    low_missed: Vec<String>,
    grouped: usize,
    mass_owner: usize,
    mass_trained: usize,
    first: usize,
}

impl Tally {
    fn add(
        &mut self,
        c: &ColumnResult,
        local: f64,
        fed: f64,
        owner: Option<f64>,
        trained: Option<f64>,
        rank: usize,
    ) {
        let name = format!("{} {} n={}", c.data, c.split, c.size);
        let d = fed - local;
        if d >= -NEVER_WORSE {
            self.never_worse.push(name.clone());
        } else {
            self.worse.push(format!("{name} ({})", signed(d)));
        }
        if local < LOW_LOCAL {
            self.low += 1;
            if d >= LEAD {
                self.low_lead += 1;
            } else {
                self.low_missed.push(format!("{name} ({})", signed(d)));
            }
        }
        if let Some(m) = owner {
            self.grouped += 1;
            self.mass_owner += usize::from(m >= MASS);
            self.mass_trained += usize::from(trained.is_some_and(|t| t >= MASS));
        }
        self.first += usize::from(rank == 1);
    }

    fn render(&self, n: usize) -> String {
        let mut out = String::from("## Targets\n\n");
        out += &format!(
            "- Never worse than alone (Δ ≥ −0.5): {} of {n} columns.{}\n",
            self.never_worse.len(),
            list(" Missed", &self.worse)
        );
        out += &format!(
            "- At least 3 points ahead where Local is below 85 %: {} of {} columns.{}\n",
            self.low_lead,
            self.low,
            list(" Missed", &self.low_missed)
        );
        out += &format!(
            "- Same-group mass ≥ 0.9 on label-group columns: {} of {} by owner, {} of {} by \
             whose data trained the models.\n",
            self.mass_owner, self.grouped, self.mass_trained, self.grouped
        );
        out += &format!(
            "- FedeRiCo first of the algorithms: {} of {n} columns ({:.0} %; target 80 %).\n\n",
            self.first,
            100.0 * self.first as f64 / n.max(1) as f64
        );
        out
    }
}

fn list(head: &str, items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!("{head}: {}.", items.join(", "))
    }
}

/// The variants' ablation: FedeRiCo's accuracy, Δ against the column's Local and its mass.
fn variants(columns: &[ColumnResult]) -> String {
    let labels: Vec<String> = columns[0].variants.iter().map(|(l, _)| l.clone()).collect();
    let mut out = String::from(
        "## FedeRiCo variants\n\nEach cell: accuracy (%) mean over seeds, Δ against the column's \
         Local, and same-group mass by owner / by trained-with data. `default` is the FedeRiCo \
         of the main table.\n\n| column | Local | default |",
    );
    for l in &labels {
        out += &format!(" {l} |");
    }
    out += "\n|---|---|---|";
    out += &"---|".repeat(labels.len());
    out += "\n";
    let mut deltas: Vec<Vec<f64>> = vec![Vec::new(); labels.len() + 1];
    let mut never_worse = vec![0usize; labels.len() + 1];
    let mut firsts = vec![0usize; labels.len() + 1];
    for c in columns {
        let Some(l) = alg(&c.summary, "local") else {
            continue;
        };
        let local = acc(l);
        out += &format!("| {} {} n={} | {} |", c.data, c.split, c.size, pct(local));
        let fed = std::iter::once(alg(&c.summary, "federico")).chain(labels.iter().map(|label| {
            c.variants
                .iter()
                .find(|(v, _)| v == label)
                .and_then(|(_, s)| alg(s, "federico"))
        }));
        for (k, f) in fed.enumerate() {
            match f {
                Some(f) => {
                    let d = acc(f) - local;
                    deltas[k].push(d);
                    never_worse[k] += usize::from(d >= -NEVER_WORSE);
                    firsts[k] += usize::from(rank_of(&c.summary, acc(f)) == 1);
                    out += &format!(
                        " {} ({}) {} / {} |",
                        pct(acc(f)),
                        signed(d),
                        mass(f.same_group_mass),
                        mass(f.trained_group_mass)
                    );
                }
                None => out += " – |",
            }
        }
        out += "\n";
    }
    out += "| mean Δ; columns never worse | | ";
    for (d, nw) in deltas.iter().zip(&never_worse) {
        let mean = d.iter().sum::<f64>() / d.len().max(1) as f64;
        out += &format!("{}; {nw} of {} | ", signed(mean), d.len());
    }
    out.truncate(out.trim_end().len());
    out += "\n| first of the algorithms, in the default's place | | ";
    for (f, d) in firsts.iter().zip(&deltas) {
        out += &format!("{f} of {} | ", d.len());
    }
    out.truncate(out.trim_end().len());
    out += "\n";
    out
}
