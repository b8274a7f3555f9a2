//! The runtime's health as the kubelet reads it from CRI `Status`: RuntimeReady and
//! NetworkReady, each with the runtime's reason and message when false.

use super::api::{RuntimeCondition, StatusResponse};
use super::{NETWORK_READY, RUNTIME_READY};

/// One runtime condition, normalised: a missing condition counts as not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `RuntimeReady` or `NetworkReady`.
    pub kind: &'static str,
    /// Whether the condition holds.
    pub ready: bool,
    /// The runtime's reason when not ready.
    pub reason: String,
    /// The runtime's message when not ready.
    pub message: String,
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.kind, self.ready)?;
        if !self.ready {
            write!(f, " reason={:?} message={:?}", self.reason, self.message)?;
        }
        Ok(())
    }
}

/// RuntimeReady and NetworkReady from a `Status` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeHealth {
    /// Can the runtime run containers?
    pub runtime: Condition,
    /// Is pod networking ready?
    pub network: Condition,
}

impl RuntimeHealth {
    /// Both conditions hold.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.runtime.ready && self.network.ready
    }
}

fn condition(conditions: &[RuntimeCondition], kind: &'static str) -> Condition {
    conditions.iter().find(|c| c.r#type == kind).map_or_else(
        || Condition {
            kind,
            ready: false,
            reason: "ConditionMissing".into(),
            message: format!("the runtime did not report {kind}"),
        },
        |c| Condition {
            kind,
            ready: c.status,
            reason: c.reason.clone(),
            message: c.message.clone(),
        },
    )
}

impl From<&StatusResponse> for RuntimeHealth {
    fn from(resp: &StatusResponse) -> Self {
        let conditions = resp.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        Self {
            runtime: condition(conditions, RUNTIME_READY),
            network: condition(conditions, NETWORK_READY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::api::RuntimeStatus;
    use super::*;

    fn cond(kind: &str, status: bool, reason: &str) -> RuntimeCondition {
        RuntimeCondition {
            r#type: kind.into(),
            status,
            reason: reason.into(),
            message: format!("{reason} message"),
        }
    }

    #[test]
    fn reads_both_conditions() {
        let resp = StatusResponse {
            status: Some(RuntimeStatus {
                conditions: vec![
                    cond(RUNTIME_READY, true, ""),
                    cond(NETWORK_READY, false, "NetworkPluginNotReady"),
                ],
            }),
            info: Default::default(),
        };
        let health = RuntimeHealth::from(&resp);
        assert!(health.runtime.ready);
        assert!(!health.network.ready);
        assert!(!health.ready());
        assert_eq!(health.network.reason, "NetworkPluginNotReady");
        assert_eq!(
            health.network.to_string(),
            "NetworkReady=false reason=\"NetworkPluginNotReady\" message=\"NetworkPluginNotReady message\""
        );
        assert_eq!(health.runtime.to_string(), "RuntimeReady=true");
    }

    #[test]
    fn a_missing_condition_is_not_ready() {
        let health = RuntimeHealth::from(&StatusResponse::default());
        assert!(!health.runtime.ready);
        assert_eq!(health.runtime.reason, "ConditionMissing");
        assert!(!health.ready());
    }
}
