#![no_main]
//! See `rkubelet::fuzzing::proc_files`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::proc_files(data));
