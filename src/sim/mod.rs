//! The in-process simulator.
