//! The transport a step runs over, as a parameter (`fabric: tcp | rdma`): one small trait for
//! a connected message stream between rank 0 and one peer, so a step is written once for both.

use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use wringer_transport::rdma::rc::{RcConnection, RdmaError, Received};
use wringer_transport::Connection;

use super::{connect_to, seq};
use crate::model::invalid::Invalid;
use crate::model::requirement::Requirement;
use crate::rank::context::RankContext;

/// Which transport carries the step's messages.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Fabric {
    /// wringer's TCP transport (lazy connects through the rank's listener).
    #[default]
    Tcp,
    /// An RC queue pair over rdma_cm between ranks 0 and 1 (RoCE or InfiniBand).
    Rdma,
}

/// How a fabric's send or receive failed, in its own words (for the evidence).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LinkError(pub String);

/// One connected stream of messages, whichever the fabric.
pub trait Link {
    fn send(&mut self, payload: &[u8], timeout: Duration) -> Result<(), LinkError>;
    /// The next message.
    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, LinkError>;
}

impl Link for Connection {
    fn send(&mut self, payload: &[u8], timeout: Duration) -> Result<(), LinkError> {
        Connection::send(self, payload, timeout).map_err(|e| LinkError(e.to_string()))
    }

    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, LinkError> {
        Connection::recv(self, timeout)
            .map(|f| f.payload)
            .map_err(|e| LinkError(e.to_string()))
    }
}

impl Link for RcConnection {
    fn send(&mut self, payload: &[u8], timeout: Duration) -> Result<(), LinkError> {
        RcConnection::send(self, payload, timeout).map_err(|e| LinkError(e.to_string()))
    }

    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, LinkError> {
        match RcConnection::recv(self, timeout) {
            Ok(Received::Message(m)) => Ok(m),
            Ok(other) => Err(LinkError(format!("expected a SEND, got {other:?}"))),
            // The peer's rdma_cm said goodbye (or its port went away): name it as such.
            Err(RdmaError::Disconnected) => Err(LinkError("rdma_cm DISCONNECTED".into())),
            Err(e) => Err(LinkError(e.to_string())),
        }
    }
}

impl Fabric {
    /// Connect rank 0 with `peer` (the peer initiates); `None` on the other ranks. Over RDMA
    /// the pair is ranks 0 and 1 (see [`Fabric::check_peer`]).
    pub fn link(
        self,
        ctx: &RankContext,
        step: usize,
        peer: u32,
        max_message: u32,
        deadline: Duration,
    ) -> Result<Option<Box<dyn Link>>> {
        if ctx.rank != 0 && ctx.rank != peer {
            return Ok(None);
        }
        Ok(Some(match self {
            Fabric::Tcp if ctx.rank == 0 => {
                Box::new(ctx.listener.wait_for(seq(step, peer as u64), deadline)?)
            }
            Fabric::Tcp => Box::new(connect_to(ctx, 0, seq(step, peer as u64), deadline)?),
            Fabric::Rdma => Box::new(super::rdma_support::pair(ctx, step, max_message, deadline)?),
        }))
    }

    /// What a host must have for this fabric.
    pub fn requires(self) -> Vec<Requirement> {
        match self {
            Fabric::Tcp => vec![],
            Fabric::Rdma => vec![Requirement::Rdma],
        }
    }

    /// Which ranks can be rank 0's peer: any other over TCP, rank 1 over RDMA.
    pub fn check_peer(self, peer: u32, ranks: u32) -> Result<(), Invalid> {
        match self {
            Fabric::Tcp if peer == 0 || peer >= ranks => Err(Invalid(format!(
                "the peer must be a rank other than 0 (1..{ranks}), got {peer}"
            ))),
            Fabric::Rdma if peer != 1 => Err(Invalid(format!(
                "over rdma the pair is ranks 0 and 1, so the peer must be 1, got {peer}"
            ))),
            _ => Ok(()),
        }
    }
}
