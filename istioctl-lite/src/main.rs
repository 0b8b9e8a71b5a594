//! istioctl-lite: parses flags and hands each command to its module.

mod apply;
mod ca;
mod charts;
mod cli;
mod configdump;
mod dataplane;
mod install;
mod kubeclient;
mod output;
mod precheck;
mod proxystatus;
mod rollout;
mod xds;
mod ztables;

use clap::Parser;

use cli::{CaCommand, Cli, Command, DataplaneCommand};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("✘ error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let g = &cli.global;
    match &cli.command {
        Command::Install(args) => install::install(g, args).await,
        Command::Uninstall(args) => install::uninstall(g, args).await,
        Command::Ca {
            command: CaCommand::Init(args),
        } => ca::init(g, args).await,
        Command::DataplaneMode {
            command: DataplaneCommand::Enable(args),
        } => dataplane::run(g, args, true).await,
        Command::DataplaneMode {
            command: DataplaneCommand::Disable(args),
        } => dataplane::run(g, args, false).await,
        Command::ZtunnelConfig(args) => {
            let dump = configdump::load(g, args).await?;
            ztables::print(
                &dump,
                args.section,
                &ztables::Filter::from_args(args),
                g.output,
            )
        }
        Command::Precheck(args) => precheck::run(g, args).await,
        Command::ProxyStatus(args) => proxystatus::run(g, args).await,
    }
}
