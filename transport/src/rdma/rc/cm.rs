//! Connection management through rdma_cm: its events with deadlines, the listener, connect.

use super::*;

/// Wait for the next rdma_cm event on `channel`, at most until `deadline`.
pub(super) fn next_event(
    channel: &Arc<EventChannel>,
    deadline: Instant,
    during: &'static str,
    after: Duration,
) -> Result<Event, RdmaError> {
    // Wait for the channel's fd to be readable within the deadline; only then fetch the event,
    // which is ready, so the (blocking) fetch cannot hang.
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RdmaError::Timeout { during, after });
        }
        let mut pfd = libc::pollfd {
            fd: channel.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call; the channel (and its fd) outlives it.
        let rc = unsafe {
            libc::poll(
                &mut pfd,
                1,
                left.as_millis().clamp(1, i32::MAX as u128) as i32,
            )
        };
        if rc > 0 {
            return channel.get_cm_event().map_err(cm);
        }
    }
}

pub(super) fn expect_event(
    channel: &Arc<EventChannel>,
    want: EventType,
    name: &'static str,
    deadline: Instant,
    after: Duration,
) -> Result<Arc<Identifier>, RdmaError> {
    let ev = next_event(channel, deadline, name, after)?;
    let (got, status, id) = (ev.event_type(), ev.status(), ev.cm_id());
    let _ = ev.ack();
    if got != want {
        return Err(RdmaError::UnexpectedEvent {
            expected: name,
            got: format!("{got:?}"),
            status,
        });
    }
    id.ok_or_else(|| cm_msg("event without an identifier"))
}

/// Passive side: listens on one address.
pub struct RcListener {
    pub(super) id: Arc<Identifier>,
    pub(super) channel: Arc<EventChannel>,
    pub(super) opts: RcOptions,
}

impl RcListener {
    pub fn bind(addr: SocketAddr, opts: RcOptions) -> Result<RcListener, RdmaError> {
        let channel = EventChannel::new().map_err(cm)?;
        let id = channel.create_id(PortSpace::Tcp).map_err(cm)?;
        id.bind_addr(addr).map_err(cm)?;
        id.listen(64).map_err(cm)?;
        Ok(RcListener { id, channel, opts })
    }

    /// Accept one connection: the QP goes to RTS and the receive ring is posted *before* the
    /// accept, so the client can never send into an empty queue (the DAQIRI failure mode).
    pub fn accept(&self, timeout: Duration) -> Result<RcConnection, RdmaError> {
        let deadline = Instant::now() + timeout;
        let id = expect_event(
            &self.channel,
            EventType::ConnectRequest,
            "CONNECT_REQUEST",
            deadline,
            timeout,
        )?;
        // The listener's channel carries this connection's later events (DISCONNECTED); it is
        // read by the connection, so a listener serves one connection at a time (RdmaServer
        // is the many-connection server).
        let mut conn = RcConnection::create(
            id,
            Some(Arc::clone(&self.channel)),
            self.opts,
            Buffers::new(&self.opts),
        )?;
        conn.ready_to_send()?;
        conn.post_ring()?;
        let mut param = ConnectionParameter::default();
        param.setup_qp_number(conn.qp_number());
        conn.id.accept(param).map_err(cm)?;
        expect_event(
            &self.channel,
            EventType::Established,
            "ESTABLISHED",
            deadline,
            timeout,
        )?;
        conn.exchange_adverts(deadline, timeout)?;
        Ok(conn)
    }
}

impl Drop for RcListener {
    fn drop(&mut self) {
        // The identifier is destroyed by sideway when its last Arc goes.
        let _ = &self.id;
    }
}

/// Active side: resolve, connect, establish.
pub fn connect(addr: SocketAddr, opts: RcOptions) -> Result<RcConnection, RdmaError> {
    let deadline = Instant::now() + opts.timeout;
    let channel = EventChannel::new().map_err(cm)?;
    let id = channel.create_id(PortSpace::Tcp).map_err(cm)?;
    let step = opts.timeout.min(Duration::from_secs(5));
    id.resolve_addr(None, addr, step).map_err(cm)?;
    expect_event(
        &channel,
        EventType::AddressResolved,
        "ADDR_RESOLVED",
        deadline,
        opts.timeout,
    )?;
    id.resolve_route(step).map_err(cm)?;
    expect_event(
        &channel,
        EventType::RouteResolved,
        "ROUTE_RESOLVED",
        deadline,
        opts.timeout,
    )?;
    let mut conn = RcConnection::create(id, Some(Arc::clone(&channel)), opts, Buffers::new(&opts))?;
    conn.post_ring()?;
    let mut param = ConnectionParameter::default();
    param.setup_qp_number(conn.qp_number());
    conn.id.connect(param).map_err(cm)?;
    // The active side may leave INIT only once the response says who the peer is.
    expect_event(
        &channel,
        EventType::ConnectResponse,
        "CONNECT_RESPONSE",
        deadline,
        opts.timeout,
    )?;
    conn.ready_to_send()?;
    conn.id.establish().map_err(cm)?;
    conn.exchange_adverts(deadline, opts.timeout)?;
    Ok(conn)
}
