//! Runs `vramscope watch` until the lead wires it into the main CLI:
//! `cargo run --example watch -- --once --json`.

use clap::Parser;
use vramscope::app::watch::{run_watch, WatchArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    watch: WatchArgs,
}

fn main() -> anyhow::Result<()> {
    run_watch(Cli::parse().watch)
}
