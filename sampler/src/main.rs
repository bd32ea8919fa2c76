//! The `sampler` binary: parses its flags, installs logging, runs the library's
//! [`sampler::run`] and maps an error to its exit code.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = sampler::Cli::parse();
    offgnn_shared::report::init_logging();
    match sampler::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            offgnn_shared::report::print_error(&format!("{e:#}"));
            offgnn_shared::signals::failure_code()
        }
    }
}
