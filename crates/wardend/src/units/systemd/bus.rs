//! The D-Bus side of the systemd backend: hand-written zbus proxies of the few
//! `org.freedesktop.systemd1` methods warden uses, the connection (system bus or systemd's
//! private socket), signal streams, and the mapping of zbus errors.
//!
//! Signals are received with [`MessageStream::for_match_rule`] rather than the proxies'
//! `receive_*` streams: on a peer-to-peer connection those streams ask the (absent) bus daemon
//! for the owner of `org.freedesktop.systemd1`, and systemd's signals carry no sender there.

use std::collections::HashMap;
use std::future::poll_fn;
use std::pin::Pin;

use super::private;
use zbus::export::futures_core::Stream;
use zbus::message::Type as MessageType;
use zbus::proxy::CacheProperties;
use zbus::{Connection, MatchRule, MessageStream, OwnedObjectPath, OwnedVariant, Variant};

/// systemd's well-known bus name.
const DESTINATION: &str = "org.freedesktop.systemd1";
/// The manager object.
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
/// The manager interface.
const MANAGER_IFACE: &str = "org.freedesktop.systemd1.Manager";
/// The interface every unit object has.
pub(super) const UNIT_IFACE: &str = "org.freedesktop.systemd1.Unit";
/// The interface of `.service` units (exit status, cgroup accounting).
pub(super) const SERVICE_IFACE: &str = "org.freedesktop.systemd1.Service";
/// How a connection reaches systemd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Through the D-Bus system bus (`dbus-daemon` or `dbus-broker`).
    SystemBus,
    /// Peer-to-peer on systemd's private socket (root only; no bus daemon needed).
    Private,
}

/// The system bus socket.
pub(super) const SYSTEM_BUS_SOCKET: &str = "/run/dbus/system_bus_socket";
/// systemd's private socket (peer-to-peer, root only).
pub(super) const PRIVATE_SOCKET: &str = "/run/systemd/private";

/// One entry of `ListUnitsByPatterns`: name, description, load state, active state, sub
/// state, following, unit path, job id, job type, job path.
pub(super) type UnitListEntry = (
    String,
    String,
    String,
    String,
    String,
    String,
    OwnedObjectPath,
    u32,
    String,
    OwnedObjectPath,
);

/// The manager methods warden calls.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
pub(super) trait Manager {
    /// Ask systemd to send this connection its signals (JobRemoved, PropertiesChanged).
    fn subscribe(&self) -> zbus::Result<()>;

    /// Create and start a transient unit; returns the start job's path.
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Variant<'_>)],
        aux: &[(&str, &[(&str, Variant<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    /// Stop a unit; returns the stop job's path.
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    /// Send a signal to some of a unit's processes (`who`: "main", "control", "all").
    fn kill_unit(&self, name: &str, who: &str, signal: i32) -> zbus::Result<()>;

    /// Forget a failed unit's failure so it can be collected.
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;

    /// The loaded units whose state and name match.
    fn list_units_by_patterns(
        &self,
        states: &[&str],
        patterns: &[&str],
    ) -> zbus::Result<Vec<UnitListEntry>>;

    /// The unit a process belongs to.
    #[zbus(name = "GetUnitByPID")]
    fn get_unit_by_pid(&self, pid: u32) -> zbus::Result<OwnedObjectPath>;
}

/// The unit-object methods warden calls.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1"
)]
pub(super) trait Unit {
    /// Drop the reference `AddRef=yes` took for this client.
    fn unref(&self) -> zbus::Result<()>;
}

/// `org.freedesktop.DBus.Properties`, uncached: every read goes to systemd.
#[zbus::proxy(
    interface = "org.freedesktop.DBus.Properties",
    default_service = "org.freedesktop.systemd1"
)]
pub(super) trait Properties {
    /// One property.
    fn get(&self, interface: &str, name: &str) -> zbus::Result<OwnedVariant>;

    /// Every property of one interface.
    fn get_all(&self, interface: &str) -> zbus::Result<HashMap<String, OwnedVariant>>;
}

/// Set up D-Bus over `stream`, connected to `transport`'s socket, then `Subscribe()` so that
/// systemd sends this connection its signals.
pub(super) async fn connect_stream(
    stream: tokio::net::UnixStream,
    transport: Transport,
) -> zbus::Result<Connection> {
    let conn = match transport {
        Transport::SystemBus => {
            zbus::connection::Builder::unix_stream(stream.into_std()?)
                .build()
                .await?
        }
        // No bus daemon: no `Hello`, no `AddMatch`; and systemd's private socket needs our
        // own transport (see `private`).
        Transport::Private => {
            let guid = private::authenticate(&stream).await?;
            let socket = private::PrivateSocket(std::sync::Arc::new(stream));
            zbus::connection::Builder::authenticated_socket(socket, guid.as_str())
                .p2p()
                .build()
                .await?
        }
    };
    ManagerProxy::new(&conn).await?.subscribe().await?;
    Ok(conn)
}

/// A proxy of `path`'s properties that never caches.
pub(super) async fn properties_of<'p>(
    conn: &Connection,
    path: &'p str,
) -> zbus::Result<PropertiesProxy<'p>> {
    PropertiesProxy::builder(conn)
        .path(path)
        .cache_properties(CacheProperties::No)
        .build()
        .await
}

/// A proxy of the unit object at `path`.
pub(super) async fn unit_at<'p>(conn: &Connection, path: &'p str) -> zbus::Result<UnitProxy<'p>> {
    UnitProxy::builder(conn)
        .path(path)
        .cache_properties(CacheProperties::No)
        .build()
        .await
}

/// A rule for signals from systemd. On the bus, only from the owner of
/// `org.freedesktop.systemd1` (the bus daemon filters by it), so that another client cannot
/// forge them; on the private socket, only systemd is on the other end.
fn systemd_signals<'m>(conn: &Connection) -> zbus::match_rule::Builder<'m> {
    let rule = MatchRule::builder().msg_type(MessageType::Signal);
    if conn.is_bus() {
        rule.sender(DESTINATION)
    } else {
        rule
    }
}

/// The `JobRemoved` signals of the manager. Create it before the call that makes the job.
pub(super) async fn job_removed_stream(conn: &Connection) -> zbus::Result<MessageStream> {
    let rule = systemd_signals(conn)
        .path(MANAGER_PATH)
        .interface(MANAGER_IFACE)
        .member("JobRemoved")
        .build()?;
    MessageStream::for_match_rule(rule, conn, None).await
}

/// The `UnitRemoved` signals of the manager (a unit was unloaded).
pub(super) async fn unit_removed_stream(conn: &Connection) -> zbus::Result<MessageStream> {
    let rule = systemd_signals(conn)
        .path(MANAGER_PATH)
        .interface(MANAGER_IFACE)
        .member("UnitRemoved")
        .build()?;
    MessageStream::for_match_rule(rule, conn, None).await
}

/// The `PropertiesChanged` signals of the unit object at `path`.
pub(super) async fn properties_changed_stream(
    conn: &Connection,
    path: &str,
) -> zbus::Result<MessageStream> {
    let rule = systemd_signals(conn)
        .path(path)
        .interface("org.freedesktop.DBus.Properties")
        .member("PropertiesChanged")
        .build()?;
    MessageStream::for_match_rule(rule, conn, None).await
}

/// The next message of `stream`; `None` when the connection closed.
pub(super) async fn next_message(
    stream: &mut MessageStream,
) -> Option<zbus::Result<zbus::Message>> {
    poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}

/// Wait on `stream` for the `JobRemoved` of `job`; return its result ("done", "failed", ...).
pub(super) async fn job_result(stream: &mut MessageStream, job: &str) -> zbus::Result<String> {
    while let Some(msg) = next_message(stream).await {
        let (_id, path, _unit, result): (u32, OwnedObjectPath, String, String) =
            msg?.body().deserialize()?;
        if path.as_str() == job {
            return Ok(result);
        }
    }
    Err(closed())
}

/// The error for a connection that closed under us.
pub(super) fn closed() -> zbus::Error {
    zbus::Error::InputOutput(
        std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "connection to systemd closed",
        )
        .into(),
    )
}

/// Whether `err` is systemd's `NoSuchUnit` (or an unknown object: the unit is gone).
pub(super) fn is_no_such_unit(err: &zbus::Error) -> bool {
    match err {
        zbus::Error::MethodError(name, _, _) => {
            name.as_str() == "org.freedesktop.systemd1.NoSuchUnit"
                || name.as_str() == "org.freedesktop.DBus.Error.UnknownObject"
        }
        zbus::Error::FDO(e) => matches!(**e, zbus::fdo::Error::UnknownObject(_)),
        _ => false,
    }
}

/// The object path systemd gives unit `name`: `/org/freedesktop/systemd1/unit/` and the name
/// with every byte that is not ASCII alphanumeric written `_xx` (sd-bus label escaping).
pub(super) fn unit_path(name: &str) -> String {
    let mut path = String::from("/org/freedesktop/systemd1/unit/");
    if name.is_empty() {
        path.push('_');
    }
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() {
            path.push(char::from(b));
        } else {
            path.push_str(&format!("_{b:02x}"));
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_paths_escape_like_sd_bus() {
        assert_eq!(
            unit_path("warden-0123456789abcdef.service"),
            "/org/freedesktop/systemd1/unit/warden_2d0123456789abcdef_2eservice"
        );
        assert_eq!(unit_path("a_b"), "/org/freedesktop/systemd1/unit/a_5fb");
    }
}
