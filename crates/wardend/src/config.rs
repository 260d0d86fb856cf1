//! Configuration: built-in defaults, overridden by the TOML file (`/etc/warden/warden.toml`
//! unless `--config` names another), overridden by command-line flags. Everything is
//! validated here, at start-up, so that the daemon never starts with a config it would
//! misread.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;
use warden_proto::Network;

use crate::policy::profile::{Ceiling, Profile, Profiles, BUILTIN_HIDDEN, BUILTIN_PROTECTED};
use crate::units::BackendKind;

/// Where the config file is looked for when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/warden/warden.toml";
pub use warden_proto::socket::default_socket;

/// The default unit prefix of the daemon serving `account`: `warden_<account>`, the
/// account name lowercased with every character outside a-z, 0-9 and _ as `_` (a prefix
/// has no dash: unit names are `<prefix>-<16 hex>`).
pub fn default_unit_prefix(account: &str) -> String {
    let name: String = account
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    format!("warden_{name}")
}

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
    /// A value in the file is wrong or loosens the ceiling.
    #[error("{path}:{line}: {key}: {message}")]
    At {
        /// The file.
        path: PathBuf,
        /// The line.
        line: usize,
        /// The key, dotted (`profiles.default.memory_max`).
        key: String,
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
    /// How long an authenticated client may wait for a session slot.
    #[serde(default, deserialize_with = "de_duration")]
    pub session_wait: Option<Duration>,
    /// Unit name prefix.
    pub unit_prefix: Option<String>,
    /// SO_SNDBUF / SO_RCVBUF of each connection, in bytes.
    pub socket_buffer_size: Option<usize>,
    /// Length of the per-origin admission window.
    #[serde(default, deserialize_with = "de_duration")]
    pub origin_window: Option<Duration>,
    /// Most admissions per origin within one window.
    pub origin_max_per_window: Option<usize>,
    /// The admin's bound over every profile.
    pub ceiling: Option<FileLimits>,
    /// Named profiles.
    #[serde(default)]
    pub profiles: BTreeMap<String, FileLimits>,
}

/// A size in the file: bytes as an integer, or text like `512M`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SizeValue {
    /// Bytes.
    Bytes(u64),
    /// `512M`, `4G`, ...
    Text(String),
}

/// A profile, or the ceiling, as written in the file. Values keep their place in the file
/// so that an error can name the line.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimits {
    /// `none`, `loopback` or `host`.
    pub network: Option<Spanned<Network>>,
    /// Memory limit.
    pub memory_max: Option<Spanned<SizeValue>>,
    /// Most tasks.
    pub tasks_max: Option<Spanned<u64>>,
    /// CPU quota in percent of one CPU (`"150%"` or `150`).
    pub cpu_quota: Option<Spanned<SizeValue>>,
    /// CPU weight, 1–10000 (cgroup v2 scale; 100 is the kernel's default and wardend's).
    pub cpu_weight: Option<Spanned<u32>>,
    /// Wall-time limit (`"30s"`).
    pub timeout: Option<Spanned<String>>,
    /// Whether a pty may be used.
    pub pty: Option<Spanned<bool>>,
    /// Extra writable paths (profiles only).
    pub writable: Option<Vec<String>>,
    /// Extra hidden paths.
    pub hidden: Option<Vec<String>>,
    /// Extra protected paths (relative to each writable directory).
    pub protected: Option<Vec<String>>,
    /// Built-in hidden paths not to hide (ceiling only).
    pub hidden_except: Option<Spanned<Vec<String>>>,
    /// Built-in protected paths not to protect (ceiling only).
    pub protected_except: Option<Spanned<Vec<String>>>,
    /// Variables the built-in secret classes would remove that may pass (ceiling only).
    pub env_allow: Option<Spanned<Vec<String>>>,
    /// Environment pass-list patterns (profiles only).
    pub env_pass: Option<Vec<String>>,
    /// Environment deny patterns.
    pub env_deny: Option<Vec<String>>,
}

/// Flags that override the file (`None` = not given).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct Flags {
    /// The account whose processes may ask for units.
    #[arg(long)]
    pub client_user: Option<String>,
    /// The socket path [default: /run/warden/<client account>.sock].
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
    /// How long an authenticated client may wait for a session slot (0: refused at once).
    #[arg(long, value_parser = parse_duration)]
    pub session_wait: Option<Duration>,
    /// Unit name prefix [default: warden_<client account>].
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
    /// How long an authenticated client may wait for a session slot (at most
    /// `max_sessions` wait at once); zero: `session limit reached` at once (C10).
    pub session_wait: Duration,
    /// Unit name prefix.
    pub unit_prefix: String,
    /// SO_SNDBUF / SO_RCVBUF of each connection.
    pub socket_buffer_size: usize,
    /// Length of the per-origin admission window.
    pub origin_window: Duration,
    /// Most admissions per origin within one window.
    pub origin_max_per_window: usize,
    /// Profiles and their ceiling.
    pub profiles: Profiles,
}

impl Config {
    /// Load `path` (or the default file if it exists) and apply `flags` over it.
    pub fn load(path: Option<&Path>, flags: Flags) -> Result<Self, ConfigError> {
        let path = match path {
            Some(p) => Some(p.to_path_buf()),
            None if Path::new(DEFAULT_CONFIG).exists() => Some(PathBuf::from(DEFAULT_CONFIG)),
            None => None,
        };
        match path {
            Some(p) => {
                let text = std::fs::read_to_string(&p).map_err(|source| ConfigError::Read {
                    path: p.clone(),
                    source,
                })?;
                Self::from_text(&p, &text, flags)
            }
            None => Self::merge(FileConfig::default(), flags, Profiles::default()),
        }
    }

    /// Parse config text from `path` and apply `flags` over it.
    pub fn from_text(path: &Path, text: &str, flags: Flags) -> Result<Self, ConfigError> {
        let mut file = parse_file(path, text)?;
        let profiles = profiles_of(path, text, &mut file)?;
        Self::merge(file, flags, profiles)
    }

    /// Apply flags over a parsed file, fill defaults, validate.
    pub fn merge(file: FileConfig, flags: Flags, profiles: Profiles) -> Result<Self, ConfigError> {
        let (flags_socket, flags_prefix) = (flags.socket.clone(), flags.unit_prefix.clone());
        let cfg = Config {
            client_user: flags
                .client_user
                .or(file.client_user)
                .ok_or(ConfigError::NoClientUser)?,
            socket: PathBuf::new(),
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
            session_wait: flags
                .session_wait
                .or(file.session_wait)
                .unwrap_or(Duration::ZERO),
            unit_prefix: String::new(),
            socket_buffer_size: file.socket_buffer_size.unwrap_or(256 * 1024),
            origin_window: file.origin_window.unwrap_or(Duration::from_secs(1)),
            origin_max_per_window: file.origin_max_per_window.unwrap_or(1024),
            profiles,
        };
        let mut cfg = cfg;
        cfg.socket = flags_socket
            .or(file.socket)
            .unwrap_or_else(|| default_socket(&cfg.client_user));
        cfg.unit_prefix = flags_prefix
            .or(file.unit_prefix)
            .unwrap_or_else(|| default_unit_prefix(&cfg.client_user));
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

/// The ceiling and profiles of a parsed file, each profile checked against the ceiling.
fn profiles_of(path: &Path, text: &str, file: &mut FileConfig) -> Result<Profiles, ConfigError> {
    let at = |span: std::ops::Range<usize>, key: String, message: String| ConfigError::At {
        path: path.to_path_buf(),
        line: text
            .get(..span.start)
            .map_or(1, |t| t.matches('\n').count() + 1),
        key,
        message,
    };
    let ceiling = match file.ceiling.take() {
        None => Ceiling::default(),
        Some(c) => {
            let base = Ceiling::default();
            let l = limits(&c, "ceiling", &at)?;
            Ceiling {
                network: c.network.as_ref().map_or(base.network, |n| *n.get_ref()),
                memory_max: l.memory_max,
                tasks_max: l.tasks_max,
                cpu_quota_percent: l.cpu_quota_percent,
                cpu_weight: l.cpu_weight,
                timeout: l.timeout,
                pty: c.pty.as_ref().map_or(base.pty, |p| *p.get_ref()),
                hidden: c.hidden.clone().unwrap_or_default(),
                hidden_except: except_list(
                    &c.hidden_except,
                    "ceiling.hidden_except",
                    BUILTIN_HIDDEN,
                    &at,
                )?,
                protected: c.protected.clone().unwrap_or_default(),
                protected_except: except_list(
                    &c.protected_except,
                    "ceiling.protected_except",
                    BUILTIN_PROTECTED,
                    &at,
                )?,
                env_deny: c.env_deny.clone().unwrap_or_default(),
                env_allow: c
                    .env_allow
                    .as_ref()
                    .map(|v| v.get_ref().clone())
                    .unwrap_or_default(),
            }
        }
    };
    let mut configured = BTreeMap::new();
    for (name, fp) in std::mem::take(&mut file.profiles) {
        let key = format!("profiles.{name}");
        let l = limits(&fp, &key, &at)?;
        for (field, value) in [
            ("hidden_except", &fp.hidden_except),
            ("protected_except", &fp.protected_except),
            ("env_allow", &fp.env_allow),
        ] {
            if let Some(v) = value {
                return Err(at(
                    v.span(),
                    format!("{key}.{field}"),
                    "belongs in [ceiling]: it applies to every unit".into(),
                ));
            }
        }
        // Bounded by default: what a profile leaves out is the built-in default's bound
        // (within the ceiling).
        let base = Profile::builtin_default().narrowed_to(&ceiling);
        let profile = Profile {
            network: fp.network.as_ref().map_or(base.network, |n| *n.get_ref()),
            memory_max: l.memory_max.or(base.memory_max),
            tasks_max: l.tasks_max.or(base.tasks_max),
            cpu_quota_percent: l.cpu_quota_percent,
            cpu_weight: l.cpu_weight.or(base.cpu_weight),
            timeout: l.timeout,
            writable: fp.writable.clone().unwrap_or(base.writable),
            hidden: fp.hidden.clone().unwrap_or_default(),
            protected: fp.protected.clone().unwrap_or_default(),
            env_pass: fp.env_pass.clone().unwrap_or_default(),
            env_deny: fp.env_deny.clone().unwrap_or_default(),
            pty: fp.pty.as_ref().is_some_and(|p| *p.get_ref()),
        };
        if let Some((field, value, limit)) = profile.exceeds(&ceiling) {
            let span = match field {
                "network" => fp.network.as_ref().map(Spanned::span),
                "memory_max" => fp.memory_max.as_ref().map(Spanned::span),
                "tasks_max" => fp.tasks_max.as_ref().map(Spanned::span),
                "cpu_quota" => fp.cpu_quota.as_ref().map(Spanned::span),
                "cpu_weight" => fp.cpu_weight.as_ref().map(Spanned::span),
                "timeout" => fp.timeout.as_ref().map(Spanned::span),
                _ => fp.pty.as_ref().map(Spanned::span),
            };
            let where_ = span.unwrap_or_else(|| header_span(text, &name));
            return Err(at(
                where_,
                format!("{key}.{field}"),
                format!("{value} loosens the ceiling ({limit})"),
            ));
        }
        configured.insert(name, profile);
    }
    Ok(Profiles::with(configured, ceiling))
}

/// Where `[profiles.NAME]` starts, for errors about a value the profile left out.
fn header_span(text: &str, name: &str) -> std::ops::Range<usize> {
    let start = text.find(&format!("[profiles.{name}]")).unwrap_or(0);
    start..start
}

/// The numeric limits of a profile or the ceiling, parsed.
struct ParsedLimits {
    memory_max: Option<u64>,
    tasks_max: Option<u64>,
    cpu_quota_percent: Option<u32>,
    cpu_weight: Option<u32>,
    timeout: Option<Duration>,
}

fn limits(
    l: &FileLimits,
    key: &str,
    at: &impl Fn(std::ops::Range<usize>, String, String) -> ConfigError,
) -> Result<ParsedLimits, ConfigError> {
    let memory_max = match &l.memory_max {
        None => None,
        Some(v) => Some(match v.get_ref() {
            SizeValue::Bytes(b) => *b,
            SizeValue::Text(t) => warden_proto::parse::parse_size(t)
                .map_err(|e| at(v.span(), format!("{key}.memory_max"), e.to_string()))?,
        }),
    };
    let cpu_quota_percent = match &l.cpu_quota {
        None => None,
        Some(v) => {
            let n = match v.get_ref() {
                SizeValue::Bytes(b) => Some(*b),
                SizeValue::Text(t) => t.trim().trim_end_matches('%').parse().ok(),
            };
            Some(
                n.and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        at(
                            v.span(),
                            format!("{key}.cpu_quota"),
                            "expected a percentage like \"150%\"".into(),
                        )
                    })?,
            )
        }
    };
    let timeout = match &l.timeout {
        None => None,
        Some(v) => Some(
            parse_duration(v.get_ref()).map_err(|e| at(v.span(), format!("{key}.timeout"), e))?,
        ),
    };
    if let Some(t) = l.tasks_max.as_ref().filter(|t| *t.get_ref() == 0) {
        return Err(at(
            t.span(),
            format!("{key}.tasks_max"),
            "must be at least 1".into(),
        ));
    }
    if let Some(w) = l
        .cpu_weight
        .as_ref()
        .filter(|w| !(1..=10_000).contains(w.get_ref()))
    {
        return Err(at(
            w.span(),
            format!("{key}.cpu_weight"),
            "must be between 1 and 10000".into(),
        ));
    }
    Ok(ParsedLimits {
        memory_max,
        tasks_max: l.tasks_max.as_ref().map(|t| *t.get_ref()),
        cpu_quota_percent,
        cpu_weight: l.cpu_weight.as_ref().map(|w| *w.get_ref()),
        timeout,
    })
}

/// An `*_except` list: each entry must be one of the built-in list's, exactly.
fn except_list(
    value: &Option<Spanned<Vec<String>>>,
    key: &str,
    builtin: &[&str],
    at: &impl Fn(std::ops::Range<usize>, String, String) -> ConfigError,
) -> Result<Vec<String>, ConfigError> {
    let Some(v) = value else {
        return Ok(Vec::new());
    };
    if let Some(unknown) = v.get_ref().iter().find(|e| !builtin.contains(&e.as_str())) {
        return Err(at(
            v.span(),
            key.to_string(),
            format!("{unknown:?} is not a built-in entry"),
        ));
    }
    Ok(v.get_ref().clone())
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
            "client_user = \"root\"\nmax_sessions = 3\nhandshake_timeout = \"250ms\"\nsession_wait = \"2s\"\n",
        )?;
        let mut flags = flags_with_user();
        flags.max_sessions = Some(9);
        let cfg = Config::merge(file, flags, Profiles::default())?;
        assert_eq!(cfg.client_user, "nobody");
        assert_eq!(cfg.max_sessions, 9);
        assert_eq!(cfg.handshake_timeout, Duration::from_millis(250));
        assert_eq!(cfg.session_wait, Duration::from_secs(2));
        let cfg = Config::merge(
            FileConfig::default(),
            flags_with_user(),
            Profiles::default(),
        )?;
        assert_eq!(cfg.session_wait, Duration::ZERO, "C10: no wait by default");
        // The socket and prefix of the account served.
        assert_eq!(cfg.unit_prefix, "warden_nobody");
        assert_eq!(cfg.socket, PathBuf::from("/run/warden/nobody.sock"));
        Ok(())
    }

    #[test]
    fn defaults_derive_from_the_account() {
        assert_eq!(default_unit_prefix("alice"), "warden_alice");
        assert_eq!(default_unit_prefix("Bob.Smith-2"), "warden_bob_smith_2");
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
        assert!(Config::merge(FileConfig::default(), flags, Profiles::default()).is_err());
        assert!(matches!(
            Config::merge(FileConfig::default(), Flags::default(), Profiles::default()),
            Err(ConfigError::NoClientUser)
        ));
    }

    #[test]
    fn profiles_are_checked_against_the_ceiling_with_their_line() {
        let text = "client_user = \"nobody\"\n[ceiling]\nnetwork = \"loopback\"\nmemory_max = \"2G\"\n\n[profiles.build]\nnetwork = \"none\"\nmemory_max = \"4G\"\n";
        let err = Config::from_text(Path::new("/etc/w.toml"), text, Flags::default())
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(
            err,
            Err("/etc/w.toml:8: profiles.build.memory_max: 4G loosens the ceiling (2G)".into())
        );
        let ok = text.replace("4G", "1G");
        let cfg = Config::from_text(Path::new("w.toml"), &ok, Flags::default());
        let cfg = cfg.map_err(|e| e.to_string());
        let build = cfg
            .as_ref()
            .ok()
            .and_then(|c| c.profiles.profiles.get("build").cloned());
        assert_eq!(build.as_ref().map(|p| p.memory_max), Some(Some(1 << 30)));
        // Built-ins are narrowed to the ceiling.
        let online = cfg
            .ok()
            .and_then(|c| c.profiles.profiles.get("online").cloned());
        assert_eq!(online.map(|p| p.network), Some(Network::Loopback));
    }

    #[test]
    fn the_admin_adds_and_removes_built_in_entries_in_the_ceiling() -> Result<(), ConfigError> {
        let text = "[ceiling]\nhidden_except = [\"~/.npmrc\"]\nprotected_except = [\".idea\"]\n\
                    env_allow = [\"GITLAB_*\"]\nprotected = [\".tool-versions\"]\n\
                    cpu_weight = 80\n[profiles.quiet]\ncpu_weight = 20\n";
        let cfg = Config::from_text(Path::new("w.toml"), text, flags_with_user())?;
        let c = &cfg.profiles.ceiling;
        assert_eq!(c.hidden_except, ["~/.npmrc"]);
        assert_eq!(c.protected_except, [".idea"]);
        assert_eq!(c.env_allow, ["GITLAB_*"]);
        assert_eq!(c.protected, [".tool-versions"]);
        let weight = |n: &str| cfg.profiles.profiles.get(n).and_then(|p| p.cpu_weight);
        assert_eq!(weight("quiet"), Some(20));
        // A configured profile is bounded by default: the built-in default's limits.
        let quiet = cfg.profiles.profiles.get("quiet");
        assert!(quiet.is_some_and(|p| p.memory_max.is_some() && p.tasks_max == Some(4096)));
        // Only entries of the built-in lists can be excepted; only the ceiling may.
        for (text, expected) in [
            (
                "[ceiling]\nhidden_except = [\"~/.nothing\"]\n",
                "w.toml:2: ceiling.hidden_except: \"~/.nothing\" is not a built-in entry",
            ),
            (
                "[profiles.x]\nenv_allow = [\"A\"]\n",
                "w.toml:2: profiles.x.env_allow: belongs in [ceiling]: it applies to every unit",
            ),
            (
                "[ceiling]\ncpu_weight = 0\n",
                "w.toml:2: ceiling.cpu_weight: must be between 1 and 10000",
            ),
            (
                "[ceiling]\ncpu_weight = 60\n[profiles.x]\ncpu_weight = 90\n",
                "w.toml:4: profiles.x.cpu_weight: 90 loosens the ceiling (60)",
            ),
        ] {
            let err = Config::from_text(Path::new("w.toml"), text, flags_with_user())
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert_eq!(err, Err(expected.to_string()), "{text}");
        }
        Ok(())
    }

    #[test]
    fn bad_profile_values_name_the_line_and_key() {
        let text = "[profiles.x]\ntimeout = \"soon\"\n";
        let err = Config::from_text(Path::new("w.toml"), text, flags_with_user())
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            err.as_ref()
                .is_err_and(|e| e.starts_with("w.toml:2: profiles.x.timeout: ")),
            "{err:?}"
        );
        let text = "[profiles.x]\nnetwork = \"internet\"\n";
        let err = Config::from_text(Path::new("w.toml"), text, flags_with_user())
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(err.as_ref().is_err_and(|e| e.contains("line 2")), "{err:?}");
        let text = "[profiles.x]\nnetwrk = \"none\"\n";
        let err = Config::from_text(Path::new("w.toml"), text, flags_with_user())
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            err.as_ref()
                .is_err_and(|e| e.contains("line 2") && e.contains("netwrk")),
            "{err:?}"
        );
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
