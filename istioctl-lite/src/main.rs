//! istioctl-lite: parses flags and hands each command to its module.

mod apply;
mod ca;
mod charts;
mod cli;
mod configdump;
mod crds;
mod dataplane;
mod install;
mod kubeclient;
mod output;
mod precheck;
mod proxystatus;
mod rollout;
mod waypoint;
mod xds;
mod zfetch;
mod zlog;
mod zroutes;
mod ztables;

use clap::Parser;

use cli::{CaCommand, Cli, Command, DataplaneCommand, WaypointCommand, ZtunnelConfigCommand};

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
        Command::ZtunnelConfig(args) => ztunnel_config(g, &args.command).await,
        Command::Precheck(args) => precheck::run(g, args).await,
        Command::ProxyStatus(args) => proxystatus::run(g, args).await,
        Command::Waypoint {
            command: WaypointCommand::Apply(args),
        } => waypoint::apply(g, args).await,
        Command::Waypoint {
            command: WaypointCommand::Generate(args),
        } => waypoint::generate(g, args),
        Command::Waypoint {
            command: WaypointCommand::List(args),
        } => waypoint::list(g, args).await,
        Command::Waypoint {
            command: WaypointCommand::Delete(args),
        } => waypoint::delete(g, args).await,
        Command::Waypoint {
            command: WaypointCommand::Status(args),
        } => waypoint::status(g, args).await,
    }
}

/// `ztunnel-config`: `log` talks to `/logging`; the rest read `/config_dump`.
async fn ztunnel_config(g: &cli::Global, command: &ZtunnelConfigCommand) -> anyhow::Result<()> {
    use ztables::View;
    let mut proxy = zfetch::Proxy::Ztunnel;
    let (source, view, single) = match command {
        ZtunnelConfigCommand::Log(args) => return zlog::run(g, args).await,
        ZtunnelConfigCommand::Workload(a) => (
            &a.source,
            View::Workloads {
                address: a.address.clone(),
                namespace: a.workload_namespace.clone(),
                node: a.workload_node.clone(),
            },
            false,
        ),
        ZtunnelConfigCommand::Certificate(source) => (source, View::Certificates, true),
        ZtunnelConfigCommand::Service(a) => (
            &a.source,
            View::Services {
                namespace: a.service_namespace.clone(),
            },
            false,
        ),
        ZtunnelConfigCommand::Policy(a) => (
            &a.source,
            View::Policies {
                namespace: a.policy_namespace.clone(),
            },
            false,
        ),
        ZtunnelConfigCommand::Route(a) => {
            proxy = zfetch::Proxy::Waypoint;
            let view = View::Routes {
                namespace: a.route_namespace.clone(),
            };
            (&a.source, view, true)
        }
        ZtunnelConfigCommand::All(source) => (source, View::All, false),
        ZtunnelConfigCommand::Connections(a) => (
            &a.source,
            View::Connections {
                namespace: a.workload_namespace.clone(),
                direction: a.direction.clone(),
                raw: a.raw,
            },
            true,
        ),
    };
    let raw = zfetch::load(g, source, single, proxy).await?;
    let dump = configdump::Dump::parse(&raw)?;
    let now = time::OffsetDateTime::now_utc();
    print!("{}", ztables::render(&raw, &dump, &view, g.output, now)?);
    Ok(())
}
