//! The exec probe: runs a command in a container through the runtime's `ExecSync`, with the
//! probe's timeout. Exit code 0 is success, any other is failure; the output (stdout then
//! stderr, capped) is kept for the kubelet's event messages. As in the kubelet v1.20 with
//! `ExecProbeTimeout` (on by default), a command that outlives its timeout is a failure
//! with no output; any other runtime error (containerd answers one for a command that
//! does not exist) is unknown, which the prober reports as "probe errored" and skips.

use std::time::Duration;

use super::{Outcome, ProbeResult, capped_text};
use crate::cri::{Cri, CriError, api};

/// Runs `cmd` in the container `container_id` and judges its exit code. A deadline
/// exceeded (the runtime's or the call's) is [`ProbeResult::Failure`] with no output; any
/// other runtime error is [`ProbeResult::Unknown`] with the error as grpc-go prints it
/// (`rpc error: code = ... desc = ...`), the text of the kubelet's "probe errored" event.
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
        Err(error) if timed_out(&error) => Outcome::new(ProbeResult::Failure, String::new()),
        Err(error) => Outcome::new(ProbeResult::Unknown, error.grpc_error()),
    }
}

/// Whether the runtime or the call gave up on the command's deadline (the kubelet's
/// remote runtime turns `DeadlineExceeded` into an exec timeout error).
fn timed_out(error: &CriError) -> bool {
    matches!(error, CriError::Timeout { .. }) || error.code() == Some(tonic::Code::DeadlineExceeded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::Result;
    use std::sync::Mutex;

    /// Answers a fixed exit code and output (or the error `fail` makes), and records the
    /// request.
    struct FakeExec {
        exit_code: i32,
        fail: Option<fn() -> CriError>,
        seen: Mutex<Option<api::ExecSyncRequest>>,
    }

    impl Cri for FakeExec {
        async fn exec_sync(&self, req: api::ExecSyncRequest) -> Result<api::ExecSyncResponse> {
            *self.seen.lock().expect("lock") = Some(req);
            if let Some(fail) = self.fail {
                return Err(fail());
            }
            Ok(api::ExecSyncResponse {
                stdout: b"out ".to_vec(),
                stderr: vec![b'e'; 20_000],
                exit_code: self.exit_code,
            })
        }
    }

    fn fake(exit_code: i32, fail: Option<fn() -> CriError>) -> FakeExec {
        FakeExec {
            exit_code,
            fail,
            seen: Mutex::new(None),
        }
    }

    fn rpc(code: tonic::Code, message: &str) -> CriError {
        CriError::Rpc {
            rpc: "ExecSync",
            code,
            message: message.to_owned(),
        }
    }

    async fn outcome(exit_code: i32, fail: Option<fn() -> CriError>) -> Outcome {
        run(&fake(exit_code, fail), "c1", &[], Duration::from_secs(1)).await
    }

    #[tokio::test]
    async fn exit_zero_is_success_and_the_request_carries_command_and_timeout() {
        let cri = fake(0, None);
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
    async fn a_non_zero_exit_is_failure_with_the_output() {
        let failed = outcome(127, None).await;
        assert_eq!(failed.result, ProbeResult::Failure);
        assert!(failed.output.starts_with("out e"), "{}", failed.output);
    }

    #[tokio::test]
    async fn a_runtime_error_is_unknown_with_the_grpc_error_as_output() {
        // What containerd 1.6 answers for a command that does not exist.
        let missing = || {
            rpc(
                tonic::Code::Unknown,
                "failed to exec in container: failed to start exec \"x\": OCI runtime exec failed: exec failed: unable to start container process: exec: \"/nope\": stat /nope: no such file or directory: unknown",
            )
        };
        let errored = outcome(0, Some(missing)).await;
        assert_eq!(errored.result, ProbeResult::Unknown);
        assert!(
            errored
                .output
                .starts_with("rpc error: code = Unknown desc = failed to exec in container: "),
            "{}",
            errored.output
        );
        assert!(
            errored
                .output
                .ends_with("stat /nope: no such file or directory: unknown")
        );
    }

    #[tokio::test]
    async fn a_deadline_exceeded_by_the_runtime_or_the_call_is_failure_without_output() {
        let runtime = || {
            rpc(
                tonic::Code::DeadlineExceeded,
                "failed to exec in container: timeout 1s exceeded: context deadline exceeded",
            )
        };
        let call = || CriError::Timeout {
            rpc: "ExecSync",
            after: Duration::from_secs(121),
        };
        for fail in [runtime as fn() -> CriError, call] {
            assert_eq!(
                outcome(0, Some(fail)).await,
                Outcome::new(ProbeResult::Failure, "")
            );
        }
    }
}
