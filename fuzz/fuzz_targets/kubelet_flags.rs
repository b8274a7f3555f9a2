#![no_main]
//! See `rkubelet::fuzzing::kubelet_flags`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::kubelet_flags(data));
