use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = trainer::Cli::parse();
    offgnn_shared::report::init_logging();
    match trainer::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
