//! Any text as a host profile: parsed and checked, or refused with a located error; never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = wringer::hosts::profile::parse(std::path::Path::new("hosts/fuzz.yaml"), text);
});
