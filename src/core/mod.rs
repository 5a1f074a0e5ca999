//! The FedeRiCo state machine (spec `federico.md` §3–§6), sans-IO.
