//! The `podgroup-sync` binary: the controller (`run`, the default) and `explain`; the command
//! line itself is the library's `cli` module.

use clap::Parser;

use podgroup_sync::cli::{Cli, Command, explain, run};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Explain(args)) => explain::run_explain(args),
        Some(Command::Run(args)) => run::run_controller(*args),
        None => run::run_controller(cli.run),
    }
}
