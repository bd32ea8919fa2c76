//! The `trainer` binary: parses its flags, installs logging, runs the library's
//! [`trainer::run`] and maps an error to its exit code.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    trainer::passive_openmp_where_it_helps();
    trainer::retain_freed_memory();
    let cli = trainer::Cli::parse();
    offgnn_shared::report::init_logging();
    match trainer::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            offgnn_shared::report::print_error(&format!("{e:#}"));
            offgnn_shared::signals::failure_code()
        }
    }
}
