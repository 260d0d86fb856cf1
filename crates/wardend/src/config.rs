//! Configuration: built-in defaults, overridden by the TOML file (`/etc/warden/warden.toml`
//! unless `--config` names another), overridden by command-line flags. Everything is
//! validated here, at start-up, so that the daemon never starts with a config it would
//! misread.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::units::BackendKind;

/// Where the config file is looked for when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/warden/warden.toml";
/// Where the socket is when nothing says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/warden/warden.sock";

/// A config problem, named so that an operator can fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid (unknown key, wrong type, bad value); the message has the line.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// toml's message, with line, column and key.
        message: String,
    },
    /// A value is out of range.
    #[error("{key}: {message}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
    /// No client account was configured.
    #[error("no client account: set --client-user or client_user in the config file")]
    NoClientUser,
}

/// The config file's shape. Every key is optional; unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The account whose processes may ask for units.
    pub client_user: Option<String>,
    /// The socket path.
    pub socket: Option<PathBuf>,
    /// Which backend.
    pub backend: Option<BackendKind>,
    /// Most concurrent sessions.
    pub max_sessions: Option<usize>,
    /// Most concurrent unauthenticated connections.
    pub max_unauthenticated: Option<usize>,
    /// Time allowed from accept to the start request.
    #[serde(default, deserialize_with = "de_duration")]
    pub handshake_timeout: Option<Duration>,
    /// Unit name prefix.
    pub unit_prefix: Option<String>,
    /// SO_SNDBUF / SO_RCVBUF of each connection, in bytes.
    pub socket_buffer_size: Option<usize>,
    /// Length of the per-origin admission window.
    #[serde(default, deserialize_with = "de_duration")]
    pub origin_window: Option<Duration>,
    /// Most admissions per origin within one window.
    pub origin_max_per_window: Option<usize>,
}

/// Flags that override the file (`None` = not given).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct Flags {
    /// The account whose processes may ask for units.
    #[arg(long)]
    pub client_user: Option<String>,
    /// The socket path.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Which backend runs units.
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// Most concurrent sessions.
    #[arg(long)]
    pub max_sessions: Option<usize>,
    /// Most concurrent unauthenticated connections.
    #[arg(long)]
    pub max_unauthenticated: Option<usize>,
    /// Time allowed from accept to the start request (e.g. 5s, 250ms).
    #[arg(long, value_parser = parse_duration)]
    pub handshake_timeout: Option<Duration>,
    /// Unit name prefix.
    #[arg(long)]
    pub unit_prefix: Option<String>,
}

/// The validated configuration the daemon runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The account whose processes may ask for units.
    pub client_user: String,
    /// The socket path.
    pub socket: PathBuf,
    /// Which backend.
    pub backend: BackendKind,
    /// Most concurrent sessions.
    pub max_sessions: usize,
    /// Most concurrent unauthenticated connections.
    pub max_unauthenticated: usize,
    /// Time allowed from accept to the start request.
    pub handshake_timeout: Duration,
    /// Unit name prefix.
    pub unit_prefix: String,
    /// SO_SNDBUF / SO_RCVBUF of each connection.
    pub socket_buffer_size: usize,
    /// Length of the per-origin admission window.
    pub origin_window: Duration,
    /// Most admissions per origin within one window.
    pub origin_max_per_window: usize,
}

impl Config {
    /// Load `path` (or the default file if it exists) and apply `flags` over it.
    pub fn load(path: Option<&Path>, flags: Flags) -> Result<Self, ConfigError> {
        let file = match path {
            Some(p) => Some(read_file(p)?),
            None if Path::new(DEFAULT_CONFIG).exists() => {
                Some(read_file(Path::new(DEFAULT_CONFIG))?)
            }
            None => None,
        };
        Self::merge(file.unwrap_or_default(), flags)
    }

    /// Apply flags over a parsed file, fill defaults, validate.
    pub fn merge(file: FileConfig, flags: Flags) -> Result<Self, ConfigError> {
        let cfg = Config {
            client_user: flags
                .client_user
                .or(file.client_user)
                .ok_or(ConfigError::NoClientUser)?,
            socket: flags
                .socket
                .or(file.socket)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET)),
            backend: flags.backend.or(file.backend).unwrap_or(BackendKind::Auto),
            max_sessions: flags.max_sessions.or(file.max_sessions).unwrap_or(64),
            max_unauthenticated: flags
                .max_unauthenticated
                .or(file.max_unauthenticated)
                .unwrap_or(16),
            handshake_timeout: flags
                .handshake_timeout
                .or(file.handshake_timeout)
                .unwrap_or(Duration::from_secs(5)),
            unit_prefix: flags
                .unit_prefix
                .or(file.unit_prefix)
                .unwrap_or_else(|| "warden".into()),
            socket_buffer_size: file.socket_buffer_size.unwrap_or(256 * 1024),
            origin_window: file.origin_window.unwrap_or(Duration::from_secs(1)),
            origin_max_per_window: file.origin_max_per_window.unwrap_or(64),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.into(),
            })
        };
        if self.max_sessions == 0 {
            return invalid("max_sessions", "must be at least 1");
        }
        if self.max_unauthenticated == 0 {
            return invalid("max_unauthenticated", "must be at least 1");
        }
        if self.origin_max_per_window == 0 {
            return invalid("origin_max_per_window", "must be at least 1");
        }
        if self.handshake_timeout.is_zero() {
            return invalid("handshake_timeout", "must be more than zero");
        }
        let p = &self.unit_prefix;
        if p.is_empty()
            || p.len() > 64
            || !p
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return invalid(
                "unit_prefix",
                "must be 1 to 64 characters of a-z, 0-9 and _ (a dash would make names ambiguous)",
            );
        }
        if !self.socket.is_absolute() || self.socket.parent().is_none_or(|d| d == Path::new("/")) {
            return invalid(
                "socket",
                "must be an absolute path inside a directory other than /",
            );
        }
        if !(4096..=16 * 1024 * 1024).contains(&self.socket_buffer_size) {
            return invalid(
                "socket_buffer_size",
                "must be between 4096 and 16777216 bytes",
            );
        }
        Ok(())
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_file(path, &text)
}

/// Parse config text; errors carry the file, line and key.
pub fn parse_file(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: one_line(&e.to_string()),
    })
}

/// toml's messages span several lines (with a caret drawing); keep them readable in a log.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '|' || c == '^' || c == ' '))
        .collect::<Vec<_>>()
        .join(" ")
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    parse_duration(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// Parse a duration (`250ms`, `5s`, `10m`, `1h30m`; a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    warden_proto::parse::parse_duration_ms(text)
        .map(Duration::from_millis)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags_with_user() -> Flags {
        Flags {
            client_user: Some("nobody".into()),
            ..Flags::default()
        }
    }

    #[test]
    fn flags_override_file_override_defaults() -> Result<(), ConfigError> {
        let file = parse_file(
            Path::new("w.toml"),
            "client_user = \"root\"\nmax_sessions = 3\nhandshake_timeout = \"250ms\"\n",
        )?;
        let mut flags = flags_with_user();
        flags.max_sessions = Some(9);
        let cfg = Config::merge(file, flags)?;
        assert_eq!(cfg.client_user, "nobody");
        assert_eq!(cfg.max_sessions, 9);
        assert_eq!(cfg.handshake_timeout, Duration::from_millis(250));
        assert_eq!(cfg.unit_prefix, "warden");
        assert_eq!(cfg.socket, PathBuf::from(DEFAULT_SOCKET));
        Ok(())
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let err = parse_file(Path::new("/etc/w.toml"), "max_sessions = 1\nbogus = 2\n")
            .map(|_| ())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.starts_with("/etc/w.toml: "), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("bogus"), "{err}");
    }

    #[test]
    fn bad_values_are_refused() {
        let bad = parse_file(Path::new("w.toml"), "handshake_timeout = \"5 parsecs\"\n");
        assert!(bad.is_err());
        let mut flags = flags_with_user();
        flags.unit_prefix = Some("a-b".into());
        assert!(Config::merge(FileConfig::default(), flags).is_err());
        assert!(matches!(
            Config::merge(FileConfig::default(), Flags::default()),
            Err(ConfigError::NoClientUser)
        ));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1 fortnight").is_err());
    }
}
