//! Run reports: what a person or a script reads after a run.
//! Owns: the `rounds.jsonl` and `summary.json` records, plots (SVG and PNG), the final table,
//! writing a run's summaries ([`summary`], shared by `simulate`, `swarm` and `report`), nodes'
//! run logs into a report ([`logs`]), the machine a run was computed on ([`machine`]), and
//! finding what `federico report` was pointed at ([`gather`]).
//! Must not: run algorithms or compute anything but summaries of what it is given.

pub mod bands;
pub mod gather;
pub mod logs;
pub mod machine;
pub mod names;
pub mod plots;
pub mod records;
pub mod summary;
pub mod table;
