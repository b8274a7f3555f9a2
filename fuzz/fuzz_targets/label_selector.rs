#![no_main]
//! See `rkubelet::fuzzing::label_selector`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::label_selector(data));
