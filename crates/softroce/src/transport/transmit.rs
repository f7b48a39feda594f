//! Transport: what the engine emits, a [`Transmit`] per datagram, labelled by kind
//! ([`TxKind`]) so that the link decides only when to send it; and the zero-copy form whose
//! payload stays in registered memory until the link hands it to the kernel ([`TxPart`]).

use super::*;

/// A datagram to send: UDP payload (BTH … ICRC) from `src_port` to `dst`:4791.
///
/// Normally `payload` holds the whole datagram. A requester whose link gathers
/// ([`QpEngine::set_gather`], from `Link::gathers`) may instead leave a packet's payload in
/// the registered memory it comes from: then `payload` holds the headers only and `tail`
/// the rest (payload bytes in the MR, pad, ICRC), to be sent with `sendmsg` iovecs, with no
/// copy (issue 7). Such a datagram is only valid while the device lock under which it was
/// built is held, that is within the `Link::send_batch` call that receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// What the datagram is, as the part of the engine that built it knows.
    pub kind: TxKind,
    /// Destination IP.
    pub dst: IpAddr,
    /// UDP source port (the QP's).
    pub src_port: u16,
    /// UDP payload, or its headers when `tail` is set.
    pub payload: Vec<u8>,
    /// The rest of the datagram, left in registered memory.
    pub tail: Option<PayloadRef>,
    /// IP header fields to send it with (the QP's or the address handle's).
    pub ip: IpFields,
}

/// What a [`Transmit`] carries, set where the packet is built: a request of the requester,
/// or one of the responder's answers. A link uses it to choose *when* to send (an ACK may
/// wait for the end of a receive batch; a response must not overtake ACKs held before it),
/// never to look inside the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxKind {
    /// An ACKNOWLEDGE: a positive ACK, a NAK or an RNR NAK (BTH and AETH only).
    Acknowledge,
    /// An ATOMIC ACKNOWLEDGE (AETH and AtomicAckETH).
    AtomicAcknowledge,
    /// One packet of an RDMA READ response.
    ReadResponse,
    /// A request packet (RC, UC or UD), new or retransmitted.
    Request,
}

impl TxKind {
    /// True for the responder's stream (ACKs, NAKs, READ responses, ATOMIC ACKNOWLEDGEs),
    /// whose packets the peer's completer takes in PSN order.
    pub const fn is_response(self) -> bool {
        !matches!(self, TxKind::Request)
    }
}

/// The part of a gathered [`Transmit`] after its headers: `len` payload bytes at `ptr` in a
/// registered MR, `pad` zero bytes, then the ICRC (computed over all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef {
    ptr: NonNull<u8>,
    len: usize,
    pad: u8,
    icrc: [u8; 4],
}

// SAFETY: a `PayloadRef`'s bytes are only read (`TxPart::copy_into`, or by the kernel from
// an iovec) by the link that receives it in `send_batch`, in the thread that built it, under
// the device lock that keeps the MR registered; moving the value between threads moves no
// access with it.
unsafe impl Send for PayloadRef {}
// SAFETY: as for `Send`: shared references give no access to the memory.
unsafe impl Sync for PayloadRef {}

/// Zero bytes for the pad of a gathered datagram (at most 3).
static PAD_ZEROS: [u8; 3] = [0; 3];

/// A datagram whose headers are built into a cached buffer and whose payload `data` stays
/// where it is, in a registered MR ([`Transmit::tail`]), with the ICRC computed over headers,
/// payload and pad (the payload read in place when the engine owns it, in short copies when
/// the application does), for the flow `path`. Valid only under the device lock, as
/// [`Transmit::parts`] says.
pub(super) fn gathered(
    kind: TxKind,
    repr: &PacketRepr,
    data: MrBytes<'_>,
    path: &Path,
) -> Transmit {
    let h = repr.header_len();
    let mut buf = bufpool::take(h);
    repr.emit_headers(&mut buf);
    let pad = repr.buffer_len() - h - data.len() - ICRC_LEN;
    let pad_bytes = &PAD_ZEROS[..pad];
    let ip = path.icrc_ip();
    let icrc = if data.chunks() == 1 {
        // The payload as one slice (owned memory, or one short copy of application memory):
        // the headers and a small payload then hash in one pass.
        let mut icrc = [0u8; 4];
        data.for_each_chunk(|d| icrc = icrc_of_body_parts(&ip, &[&buf, d, pad_bytes]));
        icrc
    } else {
        let mut hasher = IcrcHasher::new(&ip, &buf, h + data.len() + pad);
        data.for_each_chunk(|c| hasher.update(c));
        hasher.update(pad_bytes);
        hasher.finish()
    };
    let (ptr, len) = data.raw();
    Transmit {
        kind,
        dst: path.remote,
        src_port: path.src_port,
        payload: buf,
        tail: Some(PayloadRef {
            ptr,
            len,
            pad: pad as u8,
            icrc,
        }),
        ip: path.ip,
    }
}

/// One piece of a datagram for the socket: bytes the engine holds, or `len` bytes at an
/// address in registered memory, which may be the application's and so is never lent as a
/// slice ([`TxPart::copy_into`] copies it, a link hands [`TxPart::raw`] to the kernel as an
/// iovec). Only [`Transmit::parts`] makes the second kind, under its safety contract.
#[derive(Debug, Clone, Copy)]
pub struct TxPart<'a>(Part<'a>);

#[derive(Debug, Clone, Copy)]
enum Part<'a> {
    Bytes(&'a [u8]),
    /// Valid for reads while the device lock is held ([`Transmit::parts`]).
    Mr {
        ptr: NonNull<u8>,
        len: usize,
        _transmit: core::marker::PhantomData<&'a Transmit>,
    },
}

impl<'a> From<&'a [u8]> for TxPart<'a> {
    fn from(b: &'a [u8]) -> TxPart<'a> {
        TxPart(Part::Bytes(b))
    }
}

impl TxPart<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self.0 {
            Part::Bytes(b) => b.len(),
            Part::Mr { len, .. } => len,
        }
    }

    /// True for no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address and length, for an iovec (the kernel only reads them).
    pub fn raw(&self) -> (*const u8, usize) {
        match self.0 {
            Part::Bytes(b) => (b.as_ptr(), b.len()),
            Part::Mr { ptr, len, .. } => (ptr.as_ptr().cast_const(), len),
        }
    }

    /// Appends the bytes to `out`.
    pub fn copy_into(&self, out: &mut Vec<u8>) {
        match self.0 {
            Part::Bytes(b) => out.extend_from_slice(b),
            Part::Mr { ptr, len, .. } => {
                out.reserve(len);
                let at = out.len();
                // SAFETY: `ptr` is valid for `len` bytes of reads while the device lock that
                // `Transmit::parts`' caller holds keeps the MR registered (the engine checked
                // the range against the MR when it built the datagram; only `parts` makes a
                // `Part::Mr`); `out` has room for `len` more bytes after `at` and is ours, so
                // the two do not overlap; once copied the bytes are initialized, so the new
                // length covers them.
                unsafe {
                    core::ptr::copy_nonoverlapping(ptr.as_ptr(), out.as_mut_ptr().add(at), len);
                    out.set_len(at + len);
                }
            }
        }
    }
}

impl Transmit {
    /// A datagram of `kind` held whole in `payload`.
    pub fn new(kind: TxKind, dst: IpAddr, src_port: u16, payload: Vec<u8>) -> Transmit {
        Transmit {
            kind,
            dst,
            src_port,
            payload,
            tail: None,
            ip: IpFields::default(),
        }
    }

    /// The same datagram, sent with the IP header fields `ip`.
    #[must_use]
    pub fn with_ip(mut self, ip: IpFields) -> Transmit {
        self.ip = ip;
        self
    }

    /// The datagram's length in bytes (headers, payload, pad and ICRC).
    pub fn len(&self) -> usize {
        self.payload.len()
            + self
                .tail
                .map_or(0, |t| t.len + usize::from(t.pad) + t.icrc.len())
    }

    /// True for an empty datagram (never built by the engine).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ICRC of a gathered datagram (the last of its [`Transmit::parts`]); `None` for one
    /// held whole, whose ICRC is the last 4 bytes of `payload`.
    pub fn tail_icrc(&self) -> Option<[u8; 4]> {
        self.tail.map(|t| t.icrc)
    }

    /// The datagram as four consecutive parts: `[payload, MR bytes, pad, ICRC]` for a
    /// gathered one, `[payload, [], [], []]` otherwise (no allocation, no copy). The MR
    /// bytes are an address and a length ([`TxPart::raw`]), never a slice: the application
    /// may be using them.
    ///
    /// # Safety
    /// For a gathered datagram, the MR part may be read (copied, or sent by the
    /// kernel) only while the device lock under which the engine built it is still held
    /// (inside the `Link::send_batch` or `Link::send` call that received it): the MR may be
    /// deregistered after that.
    pub unsafe fn parts(&self) -> [TxPart<'_>; 4] {
        match &self.tail {
            None => [
                TxPart::from(&self.payload[..]),
                TxPart::from(&[][..]),
                TxPart::from(&[][..]),
                TxPart::from(&[][..]),
            ],
            Some(t) => [
                TxPart::from(&self.payload[..]),
                TxPart(Part::Mr {
                    ptr: t.ptr,
                    len: t.len,
                    _transmit: core::marker::PhantomData,
                }),
                TxPart::from(&PAD_ZEROS[..usize::from(t.pad)]),
                TxPart::from(&t.icrc[..]),
            ],
        }
    }

    /// The whole datagram in one buffer (a copy for a gathered one).
    ///
    /// # Safety
    /// As [`Transmit::parts`].
    pub unsafe fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        // SAFETY: forwarded to the caller.
        for p in unsafe { self.parts() } {
            p.copy_into(&mut v);
        }
        v
    }
}
