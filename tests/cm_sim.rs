//! Deterministic simulation of the CM engine: connect/disconnect storms between three
//! engines over a seeded link that loses, duplicates, delays and reorders MADs.
//!
//! Two ways to carry the MADs, with the same application and the same checks:
//! - engines and an in-test link: the CM engine is sans-IO, so its protocol can be tested
//!   alone, with every single MAD subject to a fault and virtual time jumping straight to the
//!   next delivery, timer or application action;
//! - `World::on_devices`: each engine behind `verbs::CmPort` on QP1 of a `net::sim` device,
//!   the code librdmacm.so.1 runs: MADs are UD SENDs with the GSI Q_Key, received behind a
//!   GRH through the port's receive ring and the MAD agent, over the simulated link with the
//!   same loss, duplication and reordering (and bit flips the ICRC catches). The ports are
//!   driven by the CM driver loop the Rust API's `CmDriver` and librdmacm.so.1 run
//!   (`net::cm_loop::run`, through `OnDevices`), on the simulation's clock: its wait steps
//!   the simulated network up to the next datagram, device timer, CM timer or application
//!   action (at most `CM_TICK` of virtual time), and its turn is `CmPort::process` for every
//!   port, then the application.
//!
//! The seed chooses every parameter (swarm testing): loss, duplication, reordering, delay,
//! retries, how many connections, how slowly the application accepts, how often it rejects,
//! and which side disconnects. Checked for every seed:
//! - every connection, on both sides, ends with exactly one final event: TIMEWAIT_EXIT (after
//!   DISCONNECTED), REJECTED or UNREACHABLE, the events librdmacm reports; none hangs;
//! - no event for a connection after its final one, ESTABLISHED and DISCONNECTED at most once;
//! - a REQ to a service nobody listens on ends REJECTED with reason 8 (or UNREACHABLE when
//!   loss ate every REQ or REJ);
//! - on a loss-free link every accepted connection is ESTABLISHED on both sides;
//! - at the end no engine holds a connection or a timer (no leak after DREQ/TIMEWAIT), and
//!   each engine's `mads_received` equals the MADs delivered to it.
//!
//! A failure prints `SOFTROCE_SEED=<n>`; set it to replay that seed. `SOFTROCE_SIM_SEEDS=<n>`
//! runs more seeds (soak).

use softroce::cm::{
    AcceptParams, CmConfig, CmEngine, CmEvent, CmState, CommId, ConnectParams, MadTransmit,
};
use softroce::net::cm_loop::{self, CmLoop, LoopEnd};
use softroce::net::sim::{Sim, SimFaults, SimRng};
use softroce::transport::Instant;
use softroce::verbs::{CmPort, Device};
use softroce::wire::cm::{RejReason, port_space, rdma_cm_service_id};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

const NODES: usize = 3;
const LISTENED_PORT: u16 = 7174;
const UNLISTENED_PORT: u16 = 9;

fn ip(n: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, n as u8 + 1))
}
fn node_of(ip: IpAddr) -> usize {
    match ip {
        IpAddr::V4(v4) => usize::from(v4.octets()[3]) - 1,
        IpAddr::V6(_) => unreachable!(),
    }
}

#[derive(Debug, Clone, Copy)]
struct Params {
    loss: f64,
    dup: f64,
    reorder: f64,
    delay_ns: u64,
    jitter_ns: u64,
    max_cm_retries: u8,
    connections: usize,
    accept_delay_max_ns: u64,
    reject_p: f64,
    unlistened_p: f64,
    hold_max_ns: u64,
}

impl Params {
    fn from_seed(rng: &mut SimRng) -> Params {
        let pick = |rng: &mut SimRng, v: &[f64]| v[rng.below(v.len() as u64) as usize];
        Params {
            loss: pick(rng, &[0.0, 0.02, 0.1, 0.25]),
            dup: pick(rng, &[0.0, 0.05, 0.2]),
            reorder: pick(rng, &[0.0, 0.1, 0.3]),
            delay_ns: 5_000 + rng.below(500_000),
            jitter_ns: rng.below(2_000_000),
            max_cm_retries: 3 + rng.below(13) as u8,
            connections: 10 + rng.below(50) as usize,
            // Up to several response timeouts: slow accepts meet duplicate REQs (MRA).
            accept_delay_max_ns: rng.below(60_000_000),
            reject_p: pick(rng, &[0.0, 0.1]),
            unlistened_p: pick(rng, &[0.0, 0.1]),
            hold_max_ns: rng.below(50_000_000),
        }
    }
}

/// What the application does at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    Connect {
        node: usize,
        peer: usize,
        listened: bool,
    },
    Answer {
        node: usize,
        id: CommId,
    },
    Establish {
        node: usize,
        id: CommId,
    },
    Disconnect {
        node: usize,
        id: CommId,
    },
}

/// Per connection: the events seen, in order.
#[derive(Debug, Default)]
struct Track {
    events: Vec<&'static str>,
    listened: Option<bool>,
    rejected_by_app: bool,
}

/// A MAD on the link: (deliver at, sequence, src node, dst node, bytes).
type InFlight = (Instant, u64, usize, usize, Box<[u8; 256]>);

struct World {
    seed: u64,
    p: Params,
    rng: SimRng,
    now: Instant,
    /// The CM engines, driven directly (the in-test link) ...
    engines: Vec<CmEngine>,
    /// ... or each on QP1 of a `net::sim` device, through `verbs::CmPort` (what
    /// librdmacm.so.1 runs), over the simulated link.
    ports: Option<Ports>,
    /// (deliver at, sequence) -> (src node, MAD)
    link: BinaryHeap<Reverse<InFlight>>,
    actions: BinaryHeap<Reverse<(Instant, u64, Action)>>,
    seq: u64,
    delivered: Vec<u64>,
    tracks: BTreeMap<(usize, CommId), Track>,
    next_qpn: u32,
}

/// Devices on a `net::sim` link, each with its CM on QP1.
struct Ports {
    sim: Sim,
    ports: Vec<CmPort>,
    _devs: Vec<Device>,
}

impl World {
    /// The world of `seed` with every CM engine on QP1 of a simulated device: the same MADs
    /// go through UD SENDs, the GRH, the receive ring and the MAD agent, with the link's
    /// loss, duplication, reordering and bit flips (caught by the ICRC) drawn from the
    /// same parameters.
    fn on_devices(seed: u64) -> World {
        World::on_devices_with(seed, |_| {})
    }

    /// `on_devices` with the seed's parameters changed by `tweak` first.
    fn on_devices_with(seed: u64, tweak: impl FnOnce(&mut Params)) -> World {
        let mut w = World::new(seed);
        tweak(&mut w.p);
        let faults = SimFaults {
            loss: w.p.loss,
            dup: w.p.dup,
            reorder: w.p.reorder,
            corrupt: if w.p.loss > 0.0 { 0.01 } else { 0.0 },
            delay_ns: w.p.delay_ns,
            jitter_ns: w.p.jitter_ns,
        };
        let mut sim = Sim::new(seed, faults);
        let mut ports = Vec::new();
        let mut devs = Vec::new();
        for (n, cm) in std::mem::take(&mut w.engines).into_iter().enumerate() {
            let dev = sim.add_device(&format!("cm{n}"), ip(n));
            ports.push(CmPort::new(&dev, cm).unwrap());
            devs.push(dev);
        }
        w.ports = Some(Ports {
            sim,
            ports,
            _devs: devs,
        });
        w
    }

    fn eng(&mut self, n: usize) -> &mut CmEngine {
        match &mut self.ports {
            Some(p) => p.ports[n].cm(),
            None => &mut self.engines[n],
        }
    }

    fn eng_ref(&self, n: usize) -> &CmEngine {
        match &self.ports {
            Some(p) => &p.ports[n].agent().cm,
            None => &self.engines[n],
        }
    }

    fn new(seed: u64) -> World {
        let mut rng = SimRng::new(seed);
        let p = Params::from_seed(&mut rng);
        let engines = (0..NODES)
            .map(|n| {
                let mut c = CmConfig::new(ip(n), 0x1000 + n as u64, seed * 31 + n as u64);
                c.cm_response_timeout = 12; // 16.8 ms
                c.packet_life_time = 10; // 4.2 ms; TIMEWAIT 8.4 ms
                c.max_cm_retries = p.max_cm_retries;
                c.mra_service_timeout = 14;
                let mut e = CmEngine::new(c);
                e.listen(rdma_cm_service_id(port_space::TCP, LISTENED_PORT))
                    .unwrap();
                e
            })
            .collect();
        World {
            seed,
            p,
            rng,
            now: Instant::ZERO,
            engines,
            ports: None,
            link: BinaryHeap::new(),
            actions: BinaryHeap::new(),
            seq: 0,
            delivered: vec![0; NODES],
            tracks: BTreeMap::new(),
            next_qpn: 0x100,
        }
    }

    fn at(&mut self, delay_ns: u64, a: Action) {
        self.seq += 1;
        let t = self.now + Duration::from_nanos(delay_ns);
        self.actions.push(Reverse((t, self.seq, a)));
    }

    fn send(&mut self, src: usize, m: MadTransmit) {
        let dst = node_of(m.dst);
        if self.rng.chance(self.p.loss) {
            return;
        }
        let copies = if self.rng.chance(self.p.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let mut d = self.p.delay_ns + self.rng.below(self.p.jitter_ns + 1);
            if self.rng.chance(self.p.reorder) {
                d += self.rng.below(20_000_000);
            }
            self.seq += 1;
            let t = self.now + Duration::from_nanos(d);
            self.link
                .push(Reverse((t, self.seq, src, dst, m.mad.clone())));
        }
    }

    fn event(&mut self, node: usize, ev: CmEvent) {
        let id = ev.id();
        let name = match &ev {
            CmEvent::ConnectRequest { .. } => "ConnectRequest",
            CmEvent::ConnectResponse { .. } => "ConnectResponse",
            CmEvent::Established { .. } => "Established",
            CmEvent::Rejected { reason, .. } if *reason == RejReason::INVALID_SERVICE_ID => {
                "Rejected(8)"
            }
            CmEvent::Rejected { .. } => "Rejected",
            CmEvent::Unreachable { .. } => "Unreachable",
            CmEvent::Disconnected { .. } => "Disconnected",
            CmEvent::TimewaitExit { .. } => "TimewaitExit",
            CmEvent::SidrRequest { .. } | CmEvent::SidrResponse { .. } => "Sidr",
        };
        self.tracks.entry((node, id)).or_default().events.push(name);
        match ev {
            CmEvent::ConnectRequest { id, .. } => {
                let d = self.rng.below(self.p.accept_delay_max_ns + 1);
                self.at(d, Action::Answer { node, id });
            }
            CmEvent::ConnectResponse { id, .. } => {
                let d = self.rng.below(1_000_000);
                self.at(d, Action::Establish { node, id });
            }
            CmEvent::Established { id } => {
                // Both sides plan to disconnect; whichever comes first sends the DREQ (when
                // both do, the DREQs cross).
                let d = self.rng.below(self.p.hold_max_ns + 1);
                self.at(d, Action::Disconnect { node, id });
            }
            // rdma_disconnect after DISCONNECTED sends the DREP.
            CmEvent::Disconnected { id }
                if self.eng_ref(node).state(id) == Some(CmState::DreqRcvd) =>
            {
                let d = self.rng.below(1_000_000);
                self.at(d, Action::Disconnect { node, id });
            }
            _ => {}
        }
    }

    fn act(&mut self, a: Action) {
        let now = self.now;
        match a {
            Action::Connect {
                node,
                peer,
                listened,
            } => {
                let port = if listened {
                    LISTENED_PORT
                } else {
                    UNLISTENED_PORT
                };
                self.next_qpn += 1;
                let cp = ConnectParams {
                    peer: ip(peer),
                    service_id: rdma_cm_service_id(port_space::TCP, port),
                    local_qpn: self.next_qpn,
                    starting_psn: self.rng.below(1 << 24) as u32,
                    responder_resources: 1,
                    initiator_depth: 1,
                    path_mtu: 3,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    local_ack_timeout: 14,
                    flow_label: 0,
                    traffic_class: 0,
                    hop_limit: 64,
                    srq: false,
                    private_data: vec![],
                };
                let id = self.eng(node).connect(now, &cp).unwrap();
                let t = self.tracks.entry((node, id)).or_default();
                t.listened = Some(listened);
                t.events.push("connect");
            }
            Action::Answer { node, id } => {
                if self.eng(node).state(id).is_none() {
                    return; // rejected or timed out meanwhile
                }
                if self.rng.chance(self.p.reject_p) {
                    self.tracks.entry((node, id)).or_default().rejected_by_app = true;
                    self.eng(node).reject(now, id, b"busy").unwrap();
                } else {
                    self.next_qpn += 1;
                    let ap = AcceptParams {
                        local_qpn: self.next_qpn,
                        starting_psn: self.rng.below(1 << 24) as u32,
                        responder_resources: 1,
                        initiator_depth: 1,
                        target_ack_delay: 0,
                        rnr_retry_count: 7,
                        srq: false,
                        private_data: vec![],
                    };
                    self.eng(node).accept(now, id, &ap).unwrap();
                }
            }
            Action::Establish { node, id } => {
                if self.eng(node).state(id) == Some(CmState::RepRcvd) {
                    self.eng(node).establish(now, id).unwrap();
                }
            }
            Action::Disconnect { node, id } => {
                let ok = matches!(
                    self.eng(node).state(id),
                    Some(CmState::Established | CmState::DreqRcvd)
                );
                if ok {
                    self.eng(node).disconnect(now, id).unwrap();
                }
            }
        }
    }

    /// Moves every output of every engine: events first, then MADs (the poll order).
    fn drain(&mut self) {
        for n in 0..NODES {
            while let Some(ev) = self.eng(n).poll_event() {
                self.event(n, ev);
            }
            if self.ports.is_none() {
                while let Some(m) = self.engines[n].poll_mad() {
                    self.send(n, m);
                }
            }
        }
    }

    fn run(&mut self) -> Result<(), String> {
        for _ in 0..self.p.connections {
            let node = self.rng.below(NODES as u64) as usize;
            let peer = (node + 1 + self.rng.below(NODES as u64 - 1) as usize) % NODES;
            let listened = !self.rng.chance(self.p.unlistened_p);
            let start = self.rng.below(100_000_000);
            self.at(
                start,
                Action::Connect {
                    node,
                    peer,
                    listened,
                },
            );
        }
        if self.ports.is_some() {
            return self.run_on_devices();
        }
        let mut steps = 0u64;
        loop {
            steps += 1;
            if steps > 2_000_000 {
                return Err("no quiescence after 2,000,000 steps".into());
            }
            let t_link = self.link.peek().map(|Reverse(x)| x.0);
            let t_act = self.actions.peek().map(|Reverse(x)| x.0);
            let t_timer = self.engines.iter().filter_map(|e| e.poll_timeout()).min();
            let Some(next) = [t_link, t_act, t_timer].into_iter().flatten().min() else {
                break;
            };
            if next.as_nanos() > 3_600_000_000_000 {
                return Err(format!(
                    "still busy after an hour of virtual time: {next:?}"
                ));
            }
            self.now = next;
            if t_link == Some(next) {
                let Reverse((_, _, src, dst, mad)) = self.link.pop().unwrap();
                self.delivered[dst] += 1;
                self.engines[dst].handle_mad(next, ip(src), &mad[..]);
            } else if t_act == Some(next) {
                let Reverse((_, _, a)) = self.actions.pop().unwrap();
                self.act(a);
            } else {
                for e in &mut self.engines {
                    e.handle_timeout(next);
                }
            }
            self.drain();
        }
        self.check()
    }

    /// The event loop of `on_devices`: the CM driver loop of the Rust API and
    /// librdmacm.so.1 ([`cm_loop::run`]) on the simulation's clock, over [`OnDevices`].
    fn run_on_devices(&mut self) -> Result<(), String> {
        let clock = self.ports.as_ref().unwrap().sim.clock();
        let mut l = OnDevices { w: self, turns: 0 };
        match cm_loop::run(&mut l, &*clock) {
            LoopEnd::Stopped => self.check(),
            LoopEnd::Failed(why) => Err(why),
        }
    }

    fn check(&self) -> Result<(), String> {
        for n in 0..NODES {
            let e = self.eng_ref(n);
            if e.connection_count() != 0 || e.poll_timeout().is_some() {
                let leaked: Vec<_> = e
                    .connections()
                    .map(|(id, st)| (id, st, self.tracks.get(&(n, id)).map(|t| t.events.clone())))
                    .collect();
                return Err(format!("node {n} leaks {leaked:?}"));
            }
            if self.ports.is_none() && e.counters().mads_received != self.delivered[n] {
                return Err(format!("node {n}: mads_received != delivered"));
            }
        }
        for ((node, id), t) in &self.tracks {
            let ev = &t.events;
            let finals = ev
                .iter()
                .filter(|e| {
                    matches!(
                        **e,
                        "TimewaitExit" | "Rejected" | "Rejected(8)" | "Unreachable"
                    )
                })
                .count();
            let last = ev.last().copied().unwrap_or("");
            let bad = |why: &str| Err(format!("node {node} {id:?} {why}: {ev:?}"));
            if t.rejected_by_app {
                // rdma_reject: the REJ is sent and the ID is the application's to destroy;
                // librdmacm reports nothing more.
                if ev[..] != ["ConnectRequest"] {
                    return bad("got events after the application rejected it");
                }
                continue;
            }
            if finals != 1
                || !matches!(
                    last,
                    "TimewaitExit" | "Rejected" | "Rejected(8)" | "Unreachable"
                )
            {
                return bad("does not end with exactly one final event");
            }
            for once in [
                "Established",
                "Disconnected",
                "ConnectResponse",
                "ConnectRequest",
            ] {
                if ev.iter().filter(|e| **e == once).count() > 1 {
                    return bad("has a repeated event");
                }
            }
            if last == "TimewaitExit" && !ev.contains(&"Disconnected") {
                return bad("left TIMEWAIT without DISCONNECTED");
            }
            if t.listened == Some(false) && !matches!(last, "Rejected(8)" | "Unreachable") {
                return bad("REQ to an unlistened service did not end REJECTED(8)");
            }
            if last == "Rejected(8)" && t.listened != Some(false) {
                return bad("REJECTED(8) for a listened service");
            }
            if self.p.loss == 0.0 && !t.rejected_by_app {
                let rejected_peer = matches!(last, "Rejected");
                if t.listened == Some(true) && !rejected_peer && !ev.contains(&"Established") {
                    return bad("not ESTABLISHED on a loss-free link");
                }
            }
        }
        Ok(())
    }
}

/// The simulated run as a [`CmLoop`]: the loop waits up to the next of a datagram or device
/// timer (the simulator's), an application action and a CM timer, as a driver thread waits
/// on QP1; then every port moves its QP1 completions, due timers and queued MADs
/// (`CmPort::process`, as the drivers' turns do), the application acts, and the events go to
/// it. Waiting never blocks: it steps the simulated network, so virtual time jumps.
struct OnDevices<'a> {
    w: &'a mut World,
    turns: u64,
}

impl OnDevices<'_> {
    /// The earliest of the network's next event, a CM port's timer and the next action.
    fn next(&self) -> Option<Instant> {
        let p = self.w.ports.as_ref().unwrap();
        let t_net = p.sim.next_event();
        let t_cm = p.ports.iter().filter_map(CmPort::poll_timeout).min();
        let t_act = self.w.actions.peek().map(|Reverse(x)| x.0);
        [t_net, t_act, t_cm].into_iter().flatten().min()
    }
}

impl CmLoop for OnDevices<'_> {
    /// Nothing: what came is in the ports' QP1 rings, which `CmPort::process` reads.
    type Input = ();

    fn next_timer(&mut self) -> Result<Option<Instant>, LoopEnd> {
        let next = self.next();
        if let Some(t) = next
            && t.as_nanos() > 3_600_000_000_000
        {
            return Err(LoopEnd::Failed(format!(
                "still busy after an hour of virtual time: {t:?}"
            )));
        }
        Ok(next)
    }

    /// Steps the network to its next event if that comes within `timeout` (a datagram or
    /// device timer wakes the wait), else moves virtual time on by `timeout`.
    fn wait(&mut self, timeout: Duration) -> Result<(), LoopEnd> {
        let sim = &mut self.w.ports.as_mut().unwrap().sim;
        if sim.next_event().is_some_and(|t| t <= sim.now() + timeout) {
            sim.step();
        } else {
            sim.advance(timeout);
        }
        Ok(())
    }

    /// Ends the loop (`Stopped`) when nothing is pending any more: no datagram, no timer, no
    /// action.
    fn turn(&mut self, now: Instant, (): ()) -> Result<(), LoopEnd> {
        // The 20 ms cap of `cm_loop::wait_for` adds turns where nothing is due; an hour of
        // virtual time is 180,000 of them, well inside the bound.
        self.turns += 1;
        if self.turns > 2_000_000 {
            return Err(LoopEnd::Failed(
                "no quiescence after 2,000,000 loop turns".into(),
            ));
        }
        let w = &mut *self.w;
        w.now = now;
        if w.actions.peek().is_some_and(|Reverse(x)| x.0 <= now) {
            let Reverse((_, _, a)) = w.actions.pop().unwrap();
            w.act(a);
        }
        for port in &mut w.ports.as_mut().unwrap().ports {
            port.process(now)
                .map_err(|e| LoopEnd::Failed(format!("CmPort::process: {e}")))?;
        }
        w.drain();
        match self.next() {
            Some(_) => Ok(()),
            None => Err(LoopEnd::Stopped),
        }
    }
}

/// What a run exercised, summed over seeds.
#[derive(Debug, Default)]
struct Coverage {
    established: usize,
    final_events: BTreeMap<&'static str, usize>,
    retransmits: u64,
    resends: u64,
    drops: u64,
}

fn run_seed(seed: u64, cov: &mut Coverage) {
    run_world(World::new(seed), cov);
}

/// `run_seed` with the engines on QP1 of simulated devices (`World::on_devices`).
fn run_seed_on_devices(seed: u64, cov: &mut Coverage) {
    run_world(World::on_devices(seed), cov);
}

fn run_world(mut w: World, cov: &mut Coverage) {
    let how = if w.ports.is_some() {
        "on QP1 of simulated devices"
    } else {
        "engines on the in-test link"
    };
    if let Err(e) = w.run() {
        panic!("SOFTROCE_SEED={} failed ({how}, {:?}): {e}", w.seed, w.p);
    }
    for t in w.tracks.values() {
        if t.listened.is_some() && t.events.contains(&"Established") {
            cov.established += 1;
        }
        if let Some(last) = t.events.last() {
            *cov.final_events.entry(last).or_default() += 1;
        }
    }
    for n in 0..NODES {
        let c = w.eng_ref(n).counters();
        cov.retransmits += c.retransmits;
        cov.resends += c.resends;
        cov.drops += c.total_drops();
    }
}

fn seeds(default: u64) -> Vec<u64> {
    if let Ok(s) = std::env::var("SOFTROCE_SEED") {
        return vec![s.parse().expect("SOFTROCE_SEED is a number")];
    }
    let n = std::env::var("SOFTROCE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    (0..n).collect()
}

#[test]
fn connect_disconnect_storms_end_established_or_with_a_librdmacm_event() {
    let mut cov = Coverage::default();
    let seeds = seeds(40);
    for &seed in &seeds {
        run_seed(seed, &mut cov);
    }
    eprintln!("{cov:?}");
    if seeds.len() >= 40 {
        // The storms are not vacuous: connections get through, and retransmission, resends
        // for duplicates, rejects and timeouts all happen.
        assert!(cov.established > 100, "{cov:?}");
        assert!(
            cov.retransmits > 0 && cov.resends > 0 && cov.drops > 0,
            "{cov:?}"
        );
        for ev in ["TimewaitExit", "Rejected", "Rejected(8)", "ConnectRequest"] {
            assert!(cov.final_events.contains_key(ev), "no {ev}: {cov:?}");
        }
    }
}

#[test]
fn storms_through_cm_ports_on_qp1_of_simulated_devices() {
    // The same storms and checks, with each engine behind verbs::CmPort on a device's QP1
    // (the path librdmacm.so.1 takes): MADs are UD SENDs to QP1 with the GSI Q_Key, arrive
    // behind a GRH, and go through the MAD agent; the link loses, duplicates, reorders and
    // flips bits.
    let mut cov = Coverage::default();
    let seeds = seeds(20);
    for &seed in &seeds {
        run_seed_on_devices(seed, &mut cov);
    }
    eprintln!("{cov:?}");
    if seeds.len() >= 20 {
        assert!(cov.established > 50, "{cov:?}");
        assert!(cov.retransmits > 0 && cov.resends > 0, "{cov:?}");
        for ev in ["TimewaitExit", "Rejected", "Rejected(8)"] {
            assert!(cov.final_events.contains_key(ev), "no {ev}: {cov:?}");
        }
    }
}

#[test]
fn loss_free_storm_through_cm_ports_establishes_every_accepted_connection() {
    for seed in seeds(3) {
        let mut w = World::on_devices_with(seed, |p| {
            p.loss = 0.0;
            p.reject_p = 0.0;
            p.unlistened_p = 0.0;
        });
        if let Err(e) = w.run() {
            panic!("SOFTROCE_SEED={seed} (on devices, loss forced to 0) failed: {e}");
        }
        let n = w
            .tracks
            .values()
            .filter(|t| t.listened == Some(true))
            .count();
        let est = w
            .tracks
            .values()
            .filter(|t| t.listened == Some(true) && t.events.contains(&"Established"))
            .count();
        assert_eq!(est, n, "SOFTROCE_SEED={seed}");
    }
}

/// Found by the 3000-seed soak of this file (`SOFTROCE_SIM_SEEDS=3000 cargo test --release
/// --test cm_sim`): with loss forced to 0 but duplication 20 %, reordering 30 % (held up to
/// 20 ms) and slow accepts (up to 58 ms), one connect of seed 1896 ends UNREACHABLE. MAD
/// trace: REQ at 45.3 ms (and its duplicate), MRA back at 45.7 ms, the application accepts at
/// 102.7 ms, its REP is held back and arrives at 121.4 ms; the active side's MRA wait
/// (2 × packet lifetime + service timeout 14 ≈ 75.5 ms) ended at 121.3 ms and, with "no
/// retries after an MRA" (cm/recv.rs `on_mra`: `retries_left = 0`; docs/cm.md), it sent
/// REJ(timeout). Kernel cm.c `cm_mra_handler` → `ib_modify_mad` only stretches the REQ's
/// timeout and keeps its retries, so the kernel resends the REQ and connects; the engine now
/// does the same (cm/recv.rs `on_mra`), and this seed connects.
#[test]
fn issue_22_cm_seed_1896_unreachable_on_a_loss_free_link() {
    let mut w = World::new(1896);
    w.p.loss = 0.0;
    w.p.reject_p = 0.0;
    w.p.unlistened_p = 0.0;
    if let Err(e) = w.run() {
        panic!(
            "SOFTROCE_SEED=1896 (loss forced to 0, {:?}) failed: {e}",
            w.p
        );
    }
}

#[test]
fn loss_free_storm_establishes_every_accepted_connection() {
    // Seeds whose swarm parameters drew loss 0 are checked for full establishment by
    // `check`; this test forces one such run on top.
    for seed in seeds(5) {
        let mut w = World::new(seed);
        w.p.loss = 0.0;
        w.p.reject_p = 0.0;
        w.p.unlistened_p = 0.0;
        if let Err(e) = w.run() {
            panic!(
                "SOFTROCE_SEED={seed} (loss forced to 0, {:?}) failed: {e}",
                w.p
            );
        }
        let n = w
            .tracks
            .values()
            .filter(|t| t.listened == Some(true))
            .count();
        let est = w
            .tracks
            .values()
            .filter(|t| t.listened == Some(true) && t.events.contains(&"Established"))
            .count();
        assert_eq!(est, n, "SOFTROCE_SEED={seed}");
    }
}
