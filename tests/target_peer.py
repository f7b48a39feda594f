#!/usr/bin/env python3
"""A scripted RoCEv2 peer for `softroce target`, in Python's standard library only.

Usage: target_peer.py SOFTROCE_BINARY [PEER_IP TARGET_IP_A TARGET_IP_B]

It starts `softroce target` as a subprocess, connects to its RC QP through the JSON-lines
protocol, sends hand-built RoCEv2 packets from its own UDP sockets and checks the answers
byte by byte: BTH, AETH, AtomicAckETH, payload, pad, the UDP source port (rxe's
rdma_get_udp_sport) and the ICRC.

The ICRC of what we send is computable because the send socket is unconnected and has
IP_MTU_DISCOVER = IP_PMTUDISC_DO, so Linux writes IPv4 ID 0 and DF (docs/wire-facts.md
§0.2); the target's sockets do the same, so its answers are checked exactly too. ICRC
(docs/wire-facts.md §0.1, §2.2) = CRC-32 (zlib) over 8 x 0xFF | IPv4 header with TOS, TTL
and checksum as all-ones | UDP header with checksum 0xFFFF | BTH with byte 4 as 0xFF | rest
up to the pad, sent little-endian.

Every check prints one line; the first failure prints what was expected and what came,
and the script exits 1. No check sleeps: answers are awaited with receive timeouts, and
"no answer" is shown either by the next packet being the answer to a later request
(the target answers in order) or by waiting for the counter that records the drop and
then finding the socket empty.
"""

import json
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

ROCE_PORT = 4791
IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
WAIT = 3.0  # seconds to wait for an expected packet or output line

# RC opcodes (rxe_opcode.c / Wireshark names).
SEND_FIRST, SEND_MIDDLE, SEND_LAST = 0x00, 0x01, 0x02
SEND_ONLY, SEND_ONLY_WITH_IMM = 0x04, 0x05
RDMA_WRITE_ONLY = 0x0A
RDMA_READ_REQUEST = 0x0C
READ_RESPONSE_FIRST, READ_RESPONSE_MIDDLE = 0x0D, 0x0E
READ_RESPONSE_LAST, READ_RESPONSE_ONLY = 0x0F, 0x10
ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE = 0x11, 0x12
FETCH_ADD = 0x14

# AETH syndromes (docs/wire-facts.md §2.7).
ACK_UNLIMITED = 0x1F
NAK_PSN_SEQ = 0x60
NAK_REMOTE_ACCESS = 0x62

PEER_QPN = 0x0000AB


class CheckFailed(Exception):
    pass


def check(cond, name, expected=None, got=None):
    if not cond:
        msg = name
        if expected is not None or got is not None:
            msg += f"\n  expected: {expected}\n  got:      {got}"
        raise CheckFailed(msg)


def passed(name):
    print(f"ok   {name}", flush=True)


def psn_add(p, n):
    return (p + n) & 0xFFFFFF


def udp_sport(lqpn, rqpn):
    """rdma_get_udp_sport(0, lqpn, rqpn): what rxe (and softroce) send RC packets from."""
    v = lqpn * rqpn
    fl = (v ^ (v >> 20) ^ (v >> 40)) & 0xFFFFF
    return ((fl & 0x3FFF) ^ ((fl >> 14) & 0x3F)) | 0xC000


def icrc(src_ip, sport, dst_ip, dport, body, ident=0):
    """The 4 ICRC bytes of `body` (BTH .. pad) sent in IPv4 with ID `ident` and DF."""
    udp_len = 8 + len(body) + 4
    ip = struct.pack(
        ">BBHHHBBH4s4s",
        0x45, 0xFF, 20 + udp_len, ident, 0x4000, 0xFF, 17, 0xFFFF,
        socket.inet_aton(src_ip), socket.inet_aton(dst_ip),
    )
    udp = struct.pack(">HHHH", sport, dport, udp_len, 0xFFFF)
    masked_bth = body[:4] + b"\xff" + body[5:12]
    crc = zlib.crc32(b"\xff" * 8 + ip + udp + masked_bth + body[12:])
    return struct.pack("<I", crc)


def bth(opcode, psn, dest_qpn, ack_req=True, pad=0, se=False):
    return struct.pack(
        ">BBHII",
        opcode,
        (se << 7) | (pad << 4),  # MigReq 0, TVer 0
        0xFFFF,  # P_Key
        dest_qpn & 0xFFFFFF,  # byte 4 (FECN/BECN/reserved) 0
        (ack_req << 31) | (psn & 0xFFFFFF),
    )


def reth(va, rkey, length):
    return struct.pack(">QII", va, rkey, length)


def aeth(syndrome, msn):
    return struct.pack(">I", (syndrome << 24) | (msn & 0xFFFFFF))


def pad_of(payload):
    return (-len(payload)) % 4


class Packet:
    """A received answer, split by opcode."""

    def __init__(self, raw, src):
        self.raw, self.src = raw, src
        self.opcode = raw[0]
        self.pad = (raw[1] >> 4) & 3
        self.psn = struct.unpack(">I", raw[8:12])[0] & 0xFFFFFF
        self.dest_qpn = struct.unpack(">I", raw[4:8])[0] & 0xFFFFFF
        off = 12
        self.syndrome = self.msn = self.orig = None
        if self.opcode in (READ_RESPONSE_FIRST, READ_RESPONSE_LAST, READ_RESPONSE_ONLY,
                           ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE):
            a = struct.unpack(">I", raw[off:off + 4])[0]
            self.syndrome, self.msn = a >> 24, a & 0xFFFFFF
            off += 4
        if self.opcode == ATOMIC_ACKNOWLEDGE:
            self.orig = struct.unpack(">Q", raw[off:off + 8])[0]
            off += 8
        self.payload = raw[off:len(raw) - 4 - self.pad]

    def __repr__(self):
        return (f"<opcode 0x{self.opcode:02x} psn 0x{self.psn:06x} syndrome "
                f"{self.syndrome if self.syndrome is None else hex(self.syndrome)} "
                f"msn {self.msn} {len(self.raw)} bytes from {self.src}: {self.raw[:48].hex()}>")


class Peer:
    """Our end: a receive socket on PEER_IP:4791 and an ID-0/DF send socket."""

    def __init__(self, ip):
        self.ip = ip
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.bind((ip, ROCE_PORT))
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tx.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        self.tx.bind((ip, 0))
        self.sport = self.tx.getsockname()[1]

    def send(self, target_ip, body, corrupt_icrc=False):
        c = bytearray(icrc(self.ip, self.sport, target_ip, ROCE_PORT, body))
        if corrupt_icrc:
            c[3] ^= 0x01
        self.tx.sendto(body + bytes(c), (target_ip, ROCE_PORT))

    def recv(self, what, timeout=WAIT):
        self.rx.settimeout(timeout)
        try:
            raw, src = self.rx.recvfrom(65536)
        except socket.timeout:
            raise CheckFailed(f"{what}: no packet within {timeout} s")
        return Packet(raw, src)

    def expect_nothing(self, what):
        """The socket holds no packet now (call once the target is known to be done)."""
        self.rx.setblocking(False)
        try:
            raw, src = self.rx.recvfrom(65536)
        except BlockingIOError:
            return
        finally:
            self.rx.setblocking(True)
        raise CheckFailed(f"{what}: unexpected packet {Packet(raw, src)}")


class Target:
    """A `softroce target` process and its JSON lines."""

    def __init__(self, binary, ip, args):
        self.ip = ip
        self.proc = subprocess.Popen(
            [binary, "target", "--ip", ip] + args,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1,
        )
        self.lines = queue.Queue()
        self.backlog = []
        self.stderr = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.ready = self.expect("ready")

    def _read_stdout(self):
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                self.lines.put({"unparsable": line})
        self.lines.put(None)

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr.append(line)

    def next_matching(self, pred, what, timeout=WAIT):
        for i, obj in enumerate(self.backlog):
            if pred(obj):
                return self.backlog.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckFailed(f"{what}: no such line within {timeout} s; "
                                  f"unconsumed: {self.backlog}")
            try:
                obj = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if obj is None:
                raise CheckFailed(f"{what}: target exited; stderr: {''.join(self.stderr)}")
            if "unparsable" in obj:
                raise CheckFailed(f"{what}: target wrote a line that is not JSON: {obj}")
            check(len(obj) == 1, "every output line has one key", 1, obj)
            if pred(obj):
                return obj
            self.backlog.append(obj)

    def expect(self, kind, timeout=WAIT):
        return self.next_matching(lambda o: kind in o, f"line {kind!r}", timeout)[kind]

    def write_line(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def cmd(self, name, **args):
        """Sends one command; returns its reply body (raises on an error line)."""
        self.write_line(json.dumps({name: args}))
        obj = self.next_matching(lambda o: name in o or "error" in o, f"reply to {name}")
        check("error" not in obj, f"{name} succeeds", "a reply", obj)
        return obj[name]

    def error_for(self, text):
        """Sends a raw line that must give an error line; returns the error body."""
        self.write_line(text)
        return self.next_matching(lambda o: "error" in o, f"error for {text!r}")["error"]

    def counters_until(self, name, value, what):
        """Polls the counters until `name` reaches `value` (the target has processed the
        packet that moves it); returns the counters."""
        deadline = time.monotonic() + WAIT
        while True:
            c = self.cmd("counters")
            if c[name] >= value:
                check(c[name] == value, what, f"{name} = {value}", c[name])
                return c
            if time.monotonic() > deadline:
                raise CheckFailed(f"{what}: {name} stayed {c[name]}, expected {value}")
            time.sleep(0.01)  # poll interval, not an assertion

    def wait_exit(self, what):
        try:
            rc = self.proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise CheckFailed(f"{what}: target did not exit")
        check(rc == 0, what, "exit status 0", f"{rc}; stderr: {''.join(self.stderr)}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Session:
    """One connected QP pair: our hand-built requester against the target's responder."""

    def __init__(self, peer, target):
        self.peer, self.t = peer, target
        self.tqpn = target.ready["qpn"]
        self.msn = 0

    def send(self, body, **kw):
        self.peer.send(self.t.ip, body, **kw)

    def recv(self, what):
        p = self.peer.recv(what)
        check(p.src[0] == self.t.ip, f"{what}: answer from the target's address", self.t.ip, p.src)
        want_sport = udp_sport(self.tqpn, PEER_QPN)
        check(p.src[1] == want_sport, f"{what}: UDP source port is rxe's rdma_get_udp_sport",
              hex(want_sport), hex(p.src[1]))
        return p

    def expected(self, body):
        """`body` with the ICRC the target must have appended (it sends with ID 0 and DF)."""
        return body + icrc(self.t.ip, udp_sport(self.tqpn, PEER_QPN), self.peer.ip, ROCE_PORT, body)

    def sent_as(self, raw, body):
        """Whether `raw` is `body` with the ICRC the target must have appended. A packet sent
        alone carries IPv4 ID 0; segment i of a UDP GSO send carries ID i (the kernel numbers
        the segments) and its ICRC covers that ID. A UDP socket does not show the ID, so the
        ICRC of any segment position of one GSO send (at most 64 segments) is accepted."""
        if raw[:-4] != body:
            return False
        src = (self.t.ip, udp_sport(self.tqpn, PEER_QPN), self.peer.ip, ROCE_PORT)
        return any(raw[-4:] == icrc(*src, body, ident) for ident in range(64))

    def expect_exact(self, what, body):
        p = self.recv(what)
        want = self.expected(body)
        if self.sent_as(p.raw, body):
            want = p.raw
        check(p.raw == want, f"{what}: bytes", f"{want.hex()} {Packet(want, p.src)}",
              f"{p.raw.hex()} {p}")
        return p

    def expect_ack(self, what, psn, syndrome=ACK_UNLIMITED, msn=None):
        return self.expect_exact(
            what, bth(ACKNOWLEDGE, psn, PEER_QPN, ack_req=False)
            + aeth(syndrome, self.msn if msn is None else msn))

    def write_only(self, psn, va, rkey, data, ack_req=True):
        p = pad_of(data)
        return bth(RDMA_WRITE_ONLY, psn, self.tqpn, ack_req, p) + reth(va, rkey, len(data)) \
            + data + b"\0" * p

    def dump(self, index, offset, length):
        return bytes.fromhex(self.t.cmd("dump_mr", index=index, offset=offset,
                                        length=length)["hex"])


def pattern(n, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def scenario_responder(binary, peer, target_ip):
    """Target A: receives posted; WRITE, duplicates, PSN gap, READ, SEND, atomics, ICRC, rkey."""
    t = Target(binary, target_ip, [
        "--mr-size", "4096", "--mr-size", "4096", "--path-mtu", "1024",
        "--recv-depth", "4", "--psn", "0x000abc",
    ])
    try:
        r = t.ready
        check(r["gid"] == "::ffff:" + target_ip and r["psn"] == 0xABC and len(r["mrs"]) == 2
              and r["path_mtu"] == 1024, "ready line", "gid, psn 0xabc, 2 MRs, MTU 1024", r)
        mr0, mr1 = r["mrs"]
        check(mr0["length"] == 4096 and mr0["rkey"] != mr1["rkey"], "ready line MRs", "", r["mrs"])
        passed("ready line: GID, QPN, PSN, MRs (va, rkey, length)")

        p0 = 0xFFFFFA  # the READ below crosses the 24-bit PSN wrap
        c = t.cmd("connect", dest_qpn=PEER_QPN, dest_psn=p0, dest_gid="::ffff:" + peer.ip)
        check(c["state"] == "RTS" and c["recv_posted"] == 4 and c["rq_psn"] == p0,
              "connect", "RTS with 4 receives", c)
        passed("connect: RESET -> INIT -> RTR -> RTS, 4 receives posted")
        s = Session(peer, t)

        # RDMA WRITE ONLY -> ACK 0x1F, MSN 1, same PSN; the bytes land.
        d1 = pattern(37, 1)  # 37 bytes: pad count 3
        s.send(s.write_only(p0, mr0["va"] + 16, mr0["rkey"], d1))
        s.msn += 1
        s.expect_ack("WRITE ONLY -> ACK", p0)
        check(s.dump(0, 0, 64) == bytes(16) + d1 + bytes(11), "WRITE ONLY data lands",
              (bytes(16) + d1 + bytes(11)).hex(), s.dump(0, 0, 64).hex())
        passed("RDMA WRITE ONLY (37 B, pad 3) -> ACK syndrome 0x1f, MSN 1, same PSN; bytes landed")

        d2 = pattern(64, 2)
        s.send(s.write_only(psn_add(p0, 1), mr0["va"] + 128, mr0["rkey"], d2))
        s.msn += 1
        s.expect_ack("second WRITE -> ACK", psn_add(p0, 1))

        # Duplicate WRITE: re-ACKed with the last in-order PSN (p0+1, not its own p0),
        # never executed again.
        s.send(s.write_only(p0, mr0["va"] + 16, mr0["rkey"], pattern(37, 99)))
        s.expect_ack("duplicate WRITE -> re-ACK", psn_add(p0, 1))
        check(s.dump(0, 16, 37) == d1, "duplicate WRITE does not touch memory", d1.hex(),
              s.dump(0, 16, 37).hex())
        dups = t.cmd("counters")["duplicate_request"]
        check(dups == 1, "duplicate_request counter", 1, dups)
        passed("duplicate WRITE -> re-ACK with the last in-order PSN, MSN 2, memory unchanged")

        # PSN gap: one NAK 0x60 carrying the expected PSN, then silence until the gap fills.
        e = psn_add(p0, 2)
        s.send(s.write_only(psn_add(e, 1), mr0["va"] + 512, mr0["rkey"], b"gap-one!"))
        s.expect_ack("out-of-sequence WRITE -> NAK PSN sequence error", e, NAK_PSN_SEQ)
        s.send(s.write_only(psn_add(e, 2), mr0["va"] + 768, mr0["rkey"], b"gap-two!"))
        d3 = pattern(40, 3)
        s.send(s.write_only(e, mr0["va"] + 256, mr0["rkey"], d3))
        s.msn += 1
        # The next packet is the ACK of the in-order WRITE: the second gap packet got nothing.
        s.expect_ack("in-order WRITE after the gap -> ACK (and no second NAK)", e)
        c = t.cmd("counters")
        check(c["out_of_seq_request"] == 1 and c["out_of_sequence_dropped"] == 1,
              "gap counters", "out_of_seq_request 1, out_of_sequence_dropped 1", c)
        d4 = pattern(8, 4)
        s.send(s.write_only(psn_add(e, 1), mr0["va"] + 512, mr0["rkey"], d4))
        s.msn += 1
        s.expect_ack("WRITE filling the gap -> ACK", psn_add(e, 1))
        check(s.dump(0, 512, 8) == d4 and s.dump(0, 768, 8) == bytes(8),
              "NAKed and dropped packets were not executed", "", "")
        passed("PSN gap -> exactly one NAK 0x60 with the expected PSN; later packets dropped")

        # READ 2500 B at path MTU 1024 -> FIRST/MIDDLE/LAST at p, p+1, p+2 (across the wrap).
        data1 = pattern(4096, 5)
        t.cmd("write_mr", index=1, offset=0, hex=data1.hex())
        rp = psn_add(e, 2)
        check(rp == 0xFFFFFE, "READ PSN straddles the wrap", 0xFFFFFE, hex(rp))
        s.send(bth(RDMA_READ_REQUEST, rp, s.tqpn) + reth(mr1["va"] + 100, mr1["rkey"], 2500))
        s.msn += 1  # C9-148: counted when the READ is accepted
        want = data1[100:2600]
        s.expect_exact("READ RESPONSE FIRST", bth(READ_RESPONSE_FIRST, rp, PEER_QPN, False)
                       + aeth(ACK_UNLIMITED, s.msn) + want[:1024])
        s.expect_exact("READ RESPONSE MIDDLE", bth(READ_RESPONSE_MIDDLE, psn_add(rp, 1),
                       PEER_QPN, False) + want[1024:2048])
        s.expect_exact("READ RESPONSE LAST", bth(READ_RESPONSE_LAST, psn_add(rp, 2), PEER_QPN,
                       False) + aeth(ACK_UNLIMITED, s.msn) + want[2048:])
        passed("READ 2500 B at MTU 1024 -> FIRST/MIDDLE/LAST at 0xfffffe, 0xffffff, 0x000000 "
               "with AETH on FIRST/LAST and the MR's bytes")
        # A READ re-issued from inside the one above (what rxe's req_retry sends after losing
        # the MIDDLE: PSN p+1, VA + 1024, 1476 bytes). rxe finds the saved resource, and since
        # the PSN is not the resource's first it replays MIDDLE (no AETH) then LAST.
        s.send(bth(RDMA_READ_REQUEST, psn_add(rp, 1), s.tqpn)
               + reth(mr1["va"] + 100 + 1024, mr1["rkey"], 1476))
        got = [s.recv("re-issued READ: response 1"), s.recv("re-issued READ: response 2")]
        want = [bth(READ_RESPONSE_MIDDLE, psn_add(rp, 1), PEER_QPN, False) + want[1024:2048],
                bth(READ_RESPONSE_LAST, psn_add(rp, 2), PEER_QPN, False)
                + aeth(ACK_UNLIMITED, s.msn) + want[2048:]]
        # rxe_resp.c duplicate_request: a READ re-issued from inside an earlier READ is a
        # replay (res->state = replay when the PSN is not res->first_psn), answered with
        # MIDDLE/LAST; softroce does the same.
        check(len(got) == 2 and all(s.sent_as(g.raw, w) for g, w in zip(got, want)),
              "READ re-issued from PSN p+1 -> MIDDLE at p+1, LAST at p+2, as rxe replays it",
              [s.expected(w) for w in want], [g.raw for g in got])
        passed("READ re-issued from PSN p+1 -> MIDDLE at p+1, LAST at p+2, as rxe replays it")
        np = psn_add(rp, 3)
        s.send(s.write_only(np, mr0["va"] + 1024 + 64, mr0["rkey"], b"after-rd"))
        s.msn += 1
        s.expect_ack("request after the READ uses p+3", np)
        passed("the request after a 3-PSN READ uses PSN p+3")

        # READ of 5 bytes -> READ RESPONSE ONLY with pad count 3.
        np = psn_add(np, 1)
        s.send(bth(RDMA_READ_REQUEST, np, s.tqpn) + reth(mr1["va"] + 1, mr1["rkey"], 5))
        s.msn += 1
        s.expect_exact("READ RESPONSE ONLY", bth(READ_RESPONSE_ONLY, np, PEER_QPN, False, pad=3)
                       + aeth(ACK_UNLIMITED, s.msn) + data1[1:6] + bytes(3))
        passed("READ 5 B -> READ RESPONSE ONLY, pad count 3, zero pad bytes")

        # SEND ONLY WITH IMMEDIATE -> ACK and a receive completion carrying the bytes.
        np = psn_add(np, 1)
        msg = b"hello target"
        s.send(bth(SEND_ONLY_WITH_IMM, np, s.tqpn) + struct.pack(">I", 0x11223344) + msg)
        s.msn += 1
        s.expect_ack("SEND ONLY WITH IMM -> ACK", np)
        wc = t.expect("wc")
        check(wc["status"] == "IBV_WC_SUCCESS" and wc["opcode"] == "IBV_WC_RECV"
              and wc["byte_len"] == len(msg) and wc["with_imm"] and wc["imm_data"] == 0x11223344
              and wc["src_qp"] == PEER_QPN and wc["data"] == msg.hex()
              and wc["status_text"] == "success" and wc["qp_num"] == s.tqpn,
              "receive completion of SEND WITH IMM", "IBV_WC_RECV success 12 B imm 0x11223344", wc)
        check(t.cmd("query_qp")["recv_outstanding"] == 4, "receive re-posted", 4, "")
        passed("SEND ONLY WITH IMM -> ACK; wc line IBV_WC_SUCCESS/IBV_WC_RECV with imm, src_qp, "
               "data; receive re-posted")

        # A 2500-byte SEND in three packets, AckReq only on the LAST -> one ACK.
        big = pattern(2500, 6)
        ops = [(SEND_FIRST, big[:1024], False), (SEND_MIDDLE, big[1024:2048], False),
               (SEND_LAST, big[2048:], True)]
        for i, (op, part, ack_req) in enumerate(ops):
            s.send(bth(op, psn_add(np, 1 + i), s.tqpn, ack_req) + part)
        np = psn_add(np, 3)
        s.msn += 1
        s.expect_ack("SEND FIRST/MIDDLE/LAST -> one ACK for the LAST", np)
        wc = t.expect("wc")
        check(wc["status"] == "IBV_WC_SUCCESS" and wc["byte_len"] == 2500
              and wc["data"] == big.hex() and not wc["with_imm"],
              "receive completion of a 3-packet SEND", "2500 B", wc)
        passed("3-packet SEND (AckReq on LAST only) -> one ACK; one 2500 B receive completion")

        # FETCH_ADD -> ATOMIC ACKNOWLEDGE with the original value; a duplicate gets the same
        # original and the memory is changed once. The target is 8 bytes in host order.
        orig = 0x1122334455667788
        native = "<Q" if sys.byteorder == "little" else ">Q"
        t.cmd("write_mr", index=0, offset=2048, hex=struct.pack(native, orig).hex())
        np = psn_add(np, 1)
        fadd = bth(FETCH_ADD, np, s.tqpn) + struct.pack(">QIQQ", mr0["va"] + 2048, mr0["rkey"], 5, 0)
        s.send(fadd)
        s.msn += 1
        first = s.expect_exact("FETCH_ADD -> ATOMIC ACKNOWLEDGE",
                               bth(ATOMIC_ACKNOWLEDGE, np, PEER_QPN, False)
                               + aeth(ACK_UNLIMITED, s.msn) + struct.pack(">Q", orig))
        check(struct.unpack(native, s.dump(0, 2048, 8))[0] == orig + 5, "FETCH_ADD adds",
              hex(orig + 5), s.dump(0, 2048, 8).hex())
        passed("FETCH_ADD -> ATOMIC ACKNOWLEDGE with the original value; memory += 5")
        s.send(fadd)
        again = s.recv("duplicate FETCH_ADD")
        check(again.raw == first.raw, "duplicate FETCH_ADD -> the same ATOMIC ACKNOWLEDGE",
              first, again)
        check(struct.unpack(native, s.dump(0, 2048, 8))[0] == orig + 5,
              "duplicate FETCH_ADD is not executed again", hex(orig + 5), s.dump(0, 2048, 8).hex())
        np = psn_add(np, 1)
        s.send(s.write_only(np, mr0["va"] + 3000, mr0["rkey"], b"post-atomic"))
        s.msn += 1
        s.expect_ack("request after the atomic", np)
        passed("duplicate FETCH_ADD -> same original value, memory changed once")

        # Bad ICRC -> no answer, counted as icrc_errors; the PSN does not advance.
        np = psn_add(np, 1)
        before = t.cmd("counters")["icrc_errors"]
        s.send(s.write_only(np, mr0["va"] + 3100, mr0["rkey"], b"corrupt!"), corrupt_icrc=True)
        t.counters_until("icrc_errors", before + 1, "icrc_errors counts the bad packet")
        peer.expect_nothing("bad ICRC gets no answer")
        s.send(s.write_only(np, mr0["va"] + 3200, mr0["rkey"], b"correct!"))
        s.msn += 1
        s.expect_ack("the same PSN with a good ICRC is executed", np)
        check(s.dump(0, 3100, 8) == bytes(8) and s.dump(0, 3200, 8) == b"correct!",
              "bad-ICRC packet not executed", "", "")
        passed("bad ICRC -> no answer, icrc_errors + 1, not executed")

        # Wrong rkey -> NAK 0x62 at the request's PSN, QP to ERR, receives flushed.
        np = psn_add(np, 1)
        s.send(s.write_only(np, mr0["va"], mr0["rkey"] ^ 0x80, b"bad-rkey"))
        s.expect_ack("WRITE with a wrong rkey -> NAK remote access error", np, NAK_REMOTE_ACCESS)
        ev = t.expect("event")
        check(ev == {"qp_state": "ERR", "previous": "RTS"}, "QP state event", "RTS -> ERR", ev)
        flushed = [t.expect("wc") for _ in range(4)]
        check(all(w["status"] == "IBV_WC_WR_FLUSH_ERR" and w["opcode"] == "IBV_WC_RECV"
                  and w["status_text"] == "Work Request Flushed Error" for w in flushed),
              "posted receives flushed", "4 x IBV_WC_WR_FLUSH_ERR", flushed)
        check(t.cmd("query_qp")["state"] == "ERR", "query_qp says ERR", "ERR", "")
        passed("WRITE with a wrong rkey -> NAK 0x62 at its PSN; QP -> ERR (event line); "
               "4 receives flushed with IBV_WC_WR_FLUSH_ERR")
        s.send(s.write_only(psn_add(np, 1), mr0["va"], mr0["rkey"], b"after-er"))
        t.counters_until("wrong_qp_state", 1, "a request in ERR is dropped and counted")
        peer.expect_nothing("a request in ERR gets no answer")
        passed("a request to the QP in ERR -> no answer, wrong_qp_state + 1")

        t.proc.stdin.close()
        t.wait_exit("EOF on stdin ends the target")
        check(not t.backlog, "no unconsumed output", [], t.backlog)
        passed("EOF on stdin -> exit status 0")
    finally:
        t.kill()


def scenario_rnr(binary, peer, target_ip):
    """Target B: --no-recv; RNR NAK, post_recv, retried SEND; command errors; quit."""
    t = Target(binary, target_ip, ["--no-recv", "--min-rnr-timer", "5", "--recv-depth", "2"])
    try:
        q0 = 0x000100
        c = t.cmd("connect", dest_qpn=PEER_QPN, dest_psn=q0, dest_gid=peer.ip)
        check(c["state"] == "RTS" and c["recv_posted"] == 0, "connect --no-recv", "no receives", c)
        s = Session(peer, t)

        send = bth(SEND_ONLY, q0, s.tqpn) + b"ping"
        s.send(send)
        s.expect_ack("SEND without a receive -> RNR NAK", q0, 0x20 | 5)
        check(t.cmd("counters")["send_rnr_err"] == 1, "send_rnr_err counter", 1, "")
        passed("SEND with no receive -> RNR NAK 0x25 (timer code 5) at its PSN, MSN 0")

        pr = t.cmd("post_recv", count=1)
        check(pr["posted"] == 1 and pr["outstanding"] == 1, "post_recv", "1 posted", pr)
        s.send(send)  # the requester's retry after the RNR wait: same PSN, same bytes
        s.msn += 1
        s.expect_ack("retried SEND -> ACK", q0)
        wc = t.expect("wc")
        check(wc["status"] == "IBV_WC_SUCCESS" and wc["opcode"] == "IBV_WC_RECV"
              and wc["byte_len"] == 4 and wc["data"] == b"ping".hex()
              and wc["wr_id"] == pr["wr_ids"][0] and wc["src_qp"] == PEER_QPN,
              "receive completion", "IBV_WC_RECV 4 B 'ping'", wc)
        passed("post_recv, then the retried SEND -> ACK MSN 1 and a receive completion line")

        s.send(bth(SEND_ONLY, psn_add(q0, 1), s.tqpn) + b"pong")
        s.expect_ack("--no-recv does not re-post", psn_add(q0, 1), 0x20 | 5)
        passed("--no-recv: the receive is not re-posted (next SEND -> RNR NAK)")

        errors = [
            ("not json", None),
            ('{"dump_mr": {"index": 7}}', "dump_mr"),
            ('{"dump_mr": {"index": 0, "offset": 4000, "length": 200}}', "dump_mr"),
            ('{"write_mr": {"index": 0, "hex": "abc"}}', "write_mr"),
            ('{"connect": {"dest_qpn": 1}}', "connect"),
            ('{"connect": {"dest_qpn": 1, "dest_gid": "nonsense"}}', "connect"),
            ('{"post_recv": {"count": 3}}', "post_recv"),
            ('{"post_recv": {"cuont": 1}}', "post_recv"),
            ('{"bogus": {}}', "bogus"),
            ('[1, 2]', None),
        ]
        for line, command in errors:
            err = t.error_for(line)
            check(err["command"] == command and err["message"], f"error line for {line}",
                  command, err)
        check(t.cmd("query_qp")["state"] == "RTS", "still serving after errors", "RTS", "")
        passed(f"{len(errors)} bad command lines -> one error line each; target carries on")

        check(t.cmd("quit") == {"ok": True}, "quit reply", {"ok": True}, "")
        t.wait_exit("quit ends the target")
        passed("quit -> reply, exit status 0")
    finally:
        t.kill()


def main():
    if len(sys.argv) not in (2, 5):
        sys.exit(__doc__)
    binary = sys.argv[1]
    peer_ip, ip_a, ip_b = sys.argv[2:5] if len(sys.argv) == 5 else \
        ("127.0.42.2", "127.0.42.1", "127.0.42.3")
    start = time.monotonic()
    peer = Peer(peer_ip)
    try:
        scenario_responder(binary, peer, ip_a)
        scenario_rnr(binary, peer, ip_b)
        peer.expect_nothing("no stray packets at the end")
    except CheckFailed as e:
        print(f"FAIL {e}", flush=True)
        sys.exit(1)
    print(f"all checks passed in {time.monotonic() - start:.2f} s")


if __name__ == "__main__":
    main()
