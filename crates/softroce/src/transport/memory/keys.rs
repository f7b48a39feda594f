//! Key spaces: the MR and MW index ranges, cyclic index allocation and the seeded key byte
//! (rxe `rxe_pool.c`, `RXE_MIN_MW_INDEX`, `rkey_is_mw`).

/// Maximum number of MRs per device (rxe `RXE_MAX_MR_INDEX` was 0x1_0000).
pub const MAX_MR: usize = 1 << 16;
/// Key index of the first MR slot.
pub(super) const MR_BASE: u32 = 1;

/// A range of key indices: slots handed out cyclically, with the last key byte of each slot
/// remembered so that the next registration there gets another one.
#[derive(Debug)]
pub(in crate::transport) struct KeySpace<T> {
    pub(in crate::transport) slots: Vec<Option<T>>,
    last_byte: Vec<Option<u8>>,
    next: usize,
    base: u32,
    max: usize,
}

impl<T> KeySpace<T> {
    pub(in crate::transport) const fn new(base: u32, max: usize) -> KeySpace<T> {
        KeySpace {
            slots: Vec::new(),
            last_byte: Vec::new(),
            next: 0,
            base,
            max,
        }
    }

    /// A free slot, searching cyclically from the one after the last handed out (rxe pools
    /// allocate indices cyclically, so a freed index is not reused at once).
    pub(in crate::transport) fn alloc(&mut self) -> Option<usize> {
        for i in 0..self.max {
            let idx = (self.next + i) % self.max;
            if idx == self.slots.len() {
                self.slots.push(None);
                self.last_byte.push(None);
            }
            if matches!(self.slots.get(idx), Some(None)) {
                self.next = (idx + 1) % self.max;
                return Some(idx);
            }
        }
        None
    }

    /// The slot a key's index names, if inside this space.
    pub(in crate::transport) fn slot_of(&self, key: u32) -> Option<usize> {
        let i = (key >> 8).checked_sub(self.base)? as usize;
        (i < self.slots.len()).then_some(i)
    }

    /// The key of `slot` with key byte `byte`.
    pub(in crate::transport) fn key(&self, slot: usize, byte: u8) -> u32 {
        ((slot as u32 + self.base) << 8) | u32::from(byte)
    }

    /// A key byte for a new registration in `slot`: from `rng`, never the slot's last one.
    pub(in crate::transport) fn fresh_byte(
        &mut self,
        slot: usize,
        rng: &mut crate::rand::SplitMix64,
    ) -> u8 {
        let last = self.last_byte.get(slot).copied().flatten();
        let mut b = rng.next_u64() as u8;
        // Bounded: a few draws, then a step away from the last byte.
        for _ in 0..8 {
            if Some(b) != last {
                break;
            }
            b = rng.next_u64() as u8;
        }
        if Some(b) == last {
            b = b.wrapping_add(1);
        }
        if let Some(l) = self.last_byte.get_mut(slot) {
            *l = Some(b);
        }
        b
    }

    /// Records `byte` as the slot's last key byte (REG_MR and MW binds choose their own).
    pub(in crate::transport) fn note_byte(&mut self, slot: usize, byte: u8) {
        if let Some(l) = self.last_byte.get_mut(slot) {
            *l = Some(byte);
        }
    }
}

/// Key index of the first MW slot (rxe `RXE_MIN_MW_INDEX`).
pub(in crate::transport) const MW_BASE: u32 = 0x0001_0001;
/// Most memory windows per device (rxe `RXE_MAX_MW`).
pub const MAX_MW: usize = 0x1000;

/// True when `key`'s index lies in the memory-window range (rxe `rkey_is_mw`).
pub fn is_mw_key(key: u32) -> bool {
    let index = key >> 8;
    (MW_BASE..MW_BASE + MAX_MW as u32).contains(&index)
}
