//! FedDisco (`../shared/specs/feddisco.md`): not yet implemented.
