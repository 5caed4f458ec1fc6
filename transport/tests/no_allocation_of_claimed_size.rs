//! A header's claimed length must never turn into an allocation of that size: not when it is
//! over the limit (rejected before allocating), and not when it is legal but the peer sends
//! little (the payload buffer grows with the data that actually arrives).
//!
//! Its own test binary, because it installs a global allocator that records the largest request.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use wringer_transport::frame::{Decoder, FrameError, Header, Kind};

struct Recording;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Recording = Recording;

const GIB: u32 = 1 << 30;

#[test]
fn claimed_sizes_are_never_allocated() {
    // Over the limit: a typed error, before anything is allocated for it.
    let huge = Header {
        kind: Kind::Data,
        flags: 0,
        sequence: 0,
        len: 3 * GIB,
    }
    .encode();
    let mut d = Decoder::new(16 << 20);
    LARGEST.store(0, Ordering::Relaxed);
    assert_eq!(
        d.feed(&huge),
        Err(FrameError::TooLong {
            len: 3 * GIB,
            max: 16 << 20
        })
    );
    assert!(
        LARGEST.load(Ordering::Relaxed) < 4096,
        "allocated {} bytes",
        LARGEST.load(Ordering::Relaxed)
    );

    // Within a (very permissive) limit, but the peer sends only 100 bytes of the 4 GiB it claims.
    let claim = Header {
        kind: Kind::Data,
        flags: 0,
        sequence: 0,
        len: u32::MAX,
    }
    .encode();
    let mut d = Decoder::new(u32::MAX);
    LARGEST.store(0, Ordering::Relaxed);
    assert_eq!(d.feed(&claim).unwrap(), (20, None));
    assert_eq!(d.feed(&[0; 100]).unwrap(), (100, None));
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= 1 << 20,
        "allocated {largest} bytes for 100 received"
    );
}
