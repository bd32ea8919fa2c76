//! The `packer` binary: parses its flags, installs logging, runs the library's
//! [`packer::run`] and maps an error to its exit code.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Nothing runs beside `main` yet, so this takes effect.
    packer::heap::share_one_arena();
    let cli = packer::Cli::parse();
    offgnn_shared::report::init_logging();
    match packer::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            offgnn_shared::report::print_error(&format!("{e:#}"));
            offgnn_shared::signals::failure_code()
        }
    }
}
