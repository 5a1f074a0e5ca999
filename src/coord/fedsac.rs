//! FedSaC (`../shared/specs/fedsac.md`): not yet implemented.
