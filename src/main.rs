//! The `podgroup-sync` binary: the controller (`run`, the default), `explain` and `status`; the
//! command line itself is the library's `cli` module. Called through a link named
//! `kubectl-podgroup_sync` (kubectl's plugin convention), it is `kubectl podgroup-sync`: the same
//! commands, with a subcommand required.

use clap::{CommandFactory, FromArgMatches};

use podgroup_sync::cli::{Cli, Command, PLUGIN_NAME, check, explain, run, status};

fn main() -> std::process::ExitCode {
    let plugin = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|n| n.starts_with(PLUGIN_NAME));
    let mut command = Cli::command();
    if plugin {
        // `kubectl podgroup-sync` with nothing after it shows the help, not a controller.
        command = command
            .name("kubectl podgroup-sync")
            .bin_name("kubectl podgroup-sync")
            .mut_args(|a| a.hide(true))
            .subcommand_required(true)
            .arg_required_else_help(true);
    }
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Some(Command::Explain(args)) => explain::run_explain(args),
        Some(Command::Status(args)) => status::run_status(args),
        Some(Command::Check(args)) => check::run_check(args),
        Some(Command::Run(args)) => run::run_controller(*args),
        None => run::run_controller(cli.run),
    }
}
