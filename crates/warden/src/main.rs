//! `warden`: the client CLI (see [`warden::cli`]).

fn main() {
    std::process::exit(warden::cli::warden_main(std::env::args_os()));
}
