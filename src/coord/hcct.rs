//! HCCT (`../shared/specs/hcct.md`): not yet implemented.
