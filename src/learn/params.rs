//! Flat parameter vectors <-> candle variables.
//! Owns: the fixed, name-sorted order in which a model's variables are flattened.
//! Must not: be visible outside `learn` (callers only see `&[f32]`).
