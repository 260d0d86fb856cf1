//! `warden-sh`: the shell shim that runs `/bin/sh` through wardend (see [`warden::sh`]).

fn main() {
    std::process::exit(warden::sh::sh_main(std::env::args_os()));
}
