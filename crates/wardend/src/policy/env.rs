//! The command's environment: what the client sent, less what policy removes — the
//! built-in deny list (tokens, secrets, cloud keys, agent sockets), the ceiling's and the
//! profile's deny patterns, and, when the profile has a pass-list, everything not on it.

use super::profile::BUILTIN_ENV_DENY;

/// A shell-style pattern with `*` wildcards, matched against a whole name.
pub fn matches(pattern: &str, name: &str) -> bool {
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

/// Filter `env` by the deny lists and, if not empty, the pass-list.
pub fn filter(
    env: Vec<(String, String)>,
    pass: &[String],
    deny: &[&[String]],
) -> Vec<(String, String)> {
    env.into_iter()
        .filter(|(k, _)| pass.is_empty() || pass.iter().any(|p| matches(p, k)))
        .filter(|(k, _)| !BUILTIN_ENV_DENY.iter().any(|p| matches(p, k)))
        .filter(|(k, _)| !deny.iter().flat_map(|d| d.iter()).any(|p| matches(p, k)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        assert!(matches("*_TOKEN", "GITHUB_TOKEN"));
        assert!(matches("*_TOKEN", "_TOKEN"));
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

    #[test]
    fn deny_and_pass_lists() {
        let env = |pairs: &[&str]| {
            pairs
                .iter()
                .map(|k| (k.to_string(), "v".to_string()))
                .collect::<Vec<_>>()
        };
        let names = |e: Vec<(String, String)>| e.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        let sent = env(&[
            "PATH",
            "GITHUB_TOKEN",
            "AWS_REGION",
            "MY_SECRET",
            "SSH_AUTH_SOCK",
            "LANG",
            "CUSTOM",
        ]);
        assert_eq!(
            names(filter(sent.clone(), &[], &[])),
            ["PATH", "LANG", "CUSTOM"]
        );
        let extra = vec!["CUST*".to_string()];
        assert_eq!(
            names(filter(sent.clone(), &[], &[&extra])),
            ["PATH", "LANG"]
        );
        let pass = vec!["PATH".to_string(), "GITHUB_TOKEN".to_string()];
        assert_eq!(
            names(filter(sent, &pass, &[])),
            ["PATH"],
            "deny wins over pass"
        );
    }
}
