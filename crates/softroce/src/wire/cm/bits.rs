//! The vocabulary every CM message view shares: the message length, bit-field access counted
//! from the most significant bit, and the view macro. It imports none of the message files
//! (req.rs, rep.rs, rej.rs, dreq.rs, sidr.rs, rdma_cm.rs), which all import it.
//!
//! Panics: never on a view's checked bytes. Allocation: none.
//! Source: IBTA Vol 1 ch. 12 (CM message formats); kernel `include/rdma/ibta_vol1_c12.h`
//! (`CM_FIELD_BLOC`).

use crate::wire::mad::{MAD_HDR_LEN, MAD_LEN};

/// Length of a CM message (a MAD without its common header), in bytes.
pub const CM_MSG_LEN: usize = MAD_LEN - MAD_HDR_LEN;

/// Reads `width` bits of `b` starting `msb_offset` bits below its most significant bit.
#[inline]
pub(super) const fn get_bits(b: u8, msb_offset: u32, width: u32) -> u8 {
    (b >> (8 - msb_offset - width)) & (((1u16 << width) - 1) as u8)
}

/// Writes the low `width` bits of `v` into `b` at `msb_offset`, keeping the other bits.
#[inline]
pub(super) fn put_bits(b: &mut u8, msb_offset: u32, width: u32, v: u8) {
    let shift = 8 - msb_offset - width;
    let mask = ((((1u16 << width) - 1) as u8) as u16) << shift;
    *b = (*b & !(mask as u8)) | (((u16::from(v) << shift) & mask) as u8);
}

/// Copies `src` into a fixed array (the caller passes exactly N bytes from a checked view).
pub(super) fn arr<const N: usize>(src: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    let n = src.len().min(N);
    a[..n].copy_from_slice(&src[..n]);
    a
}

/// Declares a CM message view over [`CM_MSG_LEN`] bytes: a getter and a setter per field, and
/// the private data from `$pd` to the end. Field kinds: `u8[o]`, `bits[o, msb_offset, width]`
/// (an `u8`), `flag[o, msb_offset]` (a `bool`), `u16[o]`, `u20[o]` (the top 20 bits of the
/// 32 at `o`), `u24[o]` (the 24 bits at `o..o+3`), `u32[o]`, `u64[o]`, `gid[o]` (16 bytes).
macro_rules! cm_view {
    (
        $(#[$m:meta])* $name:ident, private_data: $pd:expr,
        { $( $(#[$fm:meta])* $get:ident / $set:ident : $kind:ident [ $($pos:expr),+ ] ; )* }
    ) => {
        header_view!($(#[$m])* $name, CM_MSG_LEN);

        impl<T: AsRef<[u8]>> $name<T> {
            /// Offset of the private data in the message, in bytes.
            pub const PRIVATE_DATA_OFFSET: usize = $pd;
            /// Length of the private data, in bytes.
            pub const PRIVATE_DATA_LEN: usize = CM_MSG_LEN - $pd;
            $(
                $(#[$fm])*
                pub fn $get(&self) -> cm_view!(@ty $kind) {
                    cm_view!(@get $kind, self.buffer.as_ref(), $($pos),+)
                }
            )*
            /// The private data: from its offset to the end of the message.
            pub fn private_data(&self) -> &[u8] {
                &self.buffer.as_ref()[$pd..CM_MSG_LEN]
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $(
                #[doc = concat!("Sets the field `", stringify!($get), "` returns.")]
                pub fn $set(&mut self, v: cm_view!(@ty $kind)) {
                    cm_view!(@set $kind, self.buffer.as_mut(), v, $($pos),+)
                }
            )*
            /// The private data, writable.
            pub fn private_data_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[$pd..CM_MSG_LEN]
            }
        }
    };
    (@ty u8) => { u8 };
    (@ty bits) => { u8 };
    (@ty flag) => { bool };
    (@ty u16) => { u16 };
    (@ty u20) => { u32 };
    (@ty u24) => { u32 };
    (@ty u32) => { u32 };
    (@ty u64) => { u64 };
    (@ty gid) => { [u8; 16] };
    (@get u8, $b:expr, $o:expr) => { $b[$o] };
    (@get bits, $b:expr, $o:expr, $s:expr, $w:expr) => { get_bits($b[$o], $s, $w) };
    (@get flag, $b:expr, $o:expr, $s:expr) => { get_bits($b[$o], $s, 1) != 0 };
    (@get u16, $b:expr, $o:expr) => { be16(&$b[$o..$o + 2]) };
    (@get u20, $b:expr, $o:expr) => { be32(&$b[$o..$o + 4]) >> 12 };
    (@get u24, $b:expr, $o:expr) => { be24(&$b[$o..$o + 3]) };
    (@get u32, $b:expr, $o:expr) => { be32(&$b[$o..$o + 4]) };
    (@get u64, $b:expr, $o:expr) => { be64(&$b[$o..$o + 8]) };
    (@get gid, $b:expr, $o:expr) => {{
        let mut g = [0u8; 16];
        g.copy_from_slice(&$b[$o..$o + 16]);
        g
    }};
    (@set u8, $b:expr, $v:expr, $o:expr) => { $b[$o] = $v };
    (@set bits, $b:expr, $v:expr, $o:expr, $s:expr, $w:expr) => { put_bits(&mut $b[$o], $s, $w, $v) };
    (@set flag, $b:expr, $v:expr, $o:expr, $s:expr) => { put_bits(&mut $b[$o], $s, 1, u8::from($v)) };
    (@set u16, $b:expr, $v:expr, $o:expr) => { $b[$o..$o + 2].copy_from_slice(&$v.to_be_bytes()) };
    (@set u20, $b:expr, $v:expr, $o:expr) => {{
        let low = $b[$o + 2] & 0x0f;
        put_be24(&mut $b[$o..$o + 3], ($v & 0x000f_ffff) << 4);
        $b[$o + 2] |= low;
    }};
    (@set u24, $b:expr, $v:expr, $o:expr) => { put_be24(&mut $b[$o..$o + 3], $v) };
    (@set u32, $b:expr, $v:expr, $o:expr) => { $b[$o..$o + 4].copy_from_slice(&$v.to_be_bytes()) };
    (@set u64, $b:expr, $v:expr, $o:expr) => { $b[$o..$o + 8].copy_from_slice(&$v.to_be_bytes()) };
    (@set gid, $b:expr, $v:expr, $o:expr) => { $b[$o..$o + 16].copy_from_slice(&$v) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_read_and_write_from_the_most_significant_bit() {
        // REQ byte 43 of 30-rping: 0xa0 = remote CM response timeout 0x14, type 0, e2e 0.
        assert_eq!(get_bits(0xa0, 0, 5), 0x14);
        assert_eq!(get_bits(0xa7, 5, 3), 7);
        let mut b = 0xffu8;
        put_bits(&mut b, 5, 2, 0);
        assert_eq!(b, 0xf9);
        put_bits(&mut b, 0, 5, 0x1f_u8 + 0x20); // bits above the width are ignored
        assert_eq!(b, 0xf9);
    }
}
