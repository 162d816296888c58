//! `einmal completions SHELL` and `einmal man`: generated from the same clap
//! definition the binary parses with, so they never drift from the flags.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use clap_complete::Shell;
use einmal_cli::error::CliError;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write one page per command (einmal.1, einmal-serve.1, …) into this existing
    /// directory instead of printing einmal(1).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The completion script for `args.shell` on stdout.
pub fn completions(
    args: CompletionsArgs,
    mut command: clap::Command,
) -> Result<ExitCode, CliError> {
    clap_complete::generate(args.shell, &mut command, "einmal", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}

/// einmal(1) in roff on stdout (every command with its summary, the exit codes), or
/// with `--dir` one page per command.
pub fn man(args: ManArgs, command: clap::Command) -> Result<ExitCode, CliError> {
    if let Some(dir) = args.dir {
        if !dir.is_dir() {
            return Err(CliError::NotFound(format!(
                "{}: no such directory",
                dir.display()
            )));
        }
        clap_mangen::generate_to(command, &dir)
            .map_err(|e| format!("cannot write the man pages to {}: {e}", dir.display()))?;
        println!("man pages written to {}", dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = Vec::new();
    clap_mangen::Man::new(command)
        .render(&mut out)
        .map_err(|e| format!("cannot render the man page: {e}"))?;
    use std::io::Write;
    std::io::stdout()
        .write_all(&out)
        .map_err(|e| format!("cannot write the man page: {e}"))?;
    Ok(ExitCode::SUCCESS)
}
