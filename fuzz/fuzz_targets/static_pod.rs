#![no_main]
//! See `rkubelet::fuzzing::static_pod`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::static_pod(data));
