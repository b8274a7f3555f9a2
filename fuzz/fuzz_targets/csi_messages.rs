#![no_main]
//! See `rkubelet::fuzzing::csi_messages`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::csi_messages(data));
