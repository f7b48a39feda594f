//! Memory regions and memory windows: the key tables and the checks every local and remote
//! access goes through.
//!
//! An MR either owns its bytes (a boxed slice that never moves, so its heap address serves as
//! the MR's virtual address, as a real registration would) or lies over application memory
//! ([`MrTable::register_user`], valid for the MR's lifetime). The application keeps reading
//! and writing that memory while RDMA traffic lands in it, so the engine never forms a Rust
//! reference over it: [`ForeignMem`] moves bytes with `ptr::copy_nonoverlapping`, does
//! atomics with [`AtomicU64::from_ptr`] and gives sends an address and a length for the
//! socket (STYLE.md §3; docs/memory.md has the sanitizer and Miri commands). Owned memory is
//! sliced as usual. Keys
//! follow rxe: `lkey == rkey == index << 8 | key byte`; MR indices are 1..=0x1_0000 and MW
//! indices 0x1_0001..=0x2_0000 (rxe `RXE_MIN_MW_INDEX`), so an R_Key names an MR or an MW by
//! its index alone (rxe `rkey_is_mw`). The key byte of a new registration is drawn from the
//! device's seeded generator and always differs from the last key byte used at that index, and
//! indices are handed out cyclically, so a stale key is rejected after re-registration.
//!
//! Fast-register MRs ([`MrTable::alloc_fast_reg`]) start in the FREE state and become usable
//! only through a REG_MR work request; LOCAL_INV and SEND_WITH_INVALIDATE put them back in
//! FREE (rxe `rxe_reg_fast_mr`, `rxe_invalidate_mr`).
//!
//! The window entries ([`MwEntry`]) and the checks an access through one goes through live
//! here too, beside the MRs they point into; the operations that change them (BIND_MW,
//! REG_MR, LOCAL_INV, SEND_WITH_INVALIDATE) are `mw.rs`, which builds on this module and not
//! the other way round.
//!
//! Source: IBTA Vol 1 ch. 10 (memory regions and windows, L_Key/R_Key checks) and C9-88
//! (zero-length RDMA needs no valid R_Key); rxe `rxe_mr.c` (`lookup_mr`, `mr_check_range`,
//! `rxe_mr_copy`), `rxe_pool.c` (cyclic index allocation).

mod access;
mod atomic;
mod foreign;
mod keys;
mod mr;
mod sge;
mod table;
mod window;

pub use atomic::AtomicOp;
pub use foreign::{ForeignMem, MrBytes};
pub(super) use keys::MW_BASE;
pub use keys::{MAX_MR, MAX_MW, is_mw_key};
pub use mr::{MrEntry, MrKind, MrState};
pub use table::MrTable;
pub use window::{MwEntry, MwState, MwType};

/// Why an access to registered memory (or a memory operation) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemError {
    /// No live MR or MW has this key (wrong index, wrong key byte, or deregistered).
    BadKey,
    /// The MR or MW belongs to another protection domain.
    PdMismatch,
    /// The MR or MW was not registered (bound) with the access the operation needs.
    Access,
    /// The byte range is not inside the MR or MW (or overflows u64).
    Range,
    /// The scatter/gather list is shorter than the data.
    Length,
    /// The MR or MW is not in the state the operation needs (a FREE fast-register MR, an
    /// unbound window, REG_MR of an MR that is not FREE).
    State,
    /// The operation does not apply to this kind of MR or MW (invalidating an MR made by
    /// `reg_mr` or a type 1 window, REG_MR of an ordinary MR).
    Type,
    /// The MR still has memory windows bound to it.
    Busy,
    /// A type 2 window bound to another QP.
    WrongQp,
}

#[cfg(test)]
mod tests;
