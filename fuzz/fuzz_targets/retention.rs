#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vynil_fuzzing::retention::run(data));
