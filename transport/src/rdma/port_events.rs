//! A device's asynchronous events (port down, port back up, QP fatal, …), which no completion
//! carries: a program learns that its port went down only from these. A watcher opens its own
//! context on the device (every context of a device gets its port events) and reads them on a
//! thread, each poll bounded, until it is dropped.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdma_mummy_sys as sys;

use super::rc::RdmaError;

/// One event, as the device reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The verbs name without its prefix: `PORT_ERR`, `PORT_ACTIVE`, `QP_FATAL`, …
    pub kind: &'static str,
    /// The port, for port events.
    pub port: Option<i32>,
    pub at: Instant,
}

/// Reads one device's events until dropped.
pub struct PortEvents {
    device: String,
    seen: Arc<Mutex<Vec<AsyncEvent>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How long one poll of the event descriptor waits before the watcher looks at `stop`.
const POLL_SLICE_MS: i32 = 50;

impl PortEvents {
    /// Watch `device` (`rxe0`, `mlx5_0`): fails when no such device can be opened.
    pub fn watch(device: &str) -> Result<PortEvents, RdmaError> {
        let seen = Arc::new(Mutex::new(vec![]));
        let stop = Arc::new(AtomicBool::new(false));
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        let thread = {
            let (name, seen, stop) = (device.to_string(), Arc::clone(&seen), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("async-events-{device}"))
                .spawn(move || match Context::open(&name) {
                    Ok(ctx) => {
                        let _ = opened_tx.send(Ok(()));
                        ctx.read_until(&stop, &seen);
                    }
                    Err(e) => {
                        let _ = opened_tx.send(Err(e));
                    }
                })
                .map_err(|e| RdmaError::Verbs(format!("starting the event watcher: {e}")))?
        };
        match opened_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(PortEvents {
                device: device.to_string(),
                seen,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                Err(RdmaError::Verbs(format!(
                    "opening {device} for its events took over 10 s"
                )))
            }
        }
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    /// Every event so far, oldest first.
    pub fn events(&self) -> Vec<AsyncEvent> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for PortEvents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // Bounded: the watcher looks at `stop` every POLL_SLICE_MS.
            let _ = t.join();
        }
    }
}

/// An open device context, used only by the watcher thread that opened it.
struct Context(*mut sys::ibv_context);

/// `ibv_async_event` with the event type as a plain integer: the bindings' enum cannot hold a
/// type this build does not know, and the kernel may send one.
#[repr(C)]
struct RawAsyncEvent {
    element: Element,
    event_type: u32,
}

#[repr(C)]
union Element {
    object: *mut libc::c_void,
    port_num: libc::c_int,
}

impl Context {
    fn open(name: &str) -> Result<Context, RdmaError> {
        let mut n = 0;
        // SAFETY: ibv_get_device_list returns a NULL-terminated array of `n` devices (or NULL),
        // valid until ibv_free_device_list; each name is a NUL-terminated string inside it.
        unsafe {
            let list = sys::ibv_get_device_list(&mut n);
            if list.is_null() {
                return Err(RdmaError::Verbs(format!(
                    "no RDMA devices to open {name} from: {}",
                    std::io::Error::last_os_error()
                )));
            }
            let mut ctx = std::ptr::null_mut();
            for i in 0..n.max(0) as usize {
                let dev = *list.add(i);
                if CStr::from_ptr(sys::ibv_get_device_name(dev)).to_bytes() == name.as_bytes() {
                    ctx = sys::ibv_open_device(dev);
                    break;
                }
            }
            sys::ibv_free_device_list(list);
            if ctx.is_null() {
                return Err(RdmaError::Verbs(format!(
                    "cannot open the RDMA device {name}"
                )));
            }
            // Non-blocking, so a read never outlasts its poll.
            let fd = (*ctx).async_fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
            Ok(Context(ctx))
        }
    }

    fn read_until(&self, stop: &AtomicBool, seen: &Mutex<Vec<AsyncEvent>>) {
        // SAFETY: the context is open until `drop`; async_fd is a field it owns.
        let fd = unsafe { (*self.0).async_fd };
        while !stop.load(Ordering::Relaxed) {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, for the duration of the call.
            if unsafe { libc::poll(&mut pfd, 1, POLL_SLICE_MS) } <= 0 {
                continue;
            }
            let mut ev = RawAsyncEvent {
                element: Element {
                    object: std::ptr::null_mut(),
                },
                event_type: 0,
            };
            // SAFETY: RawAsyncEvent has ibv_async_event's layout (a pointer-sized union, then
            // a 32-bit enum); the event is acknowledged once read, as libibverbs requires
            // before the context may close.
            let got = unsafe {
                let raw = &mut ev as *mut RawAsyncEvent as *mut sys::ibv_async_event;
                if sys::ibv_get_async_event(self.0, raw) != 0 {
                    continue;
                }
                sys::ibv_ack_async_event(raw);
                ev.event_type
            };
            let kind = event_name(got);
            // SAFETY: the union was zeroed before the call and every field is plain bytes, so
            // reading the port number is defined; it means something for port events only.
            let port_num = unsafe { ev.element.port_num };
            let port = kind.starts_with("PORT_").then_some(port_num);
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(AsyncEvent {
                    kind,
                    port,
                    at: Instant::now(),
                });
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device, every event read was acknowledged.
        unsafe { sys::ibv_close_device(self.0) };
    }
}

/// The verbs name of an event type (`enum ibv_event_type`).
pub fn event_name(t: u32) -> &'static str {
    const NAMES: [&str; 20] = [
        "CQ_ERR",
        "QP_FATAL",
        "QP_REQ_ERR",
        "QP_ACCESS_ERR",
        "COMM_EST",
        "SQ_DRAINED",
        "PATH_MIG",
        "PATH_MIG_ERR",
        "DEVICE_FATAL",
        "PORT_ACTIVE",
        "PORT_ERR",
        "LID_CHANGE",
        "PKEY_CHANGE",
        "SM_CHANGE",
        "SRQ_ERR",
        "SRQ_LIMIT_REACHED",
        "QP_LAST_WQE_REACHED",
        "CLIENT_REREGISTER",
        "GID_CHANGE",
        "WQ_FATAL",
    ];
    NAMES.get(t as usize).copied().unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_follow_the_verbs_enum_and_an_unknown_type_is_named_so() {
        assert_eq!(event_name(10), "PORT_ERR");
        assert_eq!(event_name(9), "PORT_ACTIVE");
        assert_eq!(event_name(1), "QP_FATAL");
        assert_eq!(event_name(99), "UNKNOWN");
        assert_eq!(
            std::mem::size_of::<RawAsyncEvent>(),
            std::mem::size_of::<sys::ibv_async_event>()
        );
    }

    #[test]
    fn watching_a_device_that_is_not_there_is_an_error_not_a_hang() {
        let e = PortEvents::watch("no-such-device-0")
            .err()
            .expect("no such device");
        assert!(
            e.to_string().contains("no-such-device-0") || e.to_string().contains("no RDMA devices"),
            "{e}"
        );
    }
}
