//! The MAD agent on QP1: takes every MAD the GSI QP receives and hands it to the engine of its
//! management class. Only the CM class (0x07) has an engine; the others are counted by class.
//! Source: kernel `drivers/infiniband/core/mad.c` (`ib_mad_recv_done`: agents by class).

use super::{CmEngine, MadTransmit};
use crate::transport::Instant;
use crate::wire::grh::GRH_LEN;
use crate::wire::mad::{MAD_HDR_LEN, MGMT_CLASS_CM};
use core::net::IpAddr;
use std::collections::BTreeMap;

/// MADs the agent did not hand to an engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MadClassDrops {
    /// Shorter than the MAD common header.
    pub truncated: u64,
    /// By management class, for classes with no engine here.
    pub by_class: BTreeMap<u8, u64>,
}

/// QP1's MAD agent: demultiplexes by management class; owns the CM engine.
#[derive(Debug)]
pub struct MadAgent {
    /// The Communication Manager.
    pub cm: CmEngine,
    drops: MadClassDrops,
}

impl MadAgent {
    /// An agent serving `cm`.
    pub fn new(cm: CmEngine) -> MadAgent {
        MadAgent {
            cm,
            drops: MadClassDrops::default(),
        }
    }

    /// What was not handed on.
    pub fn drops(&self) -> &MadClassDrops {
        &self.drops
    }

    /// Handles a MAD from `src` (no GRH).
    pub fn handle_mad(&mut self, now: Instant, src: IpAddr, mad: &[u8]) {
        let Some(&class) = mad.get(1).filter(|_| mad.len() >= MAD_HDR_LEN) else {
            self.drops.truncated += 1;
            return;
        };
        if class == MGMT_CLASS_CM {
            self.cm.handle_mad(now, src, mad);
        } else {
            *self.drops.by_class.entry(class).or_default() += 1;
        }
    }

    /// Handles what a QP1 receive holds: the 40-byte GRH, then the MAD.
    pub fn handle_recv(&mut self, now: Instant, src: IpAddr, grh_and_mad: &[u8]) {
        match grh_and_mad.get(GRH_LEN..) {
            Some(mad) => self.handle_mad(now, src, mad),
            None => self.drops.truncated += 1,
        }
    }

    /// The next MAD to send from QP1.
    #[must_use]
    pub fn poll_mad(&mut self) -> Option<MadTransmit> {
        self.cm.poll_mad()
    }

    /// When `handle_timeout` is next due.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.cm.poll_timeout()
    }

    /// Fires the engines' due timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.cm.handle_timeout(now);
    }
}
