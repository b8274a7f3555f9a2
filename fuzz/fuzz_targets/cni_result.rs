#![no_main]
//! See `rkubelet::fuzzing::cni_result`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::cni_result(data));
