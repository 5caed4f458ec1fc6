//! The listener's waiter table, without sockets: who waits for which (sequence, generation),
//! early arrivals parked, and the one decision per wait and per arrival, each made under the
//! table's lock. Generic over what arrives (a socket) and what a waiter is handed (a
//! connection), so the model checker drives the same code with plain values
//! (`transport/tests/model.rs`); the listener adds sockets, handshakes and threads around it.

use std::collections::HashMap;
use std::time::Duration;

use crate::error::{Error, RejectReason, Result};
use crate::sync::channel::{bounded, Receiver, Sender};

/// A wait in progress: its generation, and where its result goes.
pub struct Waiter<C> {
    generation: u64,
    deliver: Sender<Result<C>>,
}

impl<C> Waiter<C> {
    /// Hand the waiter its result (a connection, or why there is none).
    pub fn deliver(self, result: Result<C>) {
        let _ = self.deliver.try_send(result);
    }
}

/// The table's state; its owner keeps it under one lock.
pub struct Waits<S, C> {
    closed: bool,
    /// Next generation a wait takes, per sequence.
    next_generation: HashMap<u64, u64>,
    pending: HashMap<u64, Waiter<C>>,
    /// Arrivals whose wait has not started yet, by (sequence, generation).
    parked: HashMap<(u64, u64), S>,
}

impl<S, C> Default for Waits<S, C> {
    fn default() -> Self {
        Waits {
            closed: false,
            next_generation: HashMap::new(),
            pending: HashMap::new(),
            parked: HashMap::new(),
        }
    }
}

/// How a wait begins: its arrival was parked already, or it waits on a channel.
pub(crate) enum Begin<S, C> {
    Parked(S),
    Waiting {
        generation: u64,
        delivered: Receiver<Result<C>>,
    },
}

/// Where an arrival goes.
pub enum Placement<S, C> {
    /// To its waiter: build the connection and deliver it.
    Deliver(Waiter<C>, S),
    Parked,
    Refused(S, RejectReason),
}

impl<S, C> Waits<S, C> {
    /// Start a wait for the next generation of `sequence`.
    pub(crate) fn begin(&mut self, sequence: u64, max_pending: usize) -> Result<Begin<S, C>> {
        if self.closed {
            return Err(Error::ListenerClosed);
        }
        if self.pending.contains_key(&sequence) {
            return Err(Error::DuplicateWait { sequence });
        }
        let next = self.next_generation.get(&sequence).copied().unwrap_or(0);
        if let Some(socket) = self.parked.remove(&(sequence, next)) {
            self.next_generation.insert(sequence, next + 1);
            return Ok(Begin::Parked(socket));
        }
        if self.pending.len() >= max_pending {
            return Err(Error::PendingLimit { max: max_pending });
        }
        let (deliver, delivered) = bounded(1);
        self.next_generation.insert(sequence, next + 1);
        self.pending.insert(
            sequence,
            Waiter {
                generation: next,
                deliver,
            },
        );
        Ok(Begin::Waiting {
            generation: next,
            delivered,
        })
    }

    /// A wait's deadline passed: true when it is over (its entry removed), false when an
    /// arrival took the entry first and its result is on the way.
    pub fn give_up(&mut self, sequence: u64, generation: u64) -> bool {
        if self
            .pending
            .get(&sequence)
            .is_some_and(|w| w.generation == generation)
        {
            self.pending.remove(&sequence);
            return true;
        }
        false
    }

    /// Decide where an arrival for (`sequence`, `generation`) goes. `ack` tells the peer it is
    /// taken (under the lock, so its data follows the ack); false when the peer is gone.
    pub fn place(
        &mut self,
        sequence: u64,
        generation: u64,
        socket: S,
        max_parked: usize,
        ack: impl FnOnce(&S) -> bool,
    ) -> Placement<S, C> {
        if self.closed {
            return Placement::Refused(socket, RejectReason::ListenerClosed);
        }
        let next = self.next_generation.get(&sequence).copied().unwrap_or(0);
        let key = (sequence, generation);
        let waiting = self
            .pending
            .get(&sequence)
            .is_some_and(|w| w.generation == generation);
        if !waiting {
            let refusal = if generation < next {
                Some(RejectReason::StaleGeneration)
            } else if self.parked.contains_key(&key) {
                Some(RejectReason::Duplicate)
            } else if self.parked.len() >= max_parked {
                Some(RejectReason::Overloaded)
            } else {
                None
            };
            if let Some(reason) = refusal {
                return Placement::Refused(socket, reason);
            }
        }
        if !ack(&socket) {
            // The peer vanished between hello and ack; a waiter keeps waiting.
            return Placement::Refused(socket, RejectReason::Malformed);
        }
        if waiting {
            let waiter = self
                .pending
                .remove(&sequence)
                .expect("checked above under the same lock");
            Placement::Deliver(waiter, socket)
        } else {
            self.parked.insert(key, socket);
            Placement::Parked
        }
    }

    /// Close: every pending waiter is failed with `ListenerClosed`, parked arrivals dropped.
    pub fn close(&mut self) {
        self.closed = true;
        for (_, waiter) in self.pending.drain() {
            waiter.deliver(Err(Error::ListenerClosed));
        }
        self.parked.clear();
    }

    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Waits pending and arrivals parked, right now.
    pub fn sizes(&self) -> (usize, usize) {
        (self.pending.len(), self.parked.len())
    }
}

/// What holds a table under its lock.
pub trait Table<S, C> {
    fn with<R>(&self, f: impl FnOnce(&mut Waits<S, C>) -> R) -> R;
}

/// How a wait ended, for its owner's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its arrival was parked already (the connection was built here).
    Parked,
    /// It timed out, decided under the lock.
    TimedOut,
    /// An arrival delivered, or the wait was refused.
    Other,
}

/// `Listener::wait_for`'s protocol: every wait owns its deadline, and whether it succeeded or
/// timed out is decided once, under the table's lock, so it can neither time out after
/// success nor be handed a connection after it gave up. `connect` builds a connection from a
/// parked arrival. Returns exactly once.
pub fn wait_for<S, C>(
    table: &impl Table<S, C>,
    sequence: u64,
    timeout: Duration,
    max_pending: usize,
    connect: impl FnOnce(S) -> Result<C>,
) -> (Result<C>, Outcome) {
    let (generation, delivered) = match table.with(|w| w.begin(sequence, max_pending)) {
        Err(e) => return (Err(e), Outcome::Other),
        Ok(Begin::Parked(socket)) => return (connect(socket), Outcome::Parked),
        Ok(Begin::Waiting {
            generation,
            delivered,
        }) => (generation, delivered),
    };
    if let Ok(result) = delivered.recv_timeout(timeout) {
        return (result, Outcome::Other);
    }
    let timed_out = Err(Error::Timeout {
        during: "waiting for a lazy connect",
        after: timeout,
    });
    #[cfg(feature = "bug-injection")]
    if crate::injected::bug() == Some(crate::injected::Bug::LateTimer) {
        table.with(|w| w.pending.remove(&sequence));
        return (timed_out, Outcome::TimedOut);
    }
    if table.with(|w| w.give_up(sequence, generation)) {
        return (timed_out, Outcome::TimedOut);
    }
    // Our entry is gone, so an arrival took it under the lock and is about to deliver (it
    // only has a connection to build). Bounded anyway.
    let result = delivered
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or(Err(Error::Timeout {
            during: "handing over a matched connection",
            after: timeout,
        }));
    (result, Outcome::Other)
}
