//! The command's environment: what the client sent, less every secret. A variable is a
//! secret when its name, compared without regard to case, falls in one of the classes of
//! [`secret_class`] (passwords, secrets, tokens, keys, credentials, auth, DSNs, webhooks),
//! when its value is a URL with a password in it, or when the admin's or the profile's
//! deny patterns match it. A short list of harmless names ([`HARMLESS`]) always passes, and
//! the admin may let more through (`[ceiling] env_allow`). When a profile has a pass-list,
//! only what it names passes at all.
//!
//! A variable the client asked for by name (`warden run --env K=V`) is refused, not
//! dropped: the agent must learn that its unit will not see it.

/// Names that look like a class below but are not secrets, and pass whatever it says.
pub const HARMLESS: &[&str] = &[
    "PATH",
    "PWD",
    "OLDPWD",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "COLORTERM",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "KEYMAP",
    "EDITOR",
    "VISUAL",
    "PAGER",
];

/// Names denied whatever their class: the agent's sockets and the daemon's own.
const DENIED_NAMES: &[&str] = &[
    "SSH_AUTH_SOCK",
    "GPG_AGENT_INFO",
    "KRB5CCNAME",
    "WARDEN_SOCKET",
];

/// Substrings of a name that make it a secret wherever they appear.
const SECRET_SUBSTRINGS: &[(&str, &str)] = &[
    ("PASSWORD", "PASSWORD"),
    ("PASSWD", "PASSWORD"),
    ("PASSPHRASE", "PASSWORD"),
    ("SECRET", "SECRET"),
    ("CREDENTIAL", "CREDENTIAL"),
    ("WEBHOOK", "WEBHOOK"),
    ("APIKEY", "KEY"),
    ("ACCESSKEY", "KEY"),
    ("PRIVATEKEY", "KEY"),
];

/// Words of a name (split at `_`, `-`, `.`) that make it a secret.
const SECRET_WORDS: &[(&str, &str)] = &[
    ("PASS", "PASSWORD"),
    ("PWD", "PASSWORD"),
    ("TOKEN", "TOKEN"),
    ("TOKENS", "TOKEN"),
    ("PAT", "PAT"),
    ("KEY", "KEY"),
    ("KEYS", "KEY"),
    ("CREDS", "CREDENTIAL"),
    ("AUTH", "AUTH"),
    ("DSN", "DSN"),
];

/// The class that makes `name=value` a secret, or `None`.
pub fn secret_class(name: &str, value: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    if DENIED_NAMES.contains(&upper.as_str()) {
        return Some("an agent or daemon socket");
    }
    if let Some((_, class)) = SECRET_SUBSTRINGS.iter().find(|(s, _)| upper.contains(s)) {
        return Some(class);
    }
    let words = upper.split(['_', '-', '.']);
    for word in words {
        if let Some((_, class)) = SECRET_WORDS.iter().find(|(w, _)| *w == word) {
            return Some(class);
        }
    }
    if upper.ends_with("TOKEN") {
        return Some("TOKEN");
    }
    url_with_password(value).then_some("a URL with a password")
}

/// Whether `value` holds `scheme://user:password@...` (or `scheme://:password@...`).
fn url_with_password(value: &str) -> bool {
    value.match_indices("://").any(|(i, _)| {
        let rest = value.get(i + 3..).unwrap_or_default();
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        authority
            .rsplit_once('@')
            .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    })
}

/// A shell-style pattern with `*` wildcards, matched against a whole name, without regard
/// to case.
pub fn matches(pattern: &str, name: &str) -> bool {
    let (pattern, name) = (pattern.to_ascii_uppercase(), name.to_ascii_uppercase());
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: exact match
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// What removes variables, daemon-wide and per profile.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// If not empty, only names matching one of these pass.
    pub pass: &'a [String],
    /// Extra deny patterns (the ceiling's and the profile's).
    pub deny: &'a [&'a [String]],
    /// Patterns exempt from the built-in classes (the admin's `env_allow`).
    pub allow: &'a [String],
}

impl Rules<'_> {
    /// Why `name=value` may not reach a unit, or `None` if it may.
    pub fn denies(&self, name: &str, value: &str) -> Option<String> {
        if !self.pass.is_empty() && !self.pass.iter().any(|p| matches(p, name)) {
            return Some("it is not on the profile's pass-list".into());
        }
        if let Some(p) = self
            .deny
            .iter()
            .flat_map(|d| d.iter())
            .find(|p| matches(p, name))
        {
            return Some(format!("it matches the deny pattern {p}"));
        }
        let harmless = HARMLESS.iter().any(|p| matches(p, name))
            || self.allow.iter().any(|p| matches(p, name));
        if harmless {
            return None;
        }
        secret_class(name, value).map(|class| format!("it looks like a secret ({class})"))
    }

    /// The environment less what these rules deny.
    pub fn filter(&self, env: Vec<(String, String)>) -> Vec<(String, String)> {
        env.into_iter()
            .filter(|(k, v)| self.denies(k, v).is_none())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        assert!(matches("*_TOKEN", "GITHUB_TOKEN"));
        assert!(matches("*_TOKEN", "github_token"));
        assert!(!matches("*_TOKEN", "TOKEN"));
        assert!(!matches("*_TOKEN", "GITHUB_TOKENS"));
        assert!(matches("AWS_*", "AWS_SECRET_ACCESS_KEY"));
        assert!(!matches("AWS_*", "XAWS_A"));
        assert!(matches("PATH", "PATH"));
        assert!(!matches("PATH", "PATHS"));
        assert!(matches("A*B*C", "AxxBxxC"));
        assert!(!matches("A*B*C", "AxxCxxB"));
        assert!(matches("*", "ANY"));
    }

    /// Every name the issue found passing, and the classes the README promises.
    #[test]
    fn secrets_are_caught_by_class() {
        for name in [
            "PGPASSWORD",
            "MYSQL_PWD",
            "GITHUB_PAT",
            "github_token",
            "GITHUB_TOKEN",
            "OPENAI_KEY",
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "STRIPE_KEY",
            "SECRET_KEY_BASE",
            "SLACK_WEBHOOK_URL",
            "SENTRY_DSN",
            "DOCKER_AUTH_CONFIG",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "NPM_CONFIG__AUTHTOKEN",
            "HF_TOKEN",
            "GHTOKEN",
            "DB_PASS",
            "GPG_PASSPHRASE",
            "my-api-key",
            "SSH_AUTH_SOCK",
            "WARDEN_SOCKET",
            "VAULT_CREDS",
        ] {
            assert!(secret_class(name, "v").is_some(), "{name} passed");
        }
        assert!(secret_class("DATABASE_URL", "postgres://app:hunter2@db/app").is_some());
        assert!(secret_class("REDIS_URL", "redis://:hunter2@cache:6379").is_some());
        for (name, value) in [
            ("DATABASE_URL", "postgres://db/app"),
            ("PROXY", "http://user@proxy:3128"),
            ("TOKENIZERS_PARALLELISM", "false"),
            ("KEYMAP", "us"),
            ("CARGO_TARGET_DIR", "/tmp/t"),
            ("AWS_REGION", "eu-west-1"),
            ("RUST_BACKTRACE", "1"),
            ("XAUTHORITY", "/home/u/.Xauthority"),
            ("PASSENGER_ENV", "x"),
        ] {
            assert_eq!(secret_class(name, value), None, "{name}={value}");
        }
    }

    #[test]
    fn rules_deny_allow_and_pass() {
        let env = |pairs: &[&str]| {
            pairs
                .iter()
                .map(|k| (k.to_string(), "v".to_string()))
                .collect::<Vec<_>>()
        };
        let names = |e: Vec<(String, String)>| e.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        let sent = env(&[
            "PATH",
            "PWD",
            "GITHUB_TOKEN",
            "AWS_REGION",
            "MY_SECRET",
            "SSH_AUTH_SOCK",
            "LANG",
            "CUSTOM",
        ]);
        let none: [&[String]; 0] = [];
        let rules = Rules {
            pass: &[],
            deny: &none,
            allow: &[],
        };
        assert_eq!(
            names(rules.filter(sent.clone())),
            ["PATH", "PWD", "AWS_REGION", "LANG", "CUSTOM"]
        );
        let extra = vec!["CUST*".to_string()];
        let deny = [extra.as_slice()];
        let allow = vec!["github_token".to_string()];
        let rules = Rules {
            pass: &[],
            deny: &deny,
            allow: &allow,
        };
        assert_eq!(
            names(rules.filter(sent.clone())),
            ["PATH", "PWD", "GITHUB_TOKEN", "AWS_REGION", "LANG"]
        );
        assert_eq!(
            rules.denies("CUSTOM", "x").as_deref(),
            Some("it matches the deny pattern CUST*")
        );
        let pass = vec!["PATH".to_string(), "GITHUB_TOKEN".to_string()];
        let rules = Rules {
            pass: &pass,
            deny: &none,
            allow: &[],
        };
        assert_eq!(
            names(rules.filter(sent)),
            ["PATH"],
            "a class wins over the pass-list"
        );
        assert_eq!(
            rules.denies("GITHUB_TOKEN", "x").as_deref(),
            Some("it looks like a secret (TOKEN)")
        );
    }
}
