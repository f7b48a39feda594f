//! The one CM driver loop: a thread that waits on a device's QP1 up to the CM engine's next
//! timer (at most [`CM_TICK`]), then, under its frontend's lock, feeds what came (MADs, an
//! ICMP "unreachable", due timers) to the engine and sorts the engine's events. Every CM
//! frontend runs its engine on it: the Rust API's [`CmDriver`](super::cm::CmDriver) (QP1
//! through [`CmPort`](crate::verbs::CmPort)) and librdmacm.so.1 (QP1 through libibverbs.so.1's
//! private MAD entry points, since its devices live in the other library), each on a thread
//! ([`spawn`]); and the simulator's CM storms (tests/cm_sim.rs, `OnDevices`), which call
//! [`run`] on the simulation's clock ([`Sim::clock`](super::sim::Sim::clock)) with a `wait`
//! that steps the simulated network instead of blocking. What differs between them is what
//! a frontend does with the events, written once each in [`CmLoop::turn`]; the waiting, the
//! timer arithmetic, the stop and failure paths and the panic guard are here. The keeper of
//! a shared device (`net::keeper`) is no CM loop (its poll also serves the process
//! slots), but its poll timeout is this timer arithmetic too ([`wait_for_capped`]).
//!
//! No silent hang: [`spawn`] runs the loop under `catch_unwind`; a panic is reported (stderr
//! and `SOFTROCE_LOG`, [`super::panic::report`]) and, like a loop that ends because its
//! device failed, handed to the frontend's `on_failure`, which fails what waits on the CM.
//!
//! Time: the caller's [`Clock`] (the frontends pass a [`SystemClock`](super::SystemClock),
//! the simulator its [`ManualClock`](super::ManualClock)).

use crate::transport::Instant;
use crate::verbs::Clock;
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest a CM driver thread waits on QP1 before it looks at the timers and its stop
/// condition again.
pub const CM_TICK: Duration = Duration::from_millis(20);

/// Why a CM loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoopEnd {
    /// Its frontend stopped it (the device closed, the library's state is gone).
    Stopped,
    /// It cannot go on: its device failed, with this reason.
    Failed(String),
}

/// A frontend's side of the CM loop. The loop calls `next_timer`, then `wait` (without the
/// frontend's lock), then `turn` (under it), until one of them returns a [`LoopEnd`].
pub trait CmLoop {
    /// What one wait on QP1 gives (completions, one MAD, nothing).
    type Input;

    /// The engine's next timer (`None`: none armed); `Err` ends the loop (stop asked for,
    /// device failed).
    fn next_timer(&mut self) -> Result<Option<Instant>, LoopEnd>;

    /// Waits up to `timeout` for QP1's next input. `Err` ends the loop.
    fn wait(&mut self, timeout: Duration) -> Result<Self::Input, LoopEnd>;

    /// Feeds `input` to the engine at `now`, runs the timers that are due, sorts the
    /// engine's events and sends its MADs. `Err` ends the loop.
    fn turn(&mut self, now: Instant, input: Self::Input) -> Result<(), LoopEnd>;
}

/// How long the loop waits at `now` for an engine whose next timer is `next`: until the
/// timer, at most [`CM_TICK`] (0 when the timer is due).
pub fn wait_for(next: Option<Instant>, now: Instant) -> Duration {
    wait_for_capped(next, now, CM_TICK)
}

/// [`wait_for`] with the cap `cap` instead of [`CM_TICK`]: until `next`, at most `cap` (0
/// when `next` is due, `cap` when no timer is armed). The one timer arithmetic of the CM's
/// waits: the loop's, and the keeper's poll on its slot-0 CM (`net::keeper`), which
/// wakes at most once a second.
pub fn wait_for_capped(next: Option<Instant>, now: Instant, cap: Duration) -> Duration {
    next.map_or(cap, |t| {
        Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos())).min(cap)
    })
}

/// Runs `l` until it ends, on `clock`'s time: [`run_once`] over and over.
pub fn run<L: CmLoop>(l: &mut L, clock: &dyn Clock) -> LoopEnd {
    loop {
        if let Err(end) = run_once(l, clock) {
            return end;
        }
    }
}

/// One round of the loop on `clock`'s time: the next timer, the wait up to it
/// ([`wait_for`]), the turn. What [`run`] repeats; a harness that owns the clock (the
/// in-memory bench of librdmacm.so.1's driver, feature `testing` there) calls it once per
/// input. `Err` when the loop ends.
pub fn run_once<L: CmLoop>(l: &mut L, clock: &dyn Clock) -> Result<(), LoopEnd> {
    l.next_timer()
        .and_then(|next| l.wait(wait_for(next, clock.now())))
        .and_then(|input| l.turn(clock.now(), input))
}

/// Starts thread `name` running `l` on `clock` ([`run`]) under a panic guard. When the loop
/// fails (its device failed) or panics (reported as `what` panicked, then `then`: what
/// follows for the user), `on_failure` gets the reason, so that the frontend fails what
/// waits on its CM. A loop that was stopped calls nothing.
/// Errors: those of `std::thread::Builder::spawn` (no thread could start).
pub fn spawn<L, C, F>(
    name: String,
    what: String,
    then: &'static str,
    mut l: L,
    clock: C,
    on_failure: F,
) -> std::io::Result<JoinHandle<()>>
where
    L: CmLoop + Send + 'static,
    C: Clock + Send + 'static,
    F: FnOnce(String) + Send + 'static,
{
    std::thread::Builder::new().name(name).spawn(move || {
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&mut l, &clock)));
        let why = match ran {
            Ok(LoopEnd::Stopped) => return,
            Ok(LoopEnd::Failed(why)) => why,
            Err(p) => {
                let msg = super::panic::message(&*p);
                super::panic::report(&what, &msg, then);
                format!("its driver thread panicked: {msg}")
            }
        };
        // What fails the frontend must not take the thread down with it either.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| on_failure(why)));
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::ManualClock;
    use std::sync::Arc;

    /// A loop over a scripted QP1: each wait records its timeout and advances the clock by
    /// it; a timer fires when the clock reaches it.
    struct Scripted {
        clock: Arc<ManualClock>,
        timer: Option<Instant>,
        waits: Vec<Duration>,
        fired: usize,
        turns: usize,
        end_after: usize,
    }

    impl CmLoop for Scripted {
        type Input = ();
        fn next_timer(&mut self) -> Result<Option<Instant>, LoopEnd> {
            if self.turns == self.end_after {
                return Err(LoopEnd::Failed("scripted end".into()));
            }
            Ok(self.timer)
        }
        fn wait(&mut self, timeout: Duration) -> Result<(), LoopEnd> {
            self.waits.push(timeout);
            self.clock.advance(timeout);
            Ok(())
        }
        fn turn(&mut self, now: Instant, (): ()) -> Result<(), LoopEnd> {
            self.turns += 1;
            if self.timer.is_some_and(|t| t <= now) {
                self.fired += 1;
                self.timer = None;
            }
            Ok(())
        }
    }

    #[test]
    fn the_loop_waits_up_to_the_next_timer_and_at_most_a_tick() {
        let clock = Arc::new(ManualClock::new());
        let mut l = Scripted {
            clock: clock.clone(),
            timer: Some(Instant::from_nanos(45_000_000)),
            waits: Vec::new(),
            fired: 0,
            turns: 0,
            end_after: 4,
        };
        assert_eq!(run(&mut l, &*clock), LoopEnd::Failed("scripted end".into()));
        let ms = Duration::from_millis;
        assert_eq!(l.waits, [ms(20), ms(20), ms(5), ms(20)]);
        assert_eq!(l.fired, 1, "the timer fired once, at 45 ms");
        assert_eq!(
            wait_for(Some(Instant::from_nanos(1)), Instant::from_nanos(9)),
            ms(0)
        );
        let s = Duration::from_secs(1);
        assert_eq!(wait_for_capped(None, Instant::ZERO, s), s);
        assert_eq!(
            wait_for_capped(Some(Instant::from_nanos(45_000_000)), Instant::ZERO, s),
            ms(45)
        );
    }

    #[test]
    fn run_once_is_one_round_of_the_loop() {
        let clock = Arc::new(ManualClock::new());
        let mut l = Scripted {
            clock: clock.clone(),
            timer: Some(Instant::from_nanos(5_000_000)),
            waits: Vec::new(),
            fired: 0,
            turns: 0,
            end_after: 2,
        };
        assert_eq!(run_once(&mut l, &*clock), Ok(()));
        assert_eq!((l.waits.len(), l.turns, l.fired), (1, 1, 1));
        assert_eq!(run_once(&mut l, &*clock), Ok(()));
        assert_eq!(
            run_once(&mut l, &*clock),
            Err(LoopEnd::Failed("scripted end".into()))
        );
        assert_eq!(l.turns, 2, "an ended loop does not turn");
    }

    #[test]
    fn a_panic_in_the_loop_reaches_on_failure() {
        struct Panics;
        impl CmLoop for Panics {
            type Input = ();
            fn next_timer(&mut self) -> Result<Option<Instant>, LoopEnd> {
                panic!("scripted panic");
            }
            fn wait(&mut self, _: Duration) -> Result<(), LoopEnd> {
                Ok(())
            }
            fn turn(&mut self, _: Instant, (): ()) -> Result<(), LoopEnd> {
                Ok(())
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let t = spawn(
            "cm-loop-test".into(),
            "a test's CM loop".into(),
            "the test sees it",
            Panics,
            ManualClock::new(),
            move |why| {
                let _ = tx.send(why);
            },
        )
        .expect("spawn");
        t.join().expect("the thread itself does not panic");
        let why = rx.recv().expect("on_failure ran");
        assert!(why.contains("scripted panic"), "{why}");
    }
}
