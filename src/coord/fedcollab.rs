//! FedCollab (`../shared/specs/fedcollab.md`): not yet implemented.
