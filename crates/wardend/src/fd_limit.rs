//! wardend's own descriptor limit. Each session holds a few descriptors (the connection,
//! the peer's pidfd, the unit's handles), so a thousand sessions need more than the soft
//! limit of 1,024 a service gets by default: at start wardend raises its soft limit to the
//! hard one (`packaging/wardend.service` sets the hard one with `LimitNOFILE=`).

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Raise the soft `RLIMIT_NOFILE` to the hard limit; returns the limit now in force.
pub fn raise() -> std::io::Result<Option<u64>> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return Ok(limit.current);
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    )?;
    Ok(limit.maximum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() -> Result<(), Box<dyn std::error::Error>> {
        let before = getrlimit(Resource::Nofile);
        let hard = before.maximum;
        let lower = hard.ok_or("RLIMIT_NOFILE has no hard limit")?.min(1024) / 2;
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(lower),
                maximum: hard,
            },
        )?;
        assert_eq!(getrlimit(Resource::Nofile).current, Some(lower));
        assert_eq!(raise()?, hard);
        assert_eq!(getrlimit(Resource::Nofile).current, hard);
        Ok(())
    }
}
