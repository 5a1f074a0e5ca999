//! Joining a coordinated run, written once for the servers that wait for their silos (HCCT,
//! FedSaC, FedCollab): who registered with which sample count, when the run starts, and who is
//! in it.
//! Owns: [`Joining`] — each silo's registration, before and after the start; the start itself
//! (with every silo once the last one registered, or with those that came when the driver
//! closes joining); the run's members, the silos still missing, those left out; and the two
//! refusals every server shares ([`Refused`]: not a silo of the run, a member's changed count;
//! [`CloseRefused`]: already started, too few registered).
//! Must not: know an algorithm's rounds, models or error texts (each server words the
//! refusals its own way and does its own start work), or any clock (the driver decides when
//! joining closes).

/// Who registered, and who is in the run once it started. `T` is what a silo registers with
/// (its sample count).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Joining<T> {
    /// Each silo's registration, by manifest index.
    sizes: Vec<Option<T>>,
    /// The silos in the run, ascending, once it started.
    members: Option<Vec<usize>>,
    /// The fewest registered silos joining may close on.
    fewest: usize,
}

/// Why a registration was refused.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Refused<T> {
    /// The index is not one of the run's `nodes` silos.
    NotASilo {
        /// Silos in the run.
        nodes: usize,
    },
    /// A member of a started run registered again with another value than `old`.
    Changed {
        /// What it registered with before.
        old: T,
    },
}

/// Why joining could not close.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum CloseRefused {
    /// The run has already started.
    Started,
    /// Fewer than the fewest silos a run may start with have registered.
    TooFew {
        /// Silos registered.
        joined: usize,
        /// Silos of the run.
        nodes: usize,
    },
}

impl<T: Copy + PartialEq> Joining<T> {
    /// Nobody registered yet among `nodes` silos; joining may close once `fewest` have.
    pub(crate) fn new(nodes: usize, fewest: usize) -> Self {
        Self {
            sizes: vec![None; nodes],
            members: None,
            fewest,
        }
    }

    /// Registrations and members as a checkpoint saved them (the caller checked them).
    pub(crate) fn restore(
        sizes: Vec<Option<T>>,
        members: Option<Vec<usize>>,
        fewest: usize,
    ) -> Self {
        Self {
            sizes,
            members,
            fewest,
        }
    }

    /// Silos of the run.
    pub(crate) fn nodes(&self) -> usize {
        self.sizes.len()
    }

    /// Every silo's registration, by index.
    pub(crate) fn sizes(&self) -> &[Option<T>] {
        &self.sizes
    }

    /// Silo `i`'s registration (`None` if it has not registered or is not a silo of the run).
    pub(crate) fn size(&self, i: usize) -> Option<T> {
        self.sizes.get(i).copied().flatten()
    }

    /// Silos registered so far.
    pub(crate) fn registered(&self) -> usize {
        self.sizes.iter().flatten().count()
    }

    /// The run started (every silo registered, or joining was closed).
    pub(crate) fn started(&self) -> bool {
        self.members.is_some()
    }

    /// The silos in the run, ascending (empty before it started).
    pub(crate) fn members(&self) -> &[usize] {
        self.members.as_deref().unwrap_or(&[])
    }

    /// The silos in the run, once it started.
    pub(crate) fn participants(&self) -> Option<&[usize]> {
        self.members.as_deref()
    }

    /// Silo `i` is in the started run.
    pub(crate) fn in_run(&self, i: usize) -> bool {
        self.members().binary_search(&i).is_ok()
    }

    /// The run started without silo `i`: it trains alone.
    pub(crate) fn left_out(&self, i: usize) -> bool {
        self.started() && !self.in_run(i)
    }

    /// Silos that have not registered, ascending.
    pub(crate) fn missing(&self) -> Vec<usize> {
        self.silos(false)
    }

    /// The silos that registered (`true`) or did not (`false`), ascending.
    fn silos(&self, registered: bool) -> Vec<usize> {
        (0..self.sizes.len())
            .filter(|&i| self.sizes[i].is_some() == registered)
            .collect()
    }

    /// Joining may close now: the run has not started and enough silos registered.
    pub(crate) fn may_close(&self) -> bool {
        !self.started() && self.registered() >= self.fewest
    }

    /// Starts the run with the silos registered so far. Returns the silos left out.
    pub(crate) fn close(&mut self) -> Result<Vec<usize>, CloseRefused> {
        if self.started() {
            return Err(CloseRefused::Started);
        }
        let joined = self.silos(true);
        if joined.is_empty() || joined.len() < self.fewest {
            return Err(CloseRefused::TooFew {
                joined: joined.len(),
                nodes: self.nodes(),
            });
        }
        self.members = Some(joined);
        Ok(self.missing())
    }

    /// Refuses an index that is not a silo of the run (a server checks it before the value).
    pub(crate) fn check(&self, i: usize) -> Result<(), Refused<T>> {
        if i < self.sizes.len() {
            Ok(())
        } else {
            Err(Refused::NotASilo {
                nodes: self.sizes.len(),
            })
        }
    }

    /// Records silo `i`'s registration. A silo may register again (a restart); a member of
    /// the started run must give the same value, since the run was cut from it. A silo that
    /// registers after the run started without it is recorded and stays out. Returns true
    /// when this registration started the run (the last silo registered).
    pub(crate) fn register(&mut self, i: usize, value: T) -> Result<bool, Refused<T>> {
        self.check(i)?;
        match self.sizes[i] {
            Some(old) if old != value && self.in_run(i) => return Err(Refused::Changed { old }),
            _ => self.sizes[i] = Some(value),
        }
        if self.started() || self.sizes.iter().any(Option::is_none) {
            return Ok(false);
        }
        self.members = Some((0..self.sizes.len()).collect());
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_registration_starts_the_run_with_every_silo() {
        let mut j = Joining::new(3, 1);
        assert!(!j.may_close());
        assert_eq!(j.register(0, 10u64), Ok(false));
        assert_eq!(j.register(2, 30), Ok(false));
        assert_eq!(j.registered(), 2);
        assert_eq!(j.missing(), [1]);
        assert!(!j.started() && j.members().is_empty() && j.participants().is_none());
        assert_eq!(
            j.register(0, 11),
            Ok(false),
            "a count may change before the start"
        );
        assert_eq!(j.register(3, 1), Err(Refused::NotASilo { nodes: 3 }));
        assert_eq!(j.register(1, 20), Ok(true));
        assert!(j.started());
        assert_eq!(j.members(), [0, 1, 2]);
        assert_eq!(j.sizes(), [Some(11), Some(20), Some(30)]);
        assert_eq!(j.register(1, 21), Err(Refused::Changed { old: 20 }));
        assert_eq!(
            j.register(1, 20),
            Ok(false),
            "a restart with the same count"
        );
        assert_eq!(j.close(), Err(CloseRefused::Started));
        assert!(!j.may_close() && !j.left_out(1));
    }

    #[test]
    fn closing_starts_the_run_with_those_that_came() {
        let mut j = Joining::new(4, 1);
        assert_eq!(
            j.close(),
            Err(CloseRefused::TooFew {
                joined: 0,
                nodes: 4
            })
        );
        j.register(1, 5u64).unwrap();
        j.register(3, 6).unwrap();
        assert!(j.may_close());
        assert_eq!(j.close(), Ok(vec![0, 2]));
        assert_eq!(j.participants(), Some(&[1, 3][..]));
        assert!(j.left_out(0) && j.left_out(2) && !j.left_out(3));
        assert!(!j.in_run(0) && j.in_run(1));
        // A late silo is recorded, stays out, and may change its count.
        assert_eq!(j.register(0, 7), Ok(false));
        assert_eq!(j.register(0, 8), Ok(false));
        assert_eq!(j.size(0), Some(8));
        assert!(j.left_out(0));
        assert_eq!(
            j.register(2, 9),
            Ok(false),
            "all registered: the run is already on"
        );
        assert_eq!(j.members(), [1, 3]);
        assert_eq!(j.missing(), Vec::<usize>::new());
        assert_eq!(j.size(9), None);
    }

    #[test]
    fn a_pair_needs_two() {
        let mut j = Joining::new(3, 2);
        j.register(2, 1u64).unwrap();
        assert!(!j.may_close());
        assert_eq!(
            j.close(),
            Err(CloseRefused::TooFew {
                joined: 1,
                nodes: 3
            })
        );
        j.register(0, 1).unwrap();
        assert!(j.may_close());
        assert_eq!(j.close(), Ok(vec![1]));
        let back = Joining::restore(j.sizes().to_vec(), j.participants().map(<[_]>::to_vec), 2);
        assert_eq!(back, j);
    }
}
