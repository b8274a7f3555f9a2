#![no_main]
//! See `rkubelet::fuzzing::image_reference`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::image_reference(data));
