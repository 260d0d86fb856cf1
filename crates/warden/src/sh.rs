//! `warden-sh`, the shell shim: set an agent's `SHELL` to it and every command the agent runs
//! becomes a unit. It understands the ways agents call their shell and always runs `/bin/sh`
//! **through wardend**, never directly (running it directly would let anything that calls
//! `$SHELL script` or pipes into `$SHELL` escape the sandbox):
//!
//! | called as | runs in a unit |
//! |---|---|
//! | `warden-sh -c CMD [NAME [ARG...]]` | `/bin/sh -c CMD [NAME [ARG...]]` |
//! | `warden-sh -lc CMD`, `-l -c CMD`, `--login -c CMD`, `-ec CMD`, `-o pipefail -c CMD` | the same flags, then `-c CMD` |
//! | `warden-sh SCRIPT [ARG...]` | `/bin/sh SCRIPT [ARG...]` |
//! | `warden-sh [-s] [ARG...]` with stdin not a terminal | `/bin/sh -s [ARG...]` (reads commands from stdin) |
//!
//! Refused with a message and exit 125: an interactive shell (`-i`, or no command with a
//! terminal on stdin: that needs `--pty`, which protocol v1 daemons do not support), and any
//! option `/bin/sh` flags it does not know.
//!
//! The unit gets the caller's environment with `SHELL=/bin/sh` (a unit cannot reach wardend,
//! so a nested `$SHELL` must be a real shell). `WARDEN_SOCKET` picks the socket and
//! `WARDEN_PROFILE` the profile.

use std::ffi::OsString;
use std::io::Write;

use crate::client::{self, RunOptions};
use crate::exit::EXIT_WARDEN_FAILED;

/// The shell run inside units.
pub const SHELL: &str = "/bin/sh";
/// The environment variable naming the profile `warden-sh` asks for.
pub const PROFILE_ENV: &str = "WARDEN_PROFILE";

/// Single-letter options passed through to `/bin/sh`.
const PASSED_FLAGS: &str = "aefhlmnuvxC";

/// How `/bin/sh` reads its commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `-c COMMAND`.
    Command(String),
    /// A script file.
    Script(String),
    /// Standard input (`-s`, or nothing).
    Stdin,
}

/// A parsed `warden-sh` invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShInvocation {
    /// Options passed through, e.g. `-l`, `-e`, `-o pipefail`.
    pub flags: Vec<String>,
    /// Where the commands come from.
    pub source: Source,
    /// `$0` and positional parameters (for `-c`), or the script's / stdin's arguments.
    pub args: Vec<String>,
}

impl ShInvocation {
    /// The argv to run in the unit.
    pub fn argv(&self) -> Vec<String> {
        let mut argv = vec![SHELL.to_owned()];
        argv.extend(self.flags.iter().cloned());
        match &self.source {
            Source::Command(cmd) => {
                argv.push("-c".to_owned());
                argv.push(cmd.clone());
            }
            Source::Script(path) => argv.push(path.clone()),
            Source::Stdin => argv.push("-s".to_owned()),
        }
        argv.extend(self.args.iter().cloned());
        argv
    }
}

/// What `warden-sh` was asked that is not a command to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShRequest {
    /// Run this.
    Run(ShInvocation),
    /// Print usage.
    Help,
}

/// Parse `warden-sh`'s arguments (without `argv[0]`).
pub fn parse(args: &[String]) -> Result<ShRequest, String> {
    let mut flags = Vec::new();
    let mut command_mode = false;
    let mut stdin_mode = false;
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        let is_option = (arg.starts_with('-') || arg.starts_with('+')) && arg.len() > 1;
        if !is_option {
            break;
        }
        i += 1;
        match arg.as_str() {
            "--" => break,
            "--help" => return Ok(ShRequest::Help),
            "--login" => flags.push("-l".to_owned()),
            "-o" | "+o" => {
                let name = args
                    .get(i)
                    .ok_or_else(|| format!("warden-sh: {arg} requires an option name"))?;
                i += 1;
                flags.push(arg.clone());
                flags.push(name.clone());
            }
            long if long.starts_with("--") => {
                return Err(format!("warden-sh: unsupported option {long}"));
            }
            cluster => {
                let (sign, letters) = cluster.split_at(1);
                let mut passed = String::new();
                for c in letters.chars() {
                    match c {
                        'c' if sign == "-" => command_mode = true,
                        's' if sign == "-" => stdin_mode = true,
                        'i' => return Err(
                            "warden-sh: interactive shells are not supported (they need --pty, \
                                 which this daemon does not support yet)"
                                .to_owned(),
                        ),
                        c if PASSED_FLAGS.contains(c) => passed.push(c),
                        c => return Err(format!("warden-sh: unsupported option {sign}{c}")),
                    }
                }
                if !passed.is_empty() {
                    flags.push(format!("{sign}{passed}"));
                }
            }
        }
    }
    let rest = args.get(i..).unwrap_or_default();
    let (source, args) = if command_mode {
        if stdin_mode {
            return Err("warden-sh: -c and -s cannot be used together".to_owned());
        }
        let (cmd, args) = rest
            .split_first()
            .ok_or_else(|| "warden-sh: -c requires an argument".to_owned())?;
        (Source::Command(cmd.clone()), args.to_vec())
    } else if stdin_mode || rest.is_empty() {
        (Source::Stdin, rest.to_vec())
    } else {
        (Source::Script(rest[0].clone()), rest[1..].to_vec())
    };
    Ok(ShRequest::Run(ShInvocation {
        flags,
        source,
        args,
    }))
}

const USAGE: &str = "usage: warden-sh [-lefux] [-o OPTION] -c COMMAND [NAME [ARG...]]
       warden-sh [OPTIONS] SCRIPT [ARG...]
       warden-sh [OPTIONS] [-s] [ARG...] < COMMANDS
Runs /bin/sh with these arguments as a wardend unit (see `warden run`).
Environment: WARDEN_SOCKET (socket), WARDEN_PROFILE (profile).";

/// The `warden-sh` program: returns its exit status.
pub fn sh_main(args: impl IntoIterator<Item = OsString>) -> i32 {
    let args: Result<Vec<String>, OsString> =
        args.into_iter().skip(1).map(|a| a.into_string()).collect();
    let args = match args {
        Ok(args) => args,
        Err(bad) => {
            let _ = writeln!(
                std::io::stderr(),
                "warden-sh: argument {bad:?} is not UTF-8, which protocol v1 cannot carry"
            );
            return EXIT_WARDEN_FAILED;
        }
    };
    let invocation = match parse(&args) {
        Ok(ShRequest::Run(inv)) => inv,
        Ok(ShRequest::Help) => {
            println!("{USAGE}");
            return 0;
        }
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "{message}");
            return EXIT_WARDEN_FAILED;
        }
    };
    if invocation.source == Source::Stdin && rustix::termios::isatty(rustix::stdio::stdin()) {
        let _ = writeln!(
            std::io::stderr(),
            "warden-sh: interactive shells are not supported (they need --pty, which this \
             daemon does not support yet); use warden-sh -c COMMAND"
        );
        return EXIT_WARDEN_FAILED;
    }
    let mut opts = RunOptions::new(client::socket_path(None), invocation.argv());
    opts.set_env("SHELL", SHELL);
    opts.profile = std::env::var(PROFILE_ENV).ok().filter(|p| !p.is_empty());
    crate::cli::execute_run(&opts, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Vec<String>, String> {
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        match parse(&args)? {
            ShRequest::Run(inv) => Ok(inv.argv()),
            ShRequest::Help => Err("help".to_owned()),
        }
    }

    fn v(args: &[&str]) -> Result<Vec<String>, String> {
        Ok(args.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn the_ways_agents_call_their_shell() {
        assert_eq!(run(&["-c", "echo hi"]), v(&["/bin/sh", "-c", "echo hi"]));
        assert_eq!(
            run(&["-lc", "echo hi"]),
            v(&["/bin/sh", "-l", "-c", "echo hi"])
        );
        assert_eq!(
            run(&["-cl", "echo hi"]),
            v(&["/bin/sh", "-l", "-c", "echo hi"])
        );
        assert_eq!(run(&["-l", "-c", "x"]), v(&["/bin/sh", "-l", "-c", "x"]));
        assert_eq!(
            run(&["--login", "-c", "x"]),
            v(&["/bin/sh", "-l", "-c", "x"])
        );
        assert_eq!(run(&["-ec", "x"]), v(&["/bin/sh", "-e", "-c", "x"]));
        assert_eq!(
            run(&["-o", "pipefail", "-c", "x"]),
            v(&["/bin/sh", "-o", "pipefail", "-c", "x"])
        );
        assert_eq!(
            run(&["-c", "echo $0 $1", "name", "a", "-x"]),
            v(&["/bin/sh", "-c", "echo $0 $1", "name", "a", "-x"])
        );
        // As in sh, options go on until the first non-option: here `-x` is a flag.
        assert_eq!(
            run(&["-c", "-x"]),
            Err("warden-sh: -c requires an argument".to_owned())
        );
        assert_eq!(run(&["-c", "--", "-x"]), v(&["/bin/sh", "-c", "-x"]));
        assert_eq!(run(&["script.sh", "a"]), v(&["/bin/sh", "script.sh", "a"]));
        assert_eq!(
            run(&["-e", "script.sh"]),
            v(&["/bin/sh", "-e", "script.sh"])
        );
        assert_eq!(run(&[]), v(&["/bin/sh", "-s"]));
        assert_eq!(run(&["-s", "a", "b"]), v(&["/bin/sh", "-s", "a", "b"]));
        assert_eq!(run(&["+e", "-c", "x"]), v(&["/bin/sh", "+e", "-c", "x"]));
    }

    #[test]
    fn what_is_refused() {
        assert_eq!(
            run(&["-c"]),
            Err("warden-sh: -c requires an argument".to_owned())
        );
        assert!(matches!(run(&["-i"]), Err(m) if m.contains("interactive")));
        assert!(matches!(run(&["-ic", "x"]), Err(m) if m.contains("interactive")));
        assert!(matches!(run(&["-Q", "-c", "x"]), Err(m) if m.contains("-Q")));
        assert!(matches!(run(&["--norc", "-c", "x"]), Err(m) if m.contains("--norc")));
        assert!(matches!(run(&["-cs", "x"]), Err(m) if m.contains("together")));
        assert!(matches!(run(&["-o"]), Err(m) if m.contains("option name")));
        assert_eq!(run(&["--help"]), Err("help".to_owned()));
    }
}
