#![no_main]
//! See `rkubelet::fuzzing::cgroup_files`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rkubelet::fuzzing::cgroup_files(data));
