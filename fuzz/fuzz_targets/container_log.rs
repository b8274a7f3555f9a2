#![no_main]
//! See `rkubelet::fuzzing::container_log`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::container_log(data));
