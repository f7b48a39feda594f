//! Protection domains (`ibv_pd`). The objects made in a PD (MRs, MWs, QPs, SRQs, AHs) are
//! created by `Pd` methods in their own files. Source: rxe `rxe_pool.c` (PD pool).

use super::base::Device;

/// A protection domain.
#[derive(Debug, Clone)]
pub struct Pd {
    pub(super) dev: Device,
    pub(super) handle: u32,
}

impl Pd {
    /// The PD's handle (unique within its device).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    pub(super) fn device(&self) -> Device {
        self.dev.clone()
    }
}
