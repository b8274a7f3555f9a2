//! `/configz`: the running configuration, as the kubelet's `configz` handler serves it
//! (`{"kubeletconfig": {...}}`, a v1beta1 KubeletConfiguration, JSON). The document is
//! made once at start-up from the merged defaults, file and flags
//! ([`crate::kubeletconfig::running`]); this module only wraps and serves it.

use hyper::Response;
use serde_json::{Value, json};

use super::{Body, json as json_response};

/// The body of `/configz`, made once.
#[derive(Debug, Clone)]
pub struct Configz(Value);

impl Configz {
    /// Wraps `configuration` under the kubelet's component name.
    #[must_use]
    pub fn new(configuration: Value) -> Self {
        Self(json!({ "kubeletconfig": configuration }))
    }

    /// The response.
    pub fn serve(&self) -> Response<Body> {
        json_response(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_configuration_is_under_kubeletconfig() {
        let response = Configz::new(json!({"maxPods": 12})).serve();
        assert_eq!(
            response.headers()["content-type"],
            "application/json",
            "JSON as the kubelet's"
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let value: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value, json!({"kubeletconfig": {"maxPods": 12}}));
    }
}
