#![no_main]
//! See `rkubelet::fuzzing::device_plugin`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::device_plugin(data));
