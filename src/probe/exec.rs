//! The exec probe: runs a command in a container through the runtime's `ExecSync`, with the
//! probe's timeout. Exit code 0 is success, any other is failure; the output (stdout then
//! stderr, capped) is kept for the kubelet's event messages.

use std::time::Duration;

use super::{Outcome, ProbeResult, capped_text};
use crate::cri::{Cri, api};

/// Runs `cmd` in the container `container_id` and judges its exit code. A runtime error
/// (including a timed-out command) is [`ProbeResult::Unknown`] with the error as output,
/// which the prober reports as "probe errored", as the kubelet does.
pub async fn run<C: Cri>(
    cri: &C,
    container_id: &str,
    cmd: &[String],
    timeout: Duration,
) -> Outcome {
    let request = api::ExecSyncRequest {
        container_id: container_id.to_owned(),
        cmd: cmd.to_vec(),
        timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
    };
    match cri.exec_sync(request).await {
        Ok(response) => {
            let mut data = response.stdout;
            data.extend_from_slice(&response.stderr);
            let result = if response.exit_code == 0 {
                ProbeResult::Success
            } else {
                ProbeResult::Failure
            };
            Outcome::new(result, capped_text(&data))
        }
        Err(error) => Outcome::new(ProbeResult::Unknown, error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{CriError, Result};
    use std::sync::Mutex;

    /// Answers a fixed exit code and output, and records the request.
    struct FakeExec {
        exit_code: i32,
        fail: bool,
        seen: Mutex<Option<api::ExecSyncRequest>>,
    }

    impl Cri for FakeExec {
        async fn exec_sync(&self, req: api::ExecSyncRequest) -> Result<api::ExecSyncResponse> {
            *self.seen.lock().expect("lock") = Some(req);
            if self.fail {
                return Err(CriError::Timeout {
                    rpc: "ExecSync",
                    after: Duration::from_secs(1),
                });
            }
            Ok(api::ExecSyncResponse {
                stdout: b"out ".to_vec(),
                stderr: vec![b'e'; 20_000],
                exit_code: self.exit_code,
            })
        }
    }

    fn fake(exit_code: i32, fail: bool) -> FakeExec {
        FakeExec {
            exit_code,
            fail,
            seen: Mutex::new(None),
        }
    }

    #[tokio::test]
    async fn exit_zero_is_success_and_the_request_carries_command_and_timeout() {
        let cri = fake(0, false);
        let cmd = vec!["cat".to_owned(), "/tmp/ready".to_owned()];
        let outcome = run(&cri, "c1", &cmd, Duration::from_secs(3)).await;
        assert_eq!(outcome.result, ProbeResult::Success);
        assert!(outcome.output.starts_with("out e"));
        assert_eq!(outcome.output.len(), super::super::MAX_OUTPUT);
        let seen = cri.seen.lock().expect("lock").clone().expect("request");
        assert_eq!(seen.container_id, "c1");
        assert_eq!(seen.cmd, cmd);
        assert_eq!(seen.timeout, 3);
    }

    #[tokio::test]
    async fn a_non_zero_exit_is_failure_and_a_runtime_error_unknown() {
        let failed = run(&fake(1, false), "c1", &[], Duration::from_secs(1)).await;
        assert_eq!(failed.result, ProbeResult::Failure);
        let errored = run(&fake(0, true), "c1", &[], Duration::from_secs(1)).await;
        assert_eq!(errored.result, ProbeResult::Unknown);
        assert!(errored.output.contains("ExecSync"), "{}", errored.output);
    }
}
