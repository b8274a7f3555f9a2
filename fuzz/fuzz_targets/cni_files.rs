#![no_main]
//! See `rkubelet::fuzzing::cni_files`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::cni_files(data));
