//! [`SystemdBus`] over D-Bus with zbus: the connection to systemd over the system bus, its
//! version, and the manager calls with their jobs followed to the end as go-systemd does:
//! the `JobRemoved` signals are listened to before the call, and the one of the job the
//! call returned gives the result.
//!
//! Not systemd's private socket `/run/systemd/private`, which runc tries first as root:
//! on that direct connection systemd sends its messages with the well-known name
//! `org.freedesktop.systemd1` as their sender, which zbus refuses ("Invalid unique name")
//! and then drops the connection (seen on a kind-style node, systemd 252). The system bus
//! (dbus-daemon or dbus-broker) is on every systemd node kubeadm and kind set up.

use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use zbus::connection::Builder;
use zbus::message::Type as MessageType;
use zbus::{Connection, MatchRule, Message, MessageStream, OwnedObjectPath, OwnedVariant, Variant};

use super::{JobResult, Property, PropertyValue, SystemdBus, SystemdError};

/// systemd's bus name.
const DESTINATION: &str = "org.freedesktop.systemd1";
/// The manager object.
const PATH: &str = "/org/freedesktop/systemd1";
/// The manager interface.
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// What exists when the host was booted with systemd (`sd_booted`).
pub const BOOTED: &str = "/run/systemd/system";
/// How long a call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a job is waited for before the work goes on without its result.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(30);

/// The connection to systemd's manager.
#[derive(Debug, Clone)]
pub struct ZbusSystemd {
    conn: Connection,
    version: Option<u32>,
    job_timeout: Duration,
}

/// The number a systemd version starts with: `252`, `v245.4-1.fc32`, `"252.22-1~deb12u1"`.
#[must_use]
pub fn parse_version(version: &str) -> Option<u32> {
    let rest = version.trim_start_matches('"').trim_start_matches('v');
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn bus_error(method: &'static str, unit: &str, e: &zbus::Error) -> SystemdError {
    match e {
        zbus::Error::MethodError(name, message, _) => SystemdError::Refused {
            method,
            unit: unit.to_owned(),
            name: name.to_string(),
            message: message.clone().unwrap_or_default(),
        },
        other => SystemdError::Bus {
            method,
            unit: unit.to_owned(),
            message: other.to_string(),
        },
    }
}

fn variant(value: &PropertyValue) -> Variant<'static> {
    match value {
        PropertyValue::Str(s) => Variant::from(s.clone()),
        PropertyValue::Bool(b) => Variant::from(*b),
        PropertyValue::U64(n) => Variant::from(*n),
        PropertyValue::Strs(list) => Variant::from(list.clone()),
        PropertyValue::Pairs(pairs) => Variant::from(pairs.clone()),
    }
}

/// Properties as `a(sv)`.
fn encode(properties: &[Property]) -> Vec<(&'static str, Variant<'static>)> {
    properties
        .iter()
        .map(|p| (p.name, variant(&p.value)))
        .collect()
}

impl ZbusSystemd {
    /// Connects to systemd over the system bus; reads its version.
    ///
    /// # Errors
    /// [`SystemdError::NotRunning`] on a host not booted with systemd; a connection that
    /// cannot be made (no system bus).
    pub async fn connect() -> Result<Self, SystemdError> {
        let booted = tokio::fs::symlink_metadata(BOOTED)
            .await
            .is_ok_and(|m| m.is_dir());
        if !booted {
            return Err(SystemdError::NotRunning);
        }
        let conn = Builder::system()
            .method_timeout(CALL_TIMEOUT)
            .build()
            .await
            .map_err(|e| SystemdError::Connect {
                tried: "the D-Bus system bus".into(),
                message: e.to_string(),
            })?;
        tracing::info!("connected to systemd over the system bus");
        Ok(Self::over(conn).await)
    }

    /// systemd over an established connection; its version is read.
    pub async fn over(conn: Connection) -> Self {
        let mut bus = Self {
            conn,
            version: None,
            job_timeout: JOB_TIMEOUT,
        };
        match bus.read_version().await {
            Ok(v) => {
                tracing::info!(version = %v, "systemd");
                bus.version = parse_version(&v);
            }
            Err(e) => tracing::warn!(error = %e, "cannot read systemd's version"),
        }
        bus
    }

    /// The same, waiting this long for jobs.
    #[must_use]
    pub fn with_job_timeout(mut self, timeout: Duration) -> Self {
        self.job_timeout = timeout;
        self
    }

    async fn read_version(&self) -> Result<String, SystemdError> {
        let reply = self
            .conn
            .call_method(
                Some(DESTINATION),
                PATH,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(MANAGER, "Version"),
            )
            .await
            .map_err(|e| bus_error("Get", "Version", &e))?;
        let value: OwnedVariant = reply
            .body()
            .deserialize()
            .map_err(|e| bus_error("Get", "Version", &e))?;
        String::try_from(value).map_err(|e| bus_error("Get", "Version", &e))
    }

    async fn call<B>(
        &self,
        method: &'static str,
        unit: &str,
        body: &B,
    ) -> Result<Message, SystemdError>
    where
        B: serde::Serialize + zbus::DynamicType,
    {
        self.conn
            .call_method(Some(DESTINATION), PATH, Some(MANAGER), method, body)
            .await
            .map_err(|e| bus_error(method, unit, &e))
    }

    /// A call that queues a job, and the job's end.
    async fn job<B>(
        &self,
        method: &'static str,
        unit: &str,
        body: &B,
    ) -> Result<JobResult, SystemdError>
    where
        B: serde::Serialize + zbus::DynamicType,
    {
        // Listening before the call: the job may end before its reply is read.
        let rule = MatchRule::builder()
            .msg_type(MessageType::Signal)
            .path(PATH)
            .interface(MANAGER)
            .member("JobRemoved")
            .build()
            .map_err(|e| bus_error(method, unit, &e))?;
        let mut removed = MessageStream::for_match_rule(rule, &self.conn, None)
            .await
            .map_err(|e| bus_error(method, unit, &e))?;
        let reply = self.call(method, unit, body).await?;
        let job: OwnedObjectPath = reply
            .body()
            .deserialize()
            .map_err(|e| bus_error(method, unit, &e))?;
        tracing::debug!(method, unit, job = %job.as_str(), "systemd job queued");
        let wait = async {
            while let Some(signal) = removed.next().await {
                let Ok(signal) = signal else { continue };
                let Ok((_, path, _, result)) = signal
                    .body()
                    .deserialize::<(u32, OwnedObjectPath, String, String)>()
                else {
                    continue;
                };
                if path == job {
                    return Ok(JobResult::from_signal(&result));
                }
            }
            Err(SystemdError::Bus {
                method,
                unit: unit.to_owned(),
                message: "the connection to systemd closed before the job ended".into(),
            })
        };
        match tokio::time::timeout(self.job_timeout, wait).await {
            Ok(result) => result,
            Err(_) => Ok(JobResult::TimedOut),
        }
    }
}

impl SystemdBus for ZbusSystemd {
    fn version(&self) -> Option<u32> {
        self.version
    }

    fn start_transient_unit<'a>(
        &'a self,
        unit: &'a str,
        properties: &'a [Property],
    ) -> BoxFuture<'a, Result<JobResult, SystemdError>> {
        // No auxiliary units: a(sa(sv)) empty.
        let aux: Vec<(&str, Vec<(&str, Variant<'static>)>)> = Vec::new();
        Box::pin(async move {
            self.job(
                "StartTransientUnit",
                unit,
                &(unit, "replace", encode(properties), aux),
            )
            .await
        })
    }

    fn set_unit_properties<'a>(
        &'a self,
        unit: &'a str,
        properties: &'a [Property],
    ) -> BoxFuture<'a, Result<(), SystemdError>> {
        Box::pin(async move {
            self.call("SetUnitProperties", unit, &(unit, true, encode(properties)))
                .await
                .map(drop)
        })
    }

    fn stop_unit<'a>(&'a self, unit: &'a str) -> BoxFuture<'a, Result<JobResult, SystemdError>> {
        Box::pin(async move { self.job("StopUnit", unit, &(unit, "replace")).await })
    }

    fn reset_failed_unit<'a>(&'a self, unit: &'a str) -> BoxFuture<'a, Result<(), SystemdError>> {
        Box::pin(async move { self.call("ResetFailedUnit", unit, &unit).await.map(drop) })
    }
}

#[cfg(test)]
mod tests {
    //! Against a fake systemd manager on the other end of a socket pair (a peer-to-peer
    //! D-Bus connection, as systemd's private socket is).

    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::cm::systemd::{NO_SUCH_UNIT, UNIT_EXISTS};

    /// A method call the fake got: its member and its arguments.
    #[derive(Debug, Clone, PartialEq)]
    enum Got {
        Start(String, String, Vec<(String, OwnedVariant)>, usize),
        Set(String, bool, Vec<(String, OwnedVariant)>),
        Stop(String, String),
        Reset(String),
    }

    /// How the fake answers a job: the result of its `JobRemoved`, sent before the reply
    /// (the race go-systemd guards against) or after it, or no signal at all.
    #[derive(Debug, Clone, Copy)]
    enum Ends {
        Before(&'static str),
        After(&'static str),
        Never,
    }

    async fn pair(ends: Ends) -> (ZbusSystemd, Arc<Mutex<Vec<Got>>>) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let guid = zbus::Guid::generate();
        let (server, client) = tokio::join!(
            Builder::unix_stream(a).server(guid).p2p().build(),
            Builder::unix_stream(b).p2p().build(),
        );
        let (server, client) = (server.unwrap(), client.unwrap());
        let got = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(serve(server, got.clone(), ends));
        let bus = ZbusSystemd::over(client)
            .await
            .with_job_timeout(Duration::from_millis(300));
        (bus, got)
    }

    async fn job_removed(conn: &Connection, id: u32, job: &str, unit: &str, result: &str) {
        let job = zbus::ObjectPath::try_from(job).unwrap();
        conn.emit_signal(
            None::<&str>,
            PATH,
            MANAGER,
            "JobRemoved",
            &(id, job, unit, result),
        )
        .await
        .unwrap();
    }

    async fn serve(conn: Connection, got: Arc<Mutex<Vec<Got>>>, ends: Ends) {
        let mut calls = MessageStream::from(&conn);
        let mut id = 40;
        while let Some(Ok(msg)) = calls.next().await {
            let header = msg.header();
            if header.message_type() != MessageType::MethodCall {
                continue;
            }
            let member = header.member().map(|m| m.to_string()).unwrap_or_default();
            let body = msg.body();
            match member.as_str() {
                "Get" => {
                    let (iface, name): (String, String) = body.deserialize().unwrap();
                    assert_eq!((iface.as_str(), name.as_str()), (MANAGER, "Version"));
                    conn.reply(&header, &Variant::from("252.22-1~deb12u1"))
                        .await
                        .unwrap();
                }
                "StartTransientUnit" | "StopUnit" => {
                    let unit = if member == "StopUnit" {
                        let (unit, mode): (String, String) = body.deserialize().unwrap();
                        got.lock().unwrap().push(Got::Stop(unit.clone(), mode));
                        unit
                    } else {
                        type Aux = Vec<(String, Vec<(String, OwnedVariant)>)>;
                        let (unit, mode, props, aux): (
                            String,
                            String,
                            Vec<(String, OwnedVariant)>,
                            Aux,
                        ) = body.deserialize().unwrap();
                        if unit == "exists.slice" {
                            conn.reply_error(
                                &header,
                                UNIT_EXISTS,
                                &"Unit exists.slice already exists.",
                            )
                            .await
                            .unwrap();
                            continue;
                        }
                        got.lock()
                            .unwrap()
                            .push(Got::Start(unit.clone(), mode, props, aux.len()));
                        unit
                    };
                    id += 1;
                    let job = format!("/org/freedesktop/systemd1/job/{id}");
                    // Another client's job first: not ours.
                    job_removed(
                        &conn,
                        7,
                        "/org/freedesktop/systemd1/job/7",
                        "other.slice",
                        "failed",
                    )
                    .await;
                    if let Ends::Before(result) = ends {
                        job_removed(&conn, id, &job, &unit, result).await;
                    }
                    let path = zbus::ObjectPath::try_from(job.as_str()).unwrap();
                    conn.reply(&header, &path).await.unwrap();
                    if let Ends::After(result) = ends {
                        job_removed(&conn, id, &job, &unit, result).await;
                    }
                }
                "SetUnitProperties" => {
                    let (unit, runtime, props): (String, bool, Vec<(String, OwnedVariant)>) =
                        body.deserialize().unwrap();
                    if unit == "gone.slice" {
                        conn.reply_error(&header, NO_SUCH_UNIT, &"Unit gone.slice not loaded.")
                            .await
                            .unwrap();
                        continue;
                    }
                    got.lock().unwrap().push(Got::Set(unit, runtime, props));
                    conn.reply(&header, &()).await.unwrap();
                }
                "ResetFailedUnit" => {
                    let unit: String = body.deserialize().unwrap();
                    got.lock().unwrap().push(Got::Reset(unit));
                    conn.reply(&header, &()).await.unwrap();
                }
                other => panic!("unexpected call {other}"),
            }
        }
    }

    fn props() -> Vec<Property> {
        use PropertyValue::{Bool, Pairs, Str, Strs, U64};
        vec![
            Property {
                name: "Description",
                value: Str("libcontainer container kubepods.slice".into()),
            },
            Property {
                name: "Wants",
                value: Strs(vec!["-.slice".into()]),
            },
            Property {
                name: "DefaultDependencies",
                value: Bool(false),
            },
            Property {
                name: "DeviceAllow",
                value: Pairs(vec![]),
            },
            Property {
                name: "CPUShares",
                value: U64(2048),
            },
        ]
    }

    #[test]
    fn versions_parse_as_runc_reads_them() {
        assert_eq!(parse_version("252.22-1~deb12u1"), Some(252));
        assert_eq!(parse_version("\"v245.4-1.fc32\""), Some(245));
        assert_eq!(parse_version("245"), Some(245));
        assert_eq!(parse_version("unknown"), None);
    }

    #[tokio::test]
    async fn start_sends_the_properties_and_waits_for_its_job() {
        for ends in [Ends::After("done"), Ends::Before("done")] {
            let (bus, got) = pair(ends).await;
            assert_eq!(bus.version(), Some(252));
            let result = bus
                .start_transient_unit("kubepods.slice", &props())
                .await
                .unwrap();
            assert_eq!(result, JobResult::Done, "{ends:?}");
            let got = got.lock().unwrap().clone();
            let [Got::Start(unit, mode, props, aux)] = &got[..] else {
                panic!("{got:?}")
            };
            assert_eq!(
                (unit.as_str(), mode.as_str(), *aux),
                ("kubepods.slice", "replace", 0)
            );
            let sig: Vec<(&str, String)> = props
                .iter()
                .map(|(n, v)| (n.as_str(), v.value_signature().to_string()))
                .collect();
            assert_eq!(
                sig,
                [
                    ("Description", "s".into()),
                    ("Wants", "as".into()),
                    ("DefaultDependencies", "b".into()),
                    ("DeviceAllow", "a(ss)".into()),
                    ("CPUShares", "t".into()),
                ]
            );
            assert_eq!(
                u64::try_from(props[4].1.try_clone().unwrap()).unwrap(),
                2048
            );
            let wants: Vec<String> = Vec::try_from(props[1].1.try_clone().unwrap()).unwrap();
            assert_eq!(wants, ["-.slice"]);
        }
    }

    #[tokio::test]
    async fn failed_and_unfinished_jobs_and_refusals_are_told_apart() {
        let (bus, _) = pair(Ends::After("failed")).await;
        assert_eq!(
            bus.stop_unit("kubepods-podx.slice").await.unwrap(),
            JobResult::Failed("failed".into())
        );
        let err = bus
            .start_transient_unit("exists.slice", &props())
            .await
            .unwrap_err();
        assert!(err.is(UNIT_EXISTS), "{err}");

        let (bus, got) = pair(Ends::Never).await;
        assert_eq!(
            bus.stop_unit("kubepods-podx.slice").await.unwrap(),
            JobResult::TimedOut
        );
        assert_eq!(
            got.lock().unwrap()[..],
            [Got::Stop("kubepods-podx.slice".into(), "replace".into())]
        );
    }

    #[tokio::test]
    async fn set_and_reset_are_plain_calls() {
        let (bus, got) = pair(Ends::After("done")).await;
        bus.set_unit_properties("kubepods-burstable.slice", &props()[4..])
            .await
            .unwrap();
        bus.reset_failed_unit("kubepods-podf.slice").await.unwrap();
        let err = bus
            .set_unit_properties("gone.slice", &props())
            .await
            .unwrap_err();
        assert!(err.is(NO_SUCH_UNIT), "{err}");
        let got = got.lock().unwrap().clone();
        let [Got::Set(unit, runtime, props), Got::Reset(reset)] = &got[..] else {
            panic!("{got:?}")
        };
        assert_eq!(
            (unit.as_str(), *runtime, props.len()),
            ("kubepods-burstable.slice", true, 1)
        );
        assert_eq!(reset, "kubepods-podf.slice");
    }
}
