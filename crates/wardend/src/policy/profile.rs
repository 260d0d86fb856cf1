//! Profiles and the admin's ceiling (SPEC §5). A profile names what a unit may do; the
//! ceiling bounds every profile (checked when the config is loaded); a request picks a
//! profile and may only tighten it ([`Profile::tighten`]). All pure: no I/O here.

use std::collections::BTreeMap;
use std::time::Duration;

use warden_proto::{Network, Overrides};

/// Paths hidden in every unit (relative to the client's home when they start with `~/`),
/// by class: keys and agents, cloud and cluster CLIs, package registries, version control
/// hosts, databases, password stores and keyrings, browser profiles, shell and REPL
/// histories, AI agents' own credentials. Each is covered at its canonical target too (a
/// dotfiles symlink) and wherever a bind mount shows it again. The admin removes entries
/// with `[ceiling] hidden_except` and adds more with `hidden`.
pub const BUILTIN_HIDDEN: &[&str] = &[
    // Keys, agents, tokens of the desktop session.
    "~/.ssh",
    "~/.gnupg",
    "~/.pki",
    "~/.Xauthority",
    "~/.ICEauthority",
    "~/.local/share/keyrings",
    "~/.local/share/kwalletd",
    "~/.password-store",
    "~/.config/op",
    "~/.config/Bitwarden CLI",
    "~/.config/sops",
    "~/.config/age",
    // Cloud and cluster CLIs.
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.oci",
    "~/.aliyun",
    "~/.config/doctl",
    "~/.config/hcloud",
    "~/.config/linode-cli",
    "~/.config/rclone",
    "~/.s3cfg",
    "~/.boto",
    "~/.kube",
    "~/.docker/config.json",
    "~/.config/containers/auth.json",
    "~/.terraform.d/credentials.tfrc.json",
    "~/.terraformrc",
    "~/.pulumi/credentials.json",
    "~/.vault-token",
    "~/.databrickscfg",
    "~/.kaggle",
    "~/.fly",
    "~/.netlify",
    "~/.local/share/com.vercel.cli",
    "~/.config/heroku",
    "~/.wrangler",
    "~/.config/.wrangler",
    "~/.ngrok2",
    "~/.config/ngrok",
    // Version control hosts.
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/git/credentials",
    "~/.config/gh",
    "~/.config/hub",
    "~/.config/glab-cli",
    "~/.config/github-copilot",
    // Package registries.
    "~/.npmrc",
    "~/.yarnrc.yml",
    "~/.pypirc",
    "~/.cargo/credentials",
    "~/.cargo/credentials.toml",
    "~/.gem/credentials",
    "~/.m2/settings-security.xml",
    "~/.gradle/gradle.properties",
    "~/.composer/auth.json",
    "~/.config/composer/auth.json",
    "~/.nuget/NuGet/NuGet.Config",
    "~/.config/configstore",
    "~/.huggingface",
    "~/.cache/huggingface/token",
    // Databases.
    "~/.pgpass",
    "~/.my.cnf",
    "~/.mylogin.cnf",
    "~/.dbshell",
    // AI agents' own credentials.
    "~/.claude/.credentials.json",
    "~/.codex/auth.json",
    "~/.gemini/oauth_creds.json",
    "~/.local/share/opencode/auth.json",
    "~/.config/openai",
    // Browser and mail profiles (cookies, saved passwords).
    "~/.mozilla",
    "~/.thunderbird",
    "~/.config/google-chrome",
    "~/.config/chromium",
    "~/.config/BraveSoftware",
    "~/.config/microsoft-edge",
    "~/.config/vivaldi",
    // Shell and REPL histories (commands typed with secrets in them).
    "~/.bash_history",
    "~/.zsh_history",
    "~/.zhistory",
    "~/.sh_history",
    "~/.history",
    "~/.histfile",
    "~/.local/share/fish/fish_history",
    "~/.python_history",
    "~/.node_repl_history",
    "~/.psql_history",
    "~/.mysql_history",
    "~/.sqlite_history",
    "~/.rediscli_history",
    "~/.irb_history",
    "~/.Rhistory",
    "~/.lesshst",
    "~/.viminfo",
    "~/.local/share/nvim/shada",
];

/// Paths kept read-only inside a writable working directory (and each writable path, and
/// the git repositories directly below them), because something outside any unit runs
/// or trusts what they say later: git hooks and config (`core.hooksPath`, `core.fsmonitor`,
/// `core.sshCommand`, filters), hook frameworks, editor and agent settings, direnv, shell
/// start-up files. The admin removes entries with `[ceiling] protected_except` and adds
/// more with `protected`.
pub const BUILTIN_PROTECTED: &[&str] = &[
    ".git/hooks",
    ".git/config",
    ".git/info",
    ".gitmodules",
    ".pre-commit-config.yaml",
    ".husky",
    "lefthook.yml",
    ".lefthook.yml",
    ".vscode",
    ".idea",
    ".zed",
    ".devcontainer",
    ".envrc",
    ".mcp.json",
    ".claude",
    ".cursor",
    ".codex",
    ".gemini",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".zlogin",
    ".zlogout",
    ".cshrc",
    ".tcshrc",
];

/// The default profile's memory limit, as a fraction of the host's RAM: a memory hog (or
/// a unit filling its /tmp, which is memory) is killed before the host swaps to a halt.
pub const DEFAULT_MEMORY_FRACTION: (u64, u64) = (1, 2);

/// The default profile's CPU weight (cgroup v2 scale, 1–10000; 100 is the kernel's
/// default and wardend's own): below the daemon's, so a busy unit never starves it.
pub const DEFAULT_CPU_WEIGHT: u32 = 50;

const _: () = assert!(
    DEFAULT_CPU_WEIGHT < 100,
    "below the daemon's default weight"
);

/// `DEFAULT_MEMORY_FRACTION` of this host's RAM, rounded down to MiB.
pub fn default_memory_max() -> u64 {
    let info = rustix::system::sysinfo();
    #[allow(clippy::useless_conversion)] // `totalram` is not u64 on every target
    let total = u64::try_from(info.totalram)
        .unwrap_or(u64::MAX)
        .saturating_mul(u64::from(info.mem_unit.max(1)));
    let (num, den) = DEFAULT_MEMORY_FRACTION;
    (total / den * num) & !((1 << 20) - 1)
}

/// Package caches the built-in profiles keep writable (when they exist).
pub const BUILTIN_CACHES: &[&str] = &["~/.cargo/registry", "~/.cargo/git", "~/.npm", "~/.cache"];

/// What a unit may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Network access.
    pub network: Network,
    /// Memory limit in bytes (`None`: no limit of its own).
    pub memory_max: Option<u64>,
    /// Most tasks.
    pub tasks_max: Option<u64>,
    /// CPU quota, percent of one CPU.
    pub cpu_quota_percent: Option<u32>,
    /// CPU weight against other units and the daemon (cgroup v2 scale, 1–10000).
    pub cpu_weight: Option<u32>,
    /// Wall-time limit.
    pub timeout: Option<Duration>,
    /// Extra writable paths (`~/` = the client's home).
    pub writable: Vec<String>,
    /// Extra hidden paths, on top of the built-in and the ceiling's.
    pub hidden: Vec<String>,
    /// Extra protected paths (relative to each writable directory), on top of the built-in
    /// and the ceiling's.
    pub protected: Vec<String>,
    /// If not empty, only variables matching one of these patterns pass.
    pub env_pass: Vec<String>,
    /// Variables matching these are removed (on top of the built-in deny list).
    pub env_deny: Vec<String>,
    /// Whether a pty may be asked for.
    pub pty: bool,
}

impl Profile {
    /// The built-in `default`: loopback only, no credentials, bounded: a fork bomb or a
    /// memory hog dies alone, and the daemon keeps its CPU.
    pub fn builtin_default() -> Self {
        Self {
            network: Network::Loopback,
            memory_max: Some(default_memory_max()),
            tasks_max: Some(4096),
            cpu_quota_percent: None,
            cpu_weight: Some(DEFAULT_CPU_WEIGHT),
            timeout: None,
            writable: BUILTIN_CACHES.iter().map(|s| s.to_string()).collect(),
            hidden: Vec::new(),
            protected: Vec::new(),
            env_pass: Vec::new(),
            env_deny: Vec::new(),
            pty: false,
        }
    }

    /// The built-in `online`: `default` with the host's network, for package installs.
    pub fn builtin_online() -> Self {
        Self {
            network: Network::Host,
            ..Self::builtin_default()
        }
    }

    /// The built-in `offline`: `default` with no network at all.
    pub fn builtin_offline() -> Self {
        Self {
            network: Network::None,
            ..Self::builtin_default()
        }
    }

    /// Apply a request's tightenings; refuse any that would loosen this profile.
    pub fn tighten(&self, name: &str, o: &Overrides) -> Result<Profile, Loosening> {
        let mut p = self.clone();
        let refuse = |field: &'static str, asked: String, limit: String| Loosening {
            profile: name.to_string(),
            field,
            asked,
            limit,
        };
        if let Some(n) = o.network {
            if n > self.network {
                return Err(refuse(
                    "network",
                    network_name(n).into(),
                    network_name(self.network).into(),
                ));
            }
            p.network = n;
        }
        p.memory_max = tighter(self.memory_max, o.memory_max)
            .map_err(|(a, l)| refuse("memory_max", format_size(a), format_size(l)))?;
        p.tasks_max = tighter(self.tasks_max, o.tasks_max)
            .map_err(|(a, l)| refuse("tasks_max", a.to_string(), l.to_string()))?;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        p.timeout = tighter(self.timeout.map(ms), o.timeout_ms)
            .map_err(|(a, l)| refuse("timeout", format_ms(a), format_ms(l)))?
            .map(Duration::from_millis);
        Ok(p)
    }

    /// The first field in which this profile exceeds `ceiling`, as (key, value, limit).
    pub fn exceeds(&self, ceiling: &Ceiling) -> Option<(&'static str, String, String)> {
        if self.network > ceiling.network {
            return Some((
                "network",
                network_name(self.network).into(),
                network_name(ceiling.network).into(),
            ));
        }
        if let Err((a, l)) = tighter(ceiling.memory_max, self.memory_max) {
            return Some(("memory_max", format_size(a), format_size(l)));
        }
        if ceiling.memory_max.is_some() && self.memory_max.is_none() {
            return Some((
                "memory_max",
                "unlimited".into(),
                format_size(ceiling.memory_max.unwrap_or(0)),
            ));
        }
        if let Err((a, l)) = tighter(ceiling.tasks_max, self.tasks_max) {
            return Some(("tasks_max", a.to_string(), l.to_string()));
        }
        if ceiling.tasks_max.is_some() && self.tasks_max.is_none() {
            return Some((
                "tasks_max",
                "unlimited".into(),
                ceiling.tasks_max.unwrap_or(0).to_string(),
            ));
        }
        let cpu = |v: Option<u32>| v.map(u64::from);
        if let Err((a, l)) = tighter(cpu(ceiling.cpu_quota_percent), cpu(self.cpu_quota_percent)) {
            return Some(("cpu_quota", format!("{a}%"), format!("{l}%")));
        }
        if let Err((a, l)) = tighter(cpu(ceiling.cpu_weight), cpu(self.cpu_weight)) {
            return Some(("cpu_weight", a.to_string(), l.to_string()));
        }
        let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        if let Err((a, l)) = tighter(ms(ceiling.timeout), ms(self.timeout)) {
            return Some(("timeout", format_ms(a), format_ms(l)));
        }
        if self.pty && !ceiling.pty {
            return Some(("pty", "true".into(), "false".into()));
        }
        None
    }

    /// Bring every limit the ceiling sets and the profile leaves open down to the ceiling.
    pub fn bounded_by(mut self, ceiling: &Ceiling) -> Self {
        self.memory_max = self.memory_max.or(ceiling.memory_max);
        self.tasks_max = self.tasks_max.or(ceiling.tasks_max);
        self.cpu_quota_percent = self.cpu_quota_percent.or(ceiling.cpu_quota_percent);
        self.cpu_weight = self.cpu_weight.or(ceiling.cpu_weight);
        self.timeout = self.timeout.or(ceiling.timeout);
        self
    }

    /// Bring every limit above the ceiling's down to it (for the built-in profiles, which
    /// the admin did not write).
    pub fn narrowed_to(mut self, ceiling: &Ceiling) -> Self {
        fn min<T: Ord + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        self.network = self.network.min(ceiling.network);
        self.pty = self.pty && ceiling.pty;
        self.memory_max = min(self.memory_max, ceiling.memory_max);
        self.tasks_max = min(self.tasks_max, ceiling.tasks_max);
        self.cpu_quota_percent = min(self.cpu_quota_percent, ceiling.cpu_quota_percent);
        self.cpu_weight = min(self.cpu_weight, ceiling.cpu_weight);
        self.timeout = min(self.timeout, ceiling.timeout);
        self
    }
}

/// `asked` must not exceed `limit` (`None` = unlimited). Ok(the tighter), or Err((asked, limit)).
fn tighter(limit: Option<u64>, asked: Option<u64>) -> Result<Option<u64>, (u64, u64)> {
    match (limit, asked) {
        (Some(l), Some(a)) if a > l => Err((a, l)),
        (_, Some(a)) => Ok(Some(a)),
        (l, None) => Ok(l),
    }
}

/// The admin's bound over every profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceiling {
    /// Most network access any profile may give.
    pub network: Network,
    /// Largest memory limit (`None`: unbounded).
    pub memory_max: Option<u64>,
    /// Largest tasks limit.
    pub tasks_max: Option<u64>,
    /// Largest CPU quota.
    pub cpu_quota_percent: Option<u32>,
    /// Largest CPU weight.
    pub cpu_weight: Option<u32>,
    /// Longest wall-time limit.
    pub timeout: Option<Duration>,
    /// Whether any profile may allow a pty.
    pub pty: bool,
    /// Paths hidden in every unit, on top of the built-in list.
    pub hidden: Vec<String>,
    /// Built-in hidden paths this host does not hide (exact entries of [`BUILTIN_HIDDEN`]).
    pub hidden_except: Vec<String>,
    /// Paths protected in every unit, on top of the built-in list.
    pub protected: Vec<String>,
    /// Built-in protected paths this host does not protect.
    pub protected_except: Vec<String>,
    /// Variables removed in every unit, on top of the built-in classes.
    pub env_deny: Vec<String>,
    /// Patterns of variables the built-in secret classes would remove that this host lets
    /// through.
    pub env_allow: Vec<String>,
}

impl Default for Ceiling {
    fn default() -> Self {
        Self {
            network: Network::Host,
            memory_max: None,
            tasks_max: None,
            cpu_quota_percent: None,
            cpu_weight: None,
            timeout: None,
            pty: true,
            hidden: Vec::new(),
            hidden_except: Vec::new(),
            protected: Vec::new(),
            protected_except: Vec::new(),
            env_deny: Vec::new(),
            env_allow: Vec::new(),
        }
    }
}

/// The profiles a daemon offers, under one ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profiles {
    /// By name.
    pub profiles: BTreeMap<String, Profile>,
    /// The admin's bound.
    pub ceiling: Ceiling,
}

impl Default for Profiles {
    fn default() -> Self {
        Self::with(BTreeMap::new(), Ceiling::default())
    }
}

impl Profiles {
    /// The built-in profiles, replaced or joined by `configured` ones, bounded by `ceiling`.
    /// Built-ins that exceed the ceiling are narrowed to it; configured ones were checked.
    pub fn with(configured: BTreeMap<String, Profile>, ceiling: Ceiling) -> Self {
        let mut profiles = BTreeMap::new();
        for (name, p) in [
            ("default", Profile::builtin_default()),
            ("online", Profile::builtin_online()),
            ("offline", Profile::builtin_offline()),
        ] {
            profiles.insert(name.to_string(), p.narrowed_to(&ceiling));
        }
        profiles.extend(configured);
        let profiles = profiles
            .into_iter()
            .map(|(n, p)| (n, p.bounded_by(&ceiling)))
            .collect();
        Self { profiles, ceiling }
    }

    /// The profile a request asks for (`None`: `default`), tightened by its overrides.
    pub fn resolve(
        &self,
        name: Option<&str>,
        o: &Overrides,
    ) -> Result<(String, Profile), ProfileError> {
        let name = name.unwrap_or("default");
        let p = self
            .profiles
            .get(name)
            .ok_or_else(|| ProfileError::Unknown(name.to_string()))?;
        let p = p.tighten(name, o).map_err(ProfileError::Loosening)?;
        Ok((name.to_string(), p))
    }
}

/// A request asked for more than its profile allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused: {field} {asked} exceeds the ceiling {limit} of profile {profile:?}")]
pub struct Loosening {
    /// The profile.
    pub profile: String,
    /// The field.
    pub field: &'static str,
    /// What was asked.
    pub asked: String,
    /// What the profile allows.
    pub limit: String,
}

/// A request's profile cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// No such profile.
    #[error("refused: profile: unknown profile {0:?}")]
    Unknown(String),
    /// It would loosen the profile.
    #[error(transparent)]
    Loosening(Loosening),
}

/// `none`, `loopback` or `host`.
pub fn network_name(n: Network) -> &'static str {
    match n {
        Network::None => "none",
        Network::Loopback => "loopback",
        Network::Host => "host",
    }
}

/// Bytes the way people write them (`512M`, `4G`, or a byte count).
pub fn format_size(b: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

/// Milliseconds the way people write them.
pub fn format_ms(ms: u64) -> String {
    if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else if !ms.is_multiple_of(60_000) || ms == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{}m", ms / 60_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> Profile {
        Profile {
            network: Network::None,
            memory_max: Some(1 << 30),
            tasks_max: Some(64),
            timeout: Some(Duration::from_secs(60)),
            ..Profile::builtin_default()
        }
    }

    #[test]
    fn tightening_is_allowed_loosening_is_refused_by_field() {
        let p = strict();
        let ok = p.tighten(
            "strict",
            &Overrides {
                memory_max: Some(1 << 20),
                tasks_max: Some(8),
                timeout_ms: Some(1000),
                network: Some(Network::None),
            },
        );
        let ok = ok.map_err(|e| e.to_string());
        assert_eq!(ok.as_ref().map(|p| p.tasks_max), Ok(Some(8)));
        assert_eq!(
            ok.as_ref().map(|p| p.timeout),
            Ok(Some(Duration::from_secs(1)))
        );

        let net = p.tighten(
            "strict",
            &Overrides {
                network: Some(Network::Host),
                ..Overrides::default()
            },
        );
        assert_eq!(
            net.map(|_| ()).map_err(|e| e.to_string()),
            Err("refused: network host exceeds the ceiling none of profile \"strict\"".into())
        );
        let mem = p.tighten(
            "strict",
            &Overrides {
                memory_max: Some(2 << 30),
                ..Overrides::default()
            },
        );
        assert_eq!(
            mem.map(|_| ()).map_err(|e| e.to_string()),
            Err("refused: memory_max 2G exceeds the ceiling 1G of profile \"strict\"".into())
        );
        let t = p.tighten(
            "strict",
            &Overrides {
                timeout_ms: Some(120_000),
                ..Overrides::default()
            },
        );
        assert!(t.is_err_and(|e| e.field == "timeout" && e.limit == "1m"));
    }

    #[test]
    fn unlimited_profile_takes_any_tightening() {
        let p = Profile {
            memory_max: None,
            ..Profile::builtin_online()
        };
        let t = p.tighten(
            "online",
            &Overrides {
                memory_max: Some(5 << 30),
                ..Overrides::default()
            },
        );
        assert_eq!(t.map(|p| p.memory_max), Ok(Some(5 << 30)));
    }

    #[test]
    fn unknown_profile_is_named() {
        let ps = Profiles::default();
        let e = ps
            .resolve(Some("nope"), &Overrides::default())
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(e, Err("refused: profile: unknown profile \"nope\"".into()));
        let d = ps.resolve(None, &Overrides::default());
        assert_eq!(
            d.map(|(n, p)| (n, p.network)),
            Ok(("default".into(), Network::Loopback))
        );
    }

    #[test]
    fn ceiling_bounds_builtins_and_detects_loosening_profiles() {
        let ceiling = Ceiling {
            network: Network::Loopback,
            memory_max: Some(2 << 30),
            ..Ceiling::default()
        };
        let ps = Profiles::with(BTreeMap::new(), ceiling.clone());
        assert_eq!(
            ps.profiles.get("online").map(|p| p.network),
            Some(Network::Loopback)
        );
        // The built-in default's share of RAM, narrowed to the ceiling where that is lower.
        assert_eq!(
            ps.profiles.get("default").and_then(|p| p.memory_max),
            Some(default_memory_max().min(2 << 30))
        );
        assert_eq!(
            Profile::builtin_online().exceeds(&ceiling).map(|e| e.0),
            Some("network")
        );
        let big = Profile {
            network: Network::None,
            memory_max: Some(4 << 30),
            ..Profile::builtin_default()
        };
        assert_eq!(
            big.exceeds(&ceiling),
            Some(("memory_max", "4G".into(), "2G".into()))
        );
        let fine = Profile {
            network: Network::None,
            memory_max: Some(1 << 30),
            ..Profile::builtin_default()
        };
        assert_eq!(fine.exceeds(&ceiling), None);
    }

    #[test]
    fn the_default_profile_is_bounded() {
        let d = Profile::builtin_default();
        let ram = rustix::system::sysinfo().totalram as u64;
        let mem = d.memory_max.unwrap_or(0);
        assert!(mem > 0 && mem <= ram / 2, "{mem} of {ram}");
        assert_eq!(d.cpu_weight, Some(DEFAULT_CPU_WEIGHT));
        assert_eq!(d.tasks_max, Some(4096));
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(512 << 20), "512M");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_ms(1500), "1500ms");
        assert_eq!(format_ms(30_000), "30s");
        assert_eq!(format_ms(600_000), "10m");
    }
}
