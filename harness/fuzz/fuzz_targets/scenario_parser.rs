//! Any text as a scenario file: parsed and checked, or refused with a located error; never a
//! panic, whatever the YAML, the step parameters, the durations or the bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let path = std::path::Path::new("fuzz.yaml");
    if let Ok(loaded) = wringer::rank::steps::parse(path, text) {
        // What a run derives before it starts must hold too.
        let _ = loaded.faults();
        let _ = wringer::rank::steps::preflight(&loaded.steps());
    }
});
