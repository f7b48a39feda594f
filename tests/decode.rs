//! `softroce decode` against the wire layer, on every kernel-rxe capture in tests/captures:
//! one JSON object per frame whose every field equals what `RocePacket::parse` finds in the
//! same bytes, `icrc_ok` true for every RoCEv2 frame (the ICRC over the captured IP header),
//! the frames the wire layer rejects reported with their error and counted drop reason, and one
//! text line per frame. The same file as pcapng (converted by tshark, when installed) decodes
//! to the same JSON.

use serde_json::Value;
use softroce::transport::DropReason;
use softroce::wire::ip_udp::{LinkType, parse_frame};
use softroce::wire::{ROCE_V2_UDP_PORT, RocePacket};
use std::path::{Path, PathBuf};
use std::process::Command;

fn captures() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/captures");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 35, "expected the rxe captures");
    paths
}

fn decode(path: &Path, json: bool) -> Vec<String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_softroce"));
    cmd.arg("decode");
    if json {
        cmd.arg("--json");
    }
    let out = cmd.arg(path).output().expect("run softroce decode");
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The frames of a pcap with its link type.
fn frames(path: &Path) -> (LinkType, Vec<Vec<u8>>) {
    let mut link = None;
    let out = softroce::net::CaptureReader::open(path)
        .unwrap()
        .map(|p| {
            let p = p.unwrap();
            link = Some(p.link.unwrap());
            p.data
        })
        .collect();
    (link.unwrap_or(LinkType::Ethernet), out)
}

fn u(v: &Value) -> u64 {
    match v {
        Value::Bool(b) => u64::from(*b),
        v => v.as_u64().unwrap_or_else(|| panic!("not a number: {v}")),
    }
}

#[test]
fn json_equals_the_wire_layer_on_every_rxe_capture() {
    let (mut roce, mut rejected, mut other) = (0, 0, 0);
    for path in captures() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let (link, data) = frames(&path);
        let lines = decode(&path, true);
        assert_eq!(lines.len(), data.len(), "{name}: one object per frame");
        for (i, (bytes, line)) in data.iter().zip(&lines).enumerate() {
            let at = format!("{name} frame {}", i + 1);
            let o: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{at}: {e}"));
            assert_eq!(u(&o["frame"]), i as u64 + 1, "{at}");
            let Ok(d) = parse_frame(bytes, link) else {
                assert!(
                    o.get("error").is_some() && o.get("bth").is_none(),
                    "{at}: {o}"
                );
                other += 1;
                continue;
            };
            assert_eq!(o["src"].as_str(), Some(d.src.to_string().as_str()), "{at}");
            assert_eq!(o["dst"].as_str(), Some(d.dst.to_string().as_str()), "{at}");
            assert_eq!(u(&o["src_port"]), u64::from(d.src_port), "{at}");
            assert_eq!(u(&o["dst_port"]), u64::from(d.dst_port), "{at}");
            if d.dst_port != ROCE_V2_UDP_PORT {
                assert!(
                    o.get("bth").is_none() && o["icrc_ok"].is_null(),
                    "{at}: {o}"
                );
                other += 1;
                continue;
            }
            let p = match RocePacket::parse(d.payload) {
                Ok(p) => p,
                Err(e) => {
                    assert_eq!(o["error"].as_str(), Some(e.to_string().as_str()), "{at}");
                    assert_eq!(
                        o["drop_reason"].as_str(),
                        Some(DropReason::from(e).name()),
                        "{at}"
                    );
                    rejected += 1;
                    continue;
                }
            };
            roce += 1;
            let r = &p.repr;
            assert_eq!(u(&o["opcode"]), u64::from(r.bth.opcode.0), "{at}");
            assert_eq!(o["opcode_name"].as_str(), Some(p.info.name), "{at}");
            let b = &o["bth"];
            for (k, want) in [
                ("opcode", u64::from(r.bth.opcode.0)),
                ("se", u64::from(r.bth.se)),
                ("mig_req", u64::from(r.bth.mig_req)),
                ("pad_count", u64::from(r.bth.pad_count)),
                ("tver", u64::from(r.bth.tver)),
                ("pkey", u64::from(r.bth.pkey)),
                ("fecn", u64::from(r.bth.fecn)),
                ("becn", u64::from(r.bth.becn)),
                ("dest_qpn", u64::from(r.bth.dest_qpn)),
                ("ack_req", u64::from(r.bth.ack_req)),
                ("psn", u64::from(r.bth.psn.value())),
            ] {
                assert_eq!(u(&b[k]), want, "{at}: bth.{k}");
            }
            let mut expect: Vec<(&str, &str, u64)> = Vec::new();
            if let Some(h) = r.reth {
                expect.extend([
                    ("reth", "va", h.va),
                    ("reth", "rkey", u64::from(h.rkey)),
                    ("reth", "dma_len", u64::from(h.dma_len)),
                ]);
            }
            if let Some(h) = r.aeth {
                expect.extend([
                    ("aeth", "syndrome", u64::from(h.syndrome)),
                    ("aeth", "msn", u64::from(h.msn)),
                ]);
            }
            if let Some(h) = r.deth {
                expect.extend([
                    ("deth", "qkey", u64::from(h.qkey)),
                    ("deth", "src_qpn", u64::from(h.src_qpn)),
                ]);
            }
            if let Some(h) = r.immdt {
                expect.push(("immdt", "imm_data", u64::from(h.imm_data)));
            }
            if let Some(h) = r.ieth {
                expect.push(("ieth", "rkey", u64::from(h.rkey)));
            }
            if let Some(h) = r.atomic_eth {
                expect.extend([
                    ("atomic_eth", "va", h.va),
                    ("atomic_eth", "rkey", u64::from(h.rkey)),
                    ("atomic_eth", "swap_add", h.swap_add),
                    ("atomic_eth", "compare", h.compare),
                ]);
            }
            if let Some(h) = r.atomic_ack_eth {
                expect.push(("atomic_ack_eth", "orig_remote_data", h.orig_remote_data));
            }
            for (hdr, k, want) in &expect {
                assert_eq!(u(&o[*hdr][*k]), *want, "{at}: {hdr}.{k}");
            }
            // No header object beyond those the packet has.
            let objects = o
                .as_object()
                .unwrap()
                .values()
                .filter(|v| v.is_object())
                .count();
            let mut hdrs: Vec<&str> = expect.iter().map(|(h, _, _)| *h).collect();
            hdrs.dedup();
            assert_eq!(objects, 1 + hdrs.len(), "{at}: {o}");
            assert_eq!(u(&o["payload_len"]), r.payload_len as u64, "{at}");
            assert_eq!(
                o["icrc"].as_str(),
                Some(format!("{:#010x}", u32::from_be_bytes(p.icrc)).as_str()),
                "{at}"
            );
            assert_eq!(
                o["icrc_ok"],
                Value::Bool(true),
                "{at}: ICRC over the captured header"
            );
            assert!(o.get("error").is_none(), "{at}");
        }
    }
    eprintln!("{roce} RoCEv2 frames, {rejected} rejected by the wire layer, {other} other");
    assert!(roce > 900);
    assert_eq!(
        rejected, 6,
        "the non-RoCE UDP/4791 frames of the host-path captures"
    );
}

#[test]
fn text_output_has_one_line_per_frame() {
    for path in captures() {
        let (_, data) = frames(&path);
        let lines = decode(&path, false);
        assert_eq!(lines.len(), data.len(), "{}", path.display());
        for (i, l) in lines.iter().enumerate() {
            assert!(
                l.trim_start().starts_with(&format!("{} ", i + 1)),
                "{}: {l}",
                path.display()
            );
            // Only the frames the wire layer rejects (not RoCE) fail their ICRC.
            assert!(
                !l.contains("icrc=BAD") || l.ends_with(']'),
                "{}: {l}",
                path.display()
            );
        }
    }
}

#[test]
fn pcapng_decodes_like_pcap() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/captures/16-read-bw.pcap");
    let ng = std::env::temp_dir().join(format!("softroce-{}-16.pcapng", std::process::id()));
    let converted = Command::new("tshark")
        .arg("-r")
        .arg(&src)
        .args(["-F", "pcapng", "-w"])
        .arg(&ng)
        .output();
    match converted {
        Ok(o) if o.status.success() => {}
        _ => {
            eprintln!("SKIPPED: tshark is needed to write a pcapng (apt-get install tshark)");
            return;
        }
    }
    assert_eq!(decode(&ng, true), decode(&src, true));
    let _ = std::fs::remove_file(&ng);
}

/// What a newcomer met (issue 17, items 2 and 5): a capture cut short by Ctrl-C printed its
/// frames, then "Error reading bytes" with no file name; an empty file printed "failed to
/// fill whole buffer". Now a cut capture decodes up to its last whole frame, prints the
/// summary and fails naming the file and the frame; an empty file is called what it is.
#[test]
fn a_cut_capture_decodes_up_to_the_cut_and_names_it() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/captures/13-write-bw.pcap");
    let whole = std::fs::read(&src).unwrap();
    let total = frames(&src).1.len();
    let dir = std::env::temp_dir();
    let cut = dir.join(format!("softroce-{}-cut.pcap", std::process::id()));
    // Cut 5 bytes into the last record's data.
    let last_len = frames(&src).1.last().unwrap().len();
    std::fs::write(&cut, &whole[..whole.len() - last_len + 5]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .arg("decode")
        .arg(&cut)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stdout.lines().count(), total - 1, "{stdout}");
    assert!(
        stderr.contains(&format!("{} frames: ", total - 1)),
        "the summary of what was read: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{}: truncated after frame {}",
            cut.display(),
            total - 1
        )),
        "{stderr}"
    );
    let empty = dir.join(format!("softroce-{}-empty.pcap", std::process::id()));
    std::fs::write(&empty, b"").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .arg("decode")
        .arg(&empty)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!(
            "{}: empty file: not a pcap or pcapng capture",
            empty.display()
        )),
        "{stderr}"
    );
    let _ = std::fs::remove_file(&cut);
    let _ = std::fs::remove_file(&empty);
}
