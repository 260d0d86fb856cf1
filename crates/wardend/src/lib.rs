//! wardend: the root daemon that runs an unprivileged agent's commands as isolated,
//! bounded, disposable units. Modules follow the path of a connection:
//! listener → admission → handshake → session → policy → units.

pub mod units;
