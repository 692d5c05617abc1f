//! The `kiln` command line: a thin layer over the library.

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use kiln::graph::text;
use kiln::lower::{self, LowerOptions};
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(name = "kiln", version, about = "Export ML models to StableHLO for the IREE compiler")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Lower a graph text file to a verified StableHLO module.
    Lower {
        /// Graph in kiln's textual form (`-` for stdin).
        graph: PathBuf,
        /// Output `.mlir` file; prints to stdout when absent.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Scope name of `#flow.parameter.named` (`--parameters=SCOPE=FILE`).
        #[arg(long, default_value = "model")]
        param_scope: String,
    },
}

fn read_graph(path: &Path) -> Result<kiln::graph::Graph> {
    let source = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading graph from stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    text::parse(&source).with_context(|| format!("{}", path.display()))
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: the context chain joined with ": ", no backtrace.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Lower { graph, output, param_scope } => {
            let graph = read_graph(&graph)?;
            let mlir = lower::lower_to_string(&graph, &LowerOptions { param_scope })?;
            match output {
                Some(path) => kiln::write_atomically(&path, mlir.as_bytes())?,
                None => print!("{mlir}"),
            }
        }
    }
    Ok(())
}
