#![no_main]
//! See `rkubelet::fuzzing::kubelet_api_request`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::kubelet_api_request(data));
