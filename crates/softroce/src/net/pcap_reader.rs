//! Net: reading captures back, the counterpart of [`Capture`](super::Capture).
//!
//! [`CaptureReader`] reads a pcap or pcapng file (the format is told by its first four bytes)
//! and yields its frames in file order, numbered from 1 as Wireshark numbers them, each with
//! its link type. It is what `softroce decode`, the golden-capture tests and the fuzz seed
//! builder read captures with.
//!
//! Errors name what went wrong in the words a user needs: an empty file, a file that is not a
//! capture, or a capture cut short (what Ctrl-C on a capturing program leaves), with the number
//! of the last whole frame, so that a caller can report what it read before the cut.

use crate::wire::ip_udp::LinkType;
use pcap_file::PcapError;
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

/// The first four bytes of a pcapng file (a Section Header Block's type).
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// One frame of a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedFrame {
    /// Position in the file, from 1.
    pub number: u64,
    /// The captured bytes (fewer than `orig_len` when the snap length cut the frame).
    pub data: Vec<u8>,
    /// Length of the frame on the wire, in bytes.
    pub orig_len: u32,
    /// The frame's link type, or the number of a link type softroce does not parse.
    pub link: Result<LinkType, u32>,
}

/// Why a capture could not be read (further).
#[derive(Debug)]
#[non_exhaustive]
pub enum CaptureReadError {
    /// The file holds no byte at all.
    Empty,
    /// The file does not start with a pcap or pcapng header; the text says what is wrong.
    NotACapture(String),
    /// The file ends inside a record header or a record: `after_frame` frames were whole.
    Truncated {
        /// How many frames were read whole before the cut.
        after_frame: u64,
    },
    /// A record after frame `after_frame` is malformed; the text says how.
    Malformed {
        /// How many frames were read before the malformed record.
        after_frame: u64,
        /// pcap-file's description.
        what: String,
    },
    /// The operating system failed to read the file.
    Io(io::Error),
}

impl core::fmt::Display for CaptureReadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CaptureReadError::Empty => f.write_str("empty file: not a pcap or pcapng capture"),
            CaptureReadError::NotACapture(what) => {
                write!(f, "not a pcap or pcapng capture ({what})")
            }
            CaptureReadError::Truncated { after_frame } => write!(
                f,
                "truncated after frame {after_frame}: the file ends inside a record (a capture \
                 cut short, e.g. by Ctrl-C)"
            ),
            CaptureReadError::Malformed { after_frame, what } => {
                write!(f, "malformed record after frame {after_frame}: {what}")
            }
            CaptureReadError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CaptureReadError {}

/// The file as read: the four bytes read to tell the format, then the rest.
type Whole<R> = io::Chain<io::Cursor<[u8; 4]>, R>;

enum Format<R: Read> {
    Pcap {
        reader: PcapReader<Whole<R>>,
        link: Result<LinkType, u32>,
    },
    PcapNg(PcapNgReader<Whole<R>>),
}

/// The frames of a pcap or pcapng capture, in order (an iterator of
/// `Result<CapturedFrame, CaptureReadError>` that ends after the first error).
pub struct CaptureReader<R: Read> {
    format: Format<R>,
    frames: u64,
    done: bool,
}

impl<R: Read> core::fmt::Debug for CaptureReader<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CaptureReader")
            .field("frames", &self.frames)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl CaptureReader<BufReader<File>> {
    /// Opens the capture at `path`. Errors: [`CaptureReadError::Io`] when the file cannot be
    /// opened, and those of [`CaptureReader::new`].
    pub fn open(path: &Path) -> Result<Self, CaptureReadError> {
        let file = File::open(path).map_err(CaptureReadError::Io)?;
        CaptureReader::new(BufReader::new(file))
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads the file header from `reader`. Errors: [`CaptureReadError::Empty`] for no bytes,
    /// [`CaptureReadError::NotACapture`] for a header that is neither pcap nor pcapng (or is
    /// cut short), [`CaptureReadError::Io`] when reading fails.
    pub fn new(mut reader: R) -> Result<Self, CaptureReadError> {
        let mut magic = [0u8; 4];
        let mut got = 0;
        while got < magic.len() {
            match reader.read(&mut magic[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CaptureReadError::Io(e)),
            }
        }
        if got == 0 {
            return Err(CaptureReadError::Empty);
        }
        if got < magic.len() {
            return Err(CaptureReadError::NotACapture(format!(
                "{got} bytes, shorter than any capture header"
            )));
        }
        let whole = io::Cursor::new(magic).chain(reader);
        let header_error = |e: PcapError| match e {
            PcapError::IoError(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                CaptureReadError::NotACapture("the file ends inside its header".to_string())
            }
            PcapError::IoError(e) => CaptureReadError::Io(e),
            other => CaptureReadError::NotACapture(other.to_string()),
        };
        let format = if magic == PCAPNG_MAGIC {
            Format::PcapNg(PcapNgReader::new(whole).map_err(header_error)?)
        } else {
            let reader = PcapReader::new(whole).map_err(header_error)?;
            let link = link_type(reader.header().datalink);
            Format::Pcap { reader, link }
        };
        Ok(CaptureReader {
            format,
            frames: 0,
            done: false,
        })
    }

    /// How many frames have been yielded so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    fn record_error(&self, e: PcapError) -> CaptureReadError {
        match e {
            PcapError::IoError(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                CaptureReadError::Truncated {
                    after_frame: self.frames,
                }
            }
            PcapError::IoError(e) => CaptureReadError::Io(e),
            other => CaptureReadError::Malformed {
                after_frame: self.frames,
                what: other.to_string(),
            },
        }
    }

    fn next_frame(&mut self) -> Option<Result<CapturedFrame, PcapError>> {
        match &mut self.format {
            Format::Pcap { reader, link } => {
                let link = *link;
                let number = self.frames + 1;
                reader.next_packet().map(|p| {
                    p.map(|p| CapturedFrame {
                        number,
                        orig_len: p.orig_len,
                        data: p.data.into_owned(),
                        link,
                    })
                })
            }
            Format::PcapNg(reader) => loop {
                let block = match reader.next_block()? {
                    Ok(b) => b,
                    Err(e) => return Some(Err(e)),
                };
                let (data, orig_len, iface) = match block {
                    Block::EnhancedPacket(p) => {
                        (p.data.into_owned(), p.original_len, p.interface_id)
                    }
                    Block::SimplePacket(p) => {
                        let n = u32::try_from(p.data.len()).unwrap_or(u32::MAX);
                        (p.data.into_owned(), p.original_len.max(n), 0)
                    }
                    Block::Packet(p) => (
                        p.data.into_owned(),
                        p.original_len,
                        u32::from(p.interface_id),
                    ),
                    _ => continue,
                };
                let link = reader
                    .interfaces()
                    .get(iface as usize)
                    .map_or(Err(u32::MAX), |i| link_type(i.linktype));
                return Some(Ok(CapturedFrame {
                    number: self.frames + 1,
                    data,
                    orig_len,
                    link,
                }));
            },
        }
    }
}

impl<R: Read> Iterator for CaptureReader<R> {
    type Item = Result<CapturedFrame, CaptureReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_frame() {
            None => {
                self.done = true;
                None
            }
            Some(Ok(f)) => {
                self.frames = f.number;
                Some(Ok(f))
            }
            Some(Err(e)) => {
                self.done = true;
                Some(Err(self.record_error(e)))
            }
        }
    }
}

/// The [`LinkType`] of a pcap link-layer header type, or its number when softroce does not
/// parse it. Raw IP is LINKTYPE_RAW (101), LINKTYPE_IPV4/IPV6 (228/229) or DLT_RAW (12/14).
pub fn link_type(d: pcap_file::DataLink) -> Result<LinkType, u32> {
    use pcap_file::DataLink as D;
    match d {
        D::ETHERNET => Ok(LinkType::Ethernet),
        D::RAW | D::IPV4 | D::IPV6 | D::Unknown(12 | 14) => Ok(LinkType::RawIp),
        D::LINUX_SLL => Ok(LinkType::LinuxSll),
        D::LINUX_SLL2 => Ok(LinkType::LinuxSll2),
        other => Err(u32::from(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    use std::time::Duration;

    fn pcap_of(frames: &[&[u8]]) -> Vec<u8> {
        let header = PcapHeader {
            datalink: pcap_file::DataLink::RAW,
            ..PcapHeader::default()
        };
        let mut w = PcapWriter::with_header(Vec::new(), header).unwrap();
        for f in frames {
            w.write_packet(&PcapPacket::new(Duration::ZERO, f.len() as u32, f))
                .unwrap();
        }
        w.into_writer()
    }

    fn read_all(bytes: &[u8]) -> (Vec<CapturedFrame>, Option<CaptureReadError>) {
        let r = match CaptureReader::new(bytes) {
            Ok(r) => r,
            Err(e) => return (Vec::new(), Some(e)),
        };
        let mut frames = Vec::new();
        for f in r {
            match f {
                Ok(f) => frames.push(f),
                Err(e) => return (frames, Some(e)),
            }
        }
        (frames, None)
    }

    #[test]
    fn frames_come_back_numbered_with_their_link_type() {
        let bytes = pcap_of(&[b"one", b"second"]);
        let (frames, err) = read_all(&bytes);
        assert!(err.is_none());
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].number, 1);
        assert_eq!(frames[1].number, 2);
        assert_eq!(frames[1].data, b"second");
        assert_eq!(frames[1].orig_len, 6);
        assert_eq!(frames[0].link, Ok(LinkType::RawIp));
    }

    #[test]
    fn a_cut_capture_says_after_which_frame() {
        let bytes = pcap_of(&[b"one", b"second", b"third"]);
        // Every cut inside the third record (its 16-byte header, then its data).
        let third = bytes.len() - (16 + 5);
        for cut in third + 1..bytes.len() {
            let (frames, err) = read_all(&bytes[..cut]);
            assert_eq!(frames.len(), 2, "cut at {cut}");
            match err {
                Some(CaptureReadError::Truncated { after_frame: 2 }) => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        let e = read_all(&bytes[..third + 3]).1.unwrap();
        assert!(e.to_string().starts_with("truncated after frame 2"), "{e}");
    }

    #[test]
    fn empty_and_foreign_files_are_named_for_what_they_are() {
        assert!(matches!(read_all(b"").1, Some(CaptureReadError::Empty)));
        assert_eq!(
            read_all(b"").1.unwrap().to_string(),
            "empty file: not a pcap or pcapng capture"
        );
        assert!(matches!(
            read_all(b"ab").1,
            Some(CaptureReadError::NotACapture(_))
        ));
        assert!(matches!(
            read_all(b"hello, this is text\n").1,
            Some(CaptureReadError::NotACapture(_))
        ));
        // A pcap header cut in the middle.
        let bytes = pcap_of(&[]);
        assert!(matches!(
            read_all(&bytes[..10]).1,
            Some(CaptureReadError::NotACapture(_))
        ));
        // A whole header and no record: a valid, empty capture.
        let (frames, err) = read_all(&bytes);
        assert!(frames.is_empty() && err.is_none());
    }
}
