//! Run reports: what a person or a script reads after a run.
//! Owns: the `rounds.jsonl` and `summary.json` records, plots, the final table, and writing a
//! run's summaries ([`summary`], shared by `simulate` and `swarm`).
//! Must not: run algorithms or compute anything but summaries of what it is given.

pub mod plots;
pub mod records;
pub mod summary;
pub mod table;
