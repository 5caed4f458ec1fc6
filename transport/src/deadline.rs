//! A wait's deadline that costs no reading of the clock until the wait turns out not to be
//! quick. A send into a socket with room, or a receive whose bytes are already there, never
//! looks at the clock: on the busy-poll path a reading (about 20 ns here, 3 µs for the emulated
//! HPET in the rxe VM under TCG) on every call was a measurable part of a round trip.

use std::time::Duration;

use crate::sync::Instant;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Deadline {
    At(Instant),
    /// This long from the first time the wait looks at the clock. The bound is then at most
    /// the work done before that look (no wait) longer than `timeout` from the call.
    After(Duration),
}

impl Deadline {
    /// The deadline, fixed from `now` on first use.
    pub(crate) fn fixed(&mut self, now: Instant) -> Instant {
        let at = match *self {
            Deadline::At(at) => at,
            Deadline::After(timeout) => now + timeout,
        };
        *self = Deadline::At(at);
        at
    }

    /// The time left from `now` (`None` once past), fixing the deadline on first use.
    pub(crate) fn left(&mut self, now: Instant) -> Option<Duration> {
        let at = self.fixed(now);
        (now < at).then(|| at - now)
    }
}

#[cfg(all(test, not(wringer_model)))]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_after_a_timeout_is_fixed_at_its_first_look_and_kept() {
        let mut d = Deadline::After(Duration::from_secs(5));
        let first = Instant::now();
        assert_eq!(d.fixed(first), first + Duration::from_secs(5));
        let later = first + Duration::from_secs(2);
        assert_eq!(d.fixed(later), first + Duration::from_secs(5));
        assert_eq!(d.left(later), Some(Duration::from_secs(3)));
        assert_eq!(d.left(first + Duration::from_secs(5)), None);
    }
}
