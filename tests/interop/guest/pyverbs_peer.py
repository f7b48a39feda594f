#!/usr/bin/env python3
"""pyverbs_peer.py — the kernel-rxe side of softroce's RDMA WRITE scenarios and negative cases,
through rdma-core's Python binding (python3-pyverbs).  Runs INSIDE the rxe guest.

It speaks the out-of-band TCP exchange of softroce's examples/rdma_write_{server,client}.rs:
  1. both sides send, then read, a 24-byte endpoint: QPN u32, first PSN u32, GID 16 bytes
     (big-endian); each then takes its RC QP INIT -> RTR -> RTS towards the other;
  2. the server sends a 16-byte buffer description: addr u64, rkey u32, len u32 (big-endian);
  3. the client RDMA-WRITEs its message there, polls the completion, and sends one byte 'D';
     the server then looks at its buffer.

usage:
  pyverbs_peer.py server [--port P] [--bad-rkey] [--expect TEXT]
      rxe is the responder.  With --bad-rkey the rkey handed out is wrong, so the client's WRITE
      must be refused (NAK remote access error) and the buffer must stay all zero; otherwise
      the buffer must start with TEXT.  Exit 0 when that holds.
  pyverbs_peer.py client HOST [--port P] [--bad-rkey]
      rxe is the requester: WRITEs MESSAGE to the host.  With --bad-rkey it flips the rkey's key
      byte and expects IBV_WC_REM_ACCESS_ERR; otherwise IBV_WC_SUCCESS.  Exit 0 when it got it.
  pyverbs_peer.py neg requester|responder --op read-oob|send --ex PREFIX [--rnr-retry N]
                 [--min-rnr-timer CODE] [--expect STATUS] [--no-recv]
      the rxe side of a negative case against `softroce target`.  The endpoints go through files
      (the host's test drives the target): this side writes PREFIX.rxe (JSON: qpn, psn, gid, and
      the MR's va, rkey, len), waits for PREFIX.host (the target's qpn, psn, gid and its MR 0),
      connects, and writes PREFIX.rxe-ready.
      requester: read-oob READs 64 B from 32 B before the end of the peer's MR; send SENDs
        MESSAGE; either way it polls the completion and exits 0 when its status is STATUS.
      responder: read-oob waits for PREFIX.done; send posts no receive until its rxe counter
        send_rnr_err has grown (it has RNR NAKed the SEND), then posts one and checks that
        MESSAGE lands; with --no-recv it never posts one and waits for PREFIX.done.
  pyverbs_peer.py fields requester|responder --ex PREFIX [--tclass TC]
      the rxe side of the WC-fields scenario against `softroce target`, endpoints exchanged as
      for neg (PREFIX.rxe also gives write_off, where the requester's WRITEs go), both QPs
      with traffic class TC.  requester: SEND_WITH_IMM 3000 B, SEND 5 B, RDMA WRITE 100 B to
      the peer's MR 0 at 0 and RDMA_WRITE_WITH_IMM 2500 B at 1024, then one "wc ..." line per
      completion; responder: three receives, one "wc ..." line each with the data checked,
      then (after PREFIX.done) the two WRITE regions checked.  Exit 0 when every completion
      succeeded and all data arrived.
  pyverbs_peer.py pcap-summary FILE
      one line per RoCEv2 packet in a pcap: source, destination, opcode, PSN, IP ID, IP TOS,
      TTL, UDP checksum, capture time (seconds), AETH syndrome.
Device and GID index come from $DEV and $GIDX (set by the guest agent).
"""
import argparse
import os
import random
import socket
import struct
import sys
import time

MESSAGE = b'Hello RDMA from rxe! Data lands directly in softroce memory.\0'
BUF_LEN = 4096


def wc_status_name(e, status):
    names = {getattr(e, n): n for n in dir(e) if n.startswith('IBV_WC_') and n.endswith('_ERR')}
    names[e.IBV_WC_SUCCESS] = 'IBV_WC_SUCCESS'
    return names.get(status, str(status))


class Rc:
    """One RC QP on rxe with a CQ and a registered buffer."""

    def __init__(self, access, buf_len=BUF_LEN):
        import pyverbs.enums as e
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
        self.e = e
        self.ctx = Context(name=os.environ.get('DEV', 'rxe0'))
        self.gidx = int(os.environ.get('GIDX', '1'))
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 16, None, None, 0)
        self.mr = MR(self.pd, buf_len, access)
        cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap)
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = access
        self.qp = QP(self.pd, init, attr)
        self.psn = random.getrandbits(24)
        self.gid = self.ctx.query_gid(1, self.gidx)

    def endpoint(self):
        gid = bytes.fromhex(str(self.gid.gid).replace(':', ''))
        return struct.pack('>II', self.qp.qp_num, self.psn) + gid

    def connect(self, peer, rnr_retry=7, min_rnr_timer=12, traffic_class=0):
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr
        e = self.e
        qpn, psn = struct.unpack('>II', peer[:8])
        h = peer[8:24].hex()
        dgid = GID(':'.join(h[i:i + 4] for i in range(0, 32, 4)))
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                                | e.IBV_ACCESS_REMOTE_READ)
        attr.path_mtu = e.IBV_MTU_1024
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = min_rnr_timer
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = rnr_retry
        attr.ah_attr = AHAttr(port_num=1, is_global=1,
                              gr=GlobalRoute(dgid=dgid, sgid_index=self.gidx, hop_limit=64,
                                             traffic_class=traffic_class))
        attr.dest_qp_num = qpn
        attr.sq_psn = self.psn
        attr.rq_psn = psn
        self.qp.to_rts(attr)
        print(f'pyverbs: rxe QPN 0x{self.qp.qp_num:06x} PSN 0x{self.psn:06x} connected to '
              f'QPN 0x{qpn:06x} PSN 0x{psn:06x} GID {dgid.gid} (rnr_retry {rnr_retry}, '
              f'min_rnr_timer {min_rnr_timer})', flush=True)

    def poll(self, timeout=20.0):
        t0 = time.time()
        while time.time() - t0 < timeout:
            n, wcs = self.cq.poll(1)
            if n:
                return wcs[0]
            time.sleep(0.001)
        raise SystemExit(f'pyverbs: no completion within {timeout} s')


def read_exact(s, n):
    b = b''
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise SystemExit(f'pyverbs: peer closed the TCP connection after {len(b)}/{n} bytes')
        b += chunk
    return b


def server(a):
    import pyverbs.enums as e
    rc = Rc(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(('0.0.0.0', a.port))
    lst.listen(1)
    print(f'pyverbs: server listening on TCP {a.port}', flush=True)
    conn, peer_addr = lst.accept()
    conn.sendall(rc.endpoint())
    rc.connect(read_exact(conn, 24))
    rkey = rc.mr.rkey ^ 0xff if a.bad_rkey else rc.mr.rkey
    conn.sendall(struct.pack('>QII', rc.mr.buf, rkey, BUF_LEN))
    print(f'pyverbs: buffer addr 0x{rc.mr.buf:x} rkey handed out 0x{rkey:x} '
          f'(MR rkey 0x{rc.mr.rkey:x}{", deliberately wrong" if a.bad_rkey else ""})', flush=True)
    read_exact(conn, 1)
    got = rc.mr.read(BUF_LEN, 0)
    if a.bad_rkey:
        ok = got == bytes(BUF_LEN)
        print(f'buffer: {"untouched (all zero)" if ok else "MODIFIED: " + repr(got[:80])}')
    else:
        want = a.expect.encode()
        ok = got.startswith(want)
        print(f'buffer: {got[:len(want)]!r} ({"as expected" if ok else "expected " + repr(want)})')
    return 0 if ok else 1


def client(a):
    import pyverbs.enums as e
    from pyverbs.wr import SGE, SendWR
    rc = Rc(e.IBV_ACCESS_LOCAL_WRITE)
    conn = socket.create_connection((a.host, a.port), timeout=30)
    conn.sendall(rc.endpoint())
    rc.connect(read_exact(conn, 24))
    addr, rkey, length = struct.unpack('>QII', read_exact(conn, 16))
    if length < len(MESSAGE):
        raise SystemExit('pyverbs: remote buffer too small')
    if a.bad_rkey:
        rkey ^= 0xff
    rc.mr.write(MESSAGE, len(MESSAGE))
    wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, send_flags=e.IBV_SEND_SIGNALED, num_sge=1,
                sg=[SGE(rc.mr.buf, len(MESSAGE), rc.mr.lkey)])
    wr.set_wr_rdma(rkey=rkey, addr=addr)
    rc.qp.post_send(wr)
    wc = rc.poll()
    conn.sendall(b'D')
    want = e.IBV_WC_REM_ACCESS_ERR if a.bad_rkey else e.IBV_WC_SUCCESS
    print(f'WC status={wc_status_name(e, wc.status)} opcode={wc.opcode} '
          f'(RDMA WRITE of {len(MESSAGE)} B to 0x{addr:x} rkey 0x{rkey:x}; '
          f'expected {wc_status_name(e, want)})')
    return 0 if wc.status == want else 1


def counter(name):
    dev = os.environ.get('DEV', 'rxe0')
    with open(f'/sys/class/infiniband/{dev}/ports/1/hw_counters/{name}') as f:
        return int(f.read())


def put_file(path, text):
    with open(path + '.tmp', 'w') as f:
        f.write(text)
    os.rename(path + '.tmp', path)


def wait_file(path, timeout=60.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            with open(path) as f:
                return f.read()
        except FileNotFoundError:
            time.sleep(0.02)
    raise SystemExit(f'pyverbs: {path} did not appear within {timeout} s')


QP_STATES = ['RESET', 'INIT', 'RTR', 'RTS', 'SQD', 'SQE', 'ERR']


def report_qp_state(rc):
    attr, _ = rc.qp.query(rc.e.IBV_QP_STATE)
    s = attr.qp_state
    print(f'rxe QP state: {QP_STATES[s] if 0 <= s < len(QP_STATES) else s}', flush=True)


def neg(a):
    """One side of a negative case; the other side is `softroce target`, driven by the host."""
    import json
    import pyverbs.enums as e
    from pyverbs.wr import SGE, RecvWR, SendWR
    rc = Rc(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
    gid = str(rc.gid.gid)
    put_file(a.ex + '.rxe', json.dumps({'qpn': rc.qp.qp_num, 'psn': rc.psn, 'gid': gid,
                                        'va': rc.mr.buf, 'rkey': rc.mr.rkey, 'len': BUF_LEN}))
    host = json.loads(wait_file(a.ex + '.host'))
    peer = struct.pack('>II', host['qpn'], host['psn']) + bytes.fromhex(
        ''.join(f'{int(g, 16):04x}' for g in expand_gid(host['gid'])))
    rc.connect(peer, rnr_retry=a.rnr_retry, min_rnr_timer=a.min_rnr_timer)
    rnr_before = counter('send_rnr_err')
    put_file(a.ex + '.rxe-ready', 'ready\n')
    if a.side == 'requester':
        want = getattr(e, a.expect)
        if a.op == 'read-oob':
            addr = host['va'] + host['len'] - 32
            wr = SendWR(wr_id=2, opcode=e.IBV_WR_RDMA_READ, send_flags=e.IBV_SEND_SIGNALED,
                        num_sge=1, sg=[SGE(rc.mr.buf, 64, rc.mr.lkey)])
            wr.set_wr_rdma(rkey=host['rkey'], addr=addr)
            what = (f'RDMA READ of 64 B at 0x{addr:x} rkey 0x{host["rkey"]:x}, the last 32 B '
                    f'of a {host["len"]}-byte MR and 32 B past its end')
        else:
            rc.mr.write(MESSAGE, len(MESSAGE))
            wr = SendWR(wr_id=3, opcode=e.IBV_WR_SEND, send_flags=e.IBV_SEND_SIGNALED,
                        num_sge=1, sg=[SGE(rc.mr.buf, len(MESSAGE), rc.mr.lkey)])
            what = f'SEND of {len(MESSAGE)} B'
        rc.qp.post_send(wr)
        wc = rc.poll(timeout=40.0)
        print(f'WC status={wc_status_name(e, wc.status)} opcode={wc.opcode} ({what}; '
              f'expected {a.expect})')
        print(f'rxe counters: rcvd_rnr_err={counter("rcvd_rnr_err")} '
              f'retry_rnr_exceeded_err={counter("retry_rnr_exceeded_err")}')
        report_qp_state(rc)
        return 0 if wc.status == want else 1
    # responder
    if a.op == 'send' and not a.no_recv:
        t0 = time.time()
        while counter('send_rnr_err') == rnr_before:
            if time.time() - t0 > 40:
                raise SystemExit('pyverbs: no RNR NAK sent within 40 s')
            time.sleep(0.005)
        print(f'rxe RNR NAKed the SEND (send_rnr_err {rnr_before} -> '
              f'{counter("send_rnr_err")}); posting a receive', flush=True)
        rc.qp.post_recv(RecvWR(wr_id=9, num_sge=1, sg=[SGE(rc.mr.buf, BUF_LEN, rc.mr.lkey)]))
        wc = rc.poll(timeout=40.0)
        got = rc.mr.read(wc.byte_len, 0) if wc.status == e.IBV_WC_SUCCESS else b''
        print(f'WC status={wc_status_name(e, wc.status)} opcode={wc.opcode} '
              f'byte_len={wc.byte_len} data={got!r}')
        ok = wc.status == e.IBV_WC_SUCCESS and got == a.message.encode()
        print(f'received {"the expected message" if ok else "NOT " + repr(a.message)}')
        wait_file(a.ex + '.done')
        print(f'rxe counters: send_rnr_err={counter("send_rnr_err") - rnr_before} (this run)')
        report_qp_state(rc)
        return 0 if ok else 1
    wait_file(a.ex + '.done')
    print(f'rxe counters: send_rnr_err={counter("send_rnr_err") - rnr_before} (this run)')
    report_qp_state(rc)
    return 0


# The WC-fields scenario: what each side sends (opcode name, length, wire immediate, remote
# offset); the bytes are PATTERN[:length] at both ends.
FIELDS_WRS = [('send_imm', 3000, 0x5EED1234, None), ('send', 5, None, None),
              ('write', 100, None, 0), ('write_imm', 2500, 0xC0FFEE01, 1024)]
PATTERN = bytes((i * 7 + 3) & 0xff for i in range(4096))
FIELDS_BUF = 16384
FIELDS_WRITE_OFF = 12288


def wc_opcode_name(e, op):
    names = {getattr(e, n): n for n in ('IBV_WC_SEND', 'IBV_WC_RDMA_WRITE', 'IBV_WC_RDMA_READ',
                                        'IBV_WC_RECV', 'IBV_WC_RECV_RDMA_WITH_IMM')}
    return names.get(op, str(op))


def print_wc(e, wc, extra=''):
    imm = socket.ntohl(wc.imm_data)
    print(f'wc wr_id={wc.wr_id} status={wc_status_name(e, wc.status)} '
          f'opcode={wc_opcode_name(e, wc.opcode)} byte_len={wc.byte_len} '
          f'wc_flags=0x{wc.wc_flags:x} grh={int(bool(wc.wc_flags & e.IBV_WC_GRH))} '
          f'with_imm={int(bool(wc.wc_flags & e.IBV_WC_WITH_IMM))} imm_data=0x{imm:08x}{extra}',
          flush=True)


def fields(a):
    """The rxe side of the WC-fields scenario (see the usage above)."""
    import json
    import pyverbs.enums as e
    from pyverbs.wr import SGE, RecvWR, SendWR
    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
    rc = Rc(access, FIELDS_BUF)
    rc.mr.write(PATTERN, len(PATTERN))
    put_file(a.ex + '.rxe', json.dumps({'qpn': rc.qp.qp_num, 'psn': rc.psn,
                                        'gid': str(rc.gid.gid), 'va': rc.mr.buf,
                                        'rkey': rc.mr.rkey, 'len': FIELDS_BUF,
                                        'write_off': FIELDS_WRITE_OFF}))
    host = json.loads(wait_file(a.ex + '.host'))
    peer = struct.pack('>II', host['qpn'], host['psn']) + bytes.fromhex(
        ''.join(f'{int(g, 16):04x}' for g in expand_gid(host['gid'])))
    ok = True
    if a.side == 'responder':
        for i in range(3):  # SEND_WITH_IMM, SEND, WRITE_WITH_IMM each take one
            rc.qp.post_recv(RecvWR(wr_id=100 + i, num_sge=1,
                                   sg=[SGE(rc.mr.buf + 4096 * i, 4096, rc.mr.lkey)]))
    rc.connect(peer, traffic_class=a.tclass)
    put_file(a.ex + '.rxe-ready', 'ready\n')
    if a.side == 'requester':
        for i, (op, length, imm, off) in enumerate(FIELDS_WRS):
            opcode = {'send': e.IBV_WR_SEND, 'send_imm': e.IBV_WR_SEND_WITH_IMM,
                      'write': e.IBV_WR_RDMA_WRITE,
                      'write_imm': e.IBV_WR_RDMA_WRITE_WITH_IMM}[op]
            wr = SendWR(wr_id=1 + i, opcode=opcode, send_flags=e.IBV_SEND_SIGNALED, num_sge=1,
                        sg=[SGE(rc.mr.buf, length, rc.mr.lkey)])
            if imm is not None:
                wr.imm_data = socket.htonl(imm)
            if off is not None:
                wr.set_wr_rdma(rkey=host['rkey'], addr=host['va'] + off)
            rc.qp.post_send(wr)
        for _ in FIELDS_WRS:
            wc = rc.poll(timeout=40.0)
            ok &= wc.status == e.IBV_WC_SUCCESS
            print_wc(e, wc)
        wait_file(a.ex + '.done')
        return 0 if ok else 1
    for _ in range(3):
        wc = rc.poll(timeout=40.0)
        i = wc.wr_id - 100
        got = rc.mr.read(wc.byte_len, 4096 * i) if wc.opcode == e.IBV_WC_RECV else b''
        good = wc.status == e.IBV_WC_SUCCESS and (wc.opcode != e.IBV_WC_RECV
                                                  or got == PATTERN[:wc.byte_len])
        ok &= good
        print_wc(e, wc, f' data={"ok" if good else "BAD"}')
    wait_file(a.ex + '.done')
    for op, length, _, off in FIELDS_WRS:
        if off is None:
            continue
        got = rc.mr.read(length, FIELDS_WRITE_OFF + off)
        good = got == PATTERN[:length]
        ok &= good
        print(f'{op} region: {length} B at +{off} {"as sent" if good else "DIFFERS"}')
    return 0 if ok else 1


def expand_gid(text):
    """The eight 16-bit groups of an IPv6 address text (a '::' expanded)."""
    if '.' in text:  # ::ffff:a.b.c.d
        head, v4 = text.rsplit(':', 1)
        o = [int(x) for x in v4.split('.')]
        text = f'{head}:{o[0] << 8 | o[1]:x}:{o[2] << 8 | o[3]:x}'
    if '::' in text:
        left, right = text.split('::')
        lg = [g for g in left.split(':') if g]
        rg = [g for g in right.split(':') if g]
        return lg + ['0'] * (8 - len(lg) - len(rg)) + rg
    return text.split(':')


def pcap_summary(a):
    """RoCEv2 packets (UDP port 4791) of an Ethernet/IPv4 pcap, one line each."""
    data = open(a.file, 'rb').read()
    magic = struct.unpack('<I', data[:4])[0]
    endian = '<' if magic in (0xa1b2c3d4, 0xa1b23c4d) else '>'
    off = 24
    while off + 16 <= len(data):
        sec, usec, incl, _ = struct.unpack(endian + 'IIII', data[off:off + 16])
        pkt = data[off + 16:off + 16 + incl]
        off += 16 + incl
        if len(pkt) < 14 + 20 + 8 + 12 or pkt[12:14] != b'\x08\x00':
            continue
        ihl = (pkt[14] & 0x0f) * 4
        ip = pkt[14:14 + ihl]
        if ip[9] != 17:
            continue
        udp = pkt[14 + ihl:14 + ihl + 8]
        if struct.unpack('>H', udp[2:4])[0] != 4791:
            continue
        bth = pkt[14 + ihl + 8:]
        opcode = bth[0]
        psn = struct.unpack('>I', bth[8:12])[0] & 0xffffff
        ident = struct.unpack('>H', ip[4:6])[0]
        csum = struct.unpack('>H', udp[6:8])[0]
        line = (f'{socket.inet_ntoa(ip[12:16])} > {socket.inet_ntoa(ip[16:20])} '
                f'opcode=0x{opcode:02x} psn=0x{psn:06x} ipid=0x{ident:04x} tos=0x{ip[1]:02x} '
                f'ttl={ip[8]} udpcsum=0x{csum:04x} t={sec}.{usec:06d}')
        if opcode in (0x0d, 0x0f, 0x10, 0x11, 0x12) and len(bth) >= 16:  # carries an AETH
            line += f' syndrome=0x{bth[12]:02x}'
        print(line)
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest='cmd', required=True)
    s = sub.add_parser('server')
    s.add_argument('--port', type=int, default=18515)
    s.add_argument('--bad-rkey', action='store_true')
    s.add_argument('--expect', default='')
    c = sub.add_parser('client')
    c.add_argument('host')
    c.add_argument('--port', type=int, default=18515)
    c.add_argument('--bad-rkey', action='store_true')
    n = sub.add_parser('neg')
    n.add_argument('side', choices=['requester', 'responder'])
    n.add_argument('--op', choices=['read-oob', 'send'], required=True)
    n.add_argument('--ex', required=True)
    n.add_argument('--rnr-retry', type=int, default=7)
    n.add_argument('--min-rnr-timer', type=int, default=12)
    n.add_argument('--expect', default='IBV_WC_SUCCESS')
    n.add_argument('--no-recv', action='store_true')
    n.add_argument('--message', default='')
    f = sub.add_parser('fields')
    f.add_argument('side', choices=['requester', 'responder'])
    f.add_argument('--ex', required=True)
    f.add_argument('--tclass', type=lambda x: int(x, 0), default=0)
    ps = sub.add_parser('pcap-summary')
    ps.add_argument('file')
    a = p.parse_args()
    return {'server': server, 'client': client, 'neg': neg,
            'fields': fields, 'pcap-summary': pcap_summary}[a.cmd](a)


if __name__ == '__main__':
    sys.exit(main())
