//! The client side of certificate rotation, as the kubelet's `certificate/transport.go`:
//! the API client presents whatever certificate is current at each TLS handshake
//! ([`ClientIdentity`], a rustls client certificate resolver), and when the certificate
//! changes every connection made before is closed ([`ClosingConnector`]), so that the
//! next requests and watches reconnect with the new one.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::{Connected, Connection};
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::ServingCertificate;

/// The client certificate in use, swapped on rotation.
pub struct ClientIdentity {
    current: RwLock<Generation>,
}

/// One certificate, and the token that closes the connections made with it.
struct Generation {
    key: Arc<CertifiedKey>,
    closed: CancellationToken,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity").finish_non_exhaustive()
    }
}

impl ClientIdentity {
    /// An identity presenting `cert`.
    #[must_use]
    pub fn new(cert: &ServingCertificate) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Generation {
                key: cert.key.clone(),
                closed: CancellationToken::new(),
            }),
        })
    }

    /// Presents `cert` from the next handshake on, and closes every connection made
    /// with the certificate before.
    pub fn set(&self, cert: &ServingCertificate) {
        let old = std::mem::replace(
            &mut *crate::lock::write(&self.current),
            Generation {
                key: cert.key.clone(),
                closed: CancellationToken::new(),
            },
        );
        tracing::info!("client certificate rotated: closing the connections made with the old one");
        old.closed.cancel();
    }

    /// The token cancelled when the current certificate is replaced.
    fn generation(&self) -> CancellationToken {
        crate::lock::read(&self.current).closed.clone()
    }
}

impl ResolvesClientCert for ClientIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(crate::lock::read(&self.current).key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A connector whose connections end when the client certificate is replaced (never,
/// without an identity).
#[derive(Debug, Clone)]
pub struct ClosingConnector<C> {
    inner: C,
    identity: Option<Arc<ClientIdentity>>,
}

impl<C> ClosingConnector<C> {
    /// Wraps `inner`.
    pub fn new(inner: C, identity: Option<Arc<ClientIdentity>>) -> Self {
        Self { inner, identity }
    }
}

impl<C> tower::Service<hyper::Uri> for ClosingConnector<C>
where
    C: tower::Service<hyper::Uri>,
    C::Future: Send + 'static,
{
    type Response = Closable<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, C::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: hyper::Uri) -> Self::Future {
        let closed = self
            .identity
            .as_ref()
            .map(|i| Box::pin(i.generation().cancelled_owned()));
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            Ok(Closable {
                inner: connecting.await?,
                closed,
            })
        })
    }
}

/// A connection that reads as ended, and refuses writes, once its certificate is
/// replaced.
pub struct Closable<T> {
    inner: T,
    closed: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
}

impl<T> Closable<T> {
    fn is_closed(&mut self, cx: &mut Context<'_>) -> bool {
        self.closed
            .as_mut()
            .is_some_and(|c| c.as_mut().poll(cx).is_ready())
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for Closable<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.is_closed(cx) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

fn rotated() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "connection closed: the client certificate was rotated",
    )
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Closable<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.is_closed(cx) {
            return Poll::Ready(Err(rotated()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for Closable<T> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{self, testing::ca_and_leaf};
    use std::path::Path;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn cert(cn: &str) -> (String, ServingCertificate) {
        let (ca, cert, key) = ca_and_leaf(cn, &["system:nodes"]);
        let c = tls::serving_certificate(cert.as_bytes(), key.as_bytes(), Path::new(cn)).unwrap();
        (ca, c)
    }

    #[test]
    fn the_resolver_presents_the_current_certificate() {
        let (_, a) = cert("a");
        let (_, b) = cert("b");
        let identity = ClientIdentity::new(&a);
        let first = identity.resolve(&[], &[]).unwrap();
        assert!(Arc::ptr_eq(&first, &a.key));
        let before = identity.generation();
        identity.set(&b);
        assert!(
            before.is_cancelled(),
            "the old generation's connections close"
        );
        assert!(!identity.generation().is_cancelled());
        assert!(Arc::ptr_eq(&identity.resolve(&[], &[]).unwrap(), &b.key));
    }

    /// An idle pooled connection made before a rotation reads as ended; one made after
    /// does not.
    #[tokio::test]
    async fn a_rotation_ends_the_connections_made_before_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
        let (_, a) = cert("a");
        let identity = ClientIdentity::new(&a);
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        let mut connector = ClosingConnector::new(http, Some(identity.clone()));
        let uri: hyper::Uri = format!("http://{addr}").parse().unwrap();
        let old = tower::ServiceExt::oneshot(connector.clone(), uri.clone())
            .await
            .unwrap();
        identity.set(&cert("b").1);
        let new = tower::Service::call(&mut connector, uri).await.unwrap();
        let mut old = hyper_util::rt::TokioIo::new(old);
        let mut new = hyper_util::rt::TokioIo::new(new);
        let mut buf = [0u8; 8];
        let n = tokio::time::timeout(Duration::from_secs(5), old.read(&mut buf))
            .await
            .expect("the old connection ends at once")
            .unwrap();
        assert_eq!(n, 0);
        assert!(old.write_all(b"x").await.is_err());
        new.write_all(b"x").await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(200), new.read(&mut buf)).await;
        assert!(silent.is_err(), "the new connection stays open");
    }
}
