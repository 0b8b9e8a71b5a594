//! ztunnel binary: parses flags and environment, then starts the app.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use redirection::host_capture::HostCapture;
use redirection::iptables::{self, Backend};
use shared_types::net::IpFamily;
use ztunnel::config::Config;
use ztunnel::identity::CertificateAuthority;

#[derive(Parser)]
#[command(
    name = "ztunnel",
    version,
    about = "Ambient mesh node proxy: HBONE over mutual TLS",
    // Read outside the flags; listed so a chart's env can be checked against it.
    after_help = "Environment also read: RUST_LOG, LOG_FORMAT, RUST_BACKTRACE, ISTIO_META_*, XDS_HEADER_*, CA_HEADER_*"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    config: Config,
}

#[derive(Subcommand)]
enum Command {
    /// Mesh CA helpers.
    Ca {
        #[command(subcommand)]
        command: CaCommand,
    },
    /// Host traffic capture for dedicated mode (VMs): send outbound TCP to ztunnel.
    Capture {
        #[command(subcommand)]
        action: CaptureAction,
    },
}

#[derive(Subcommand)]
enum CaCommand {
    /// Write a fresh self-signed root in Istio's plug-in CA layout.
    Init {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, env = "TRUST_DOMAIN", default_value = shared_types::constants::DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
    },
}

#[derive(Subcommand)]
enum CaptureAction {
    /// Print the iptables-restore input without applying it.
    Print(CaptureArgs),
    /// Install (or replace) the rules in one transaction.
    Apply(CaptureArgs),
    /// Remove the rules; nothing else is touched.
    Remove {
        #[arg(long)]
        ipv6: bool,
        #[command(flatten)]
        backend: BackendArg,
    },
}

#[derive(clap::Args)]
struct BackendArg {
    /// The iptables backend: `nft`, `legacy`, or `auto` (the one the host's rules use).
    #[arg(
        long = "iptables-backend",
        env = "IPTABLES_BACKEND",
        default_value = "auto"
    )]
    iptables_backend: String,
}

impl BackendArg {
    fn resolve(&self) -> anyhow::Result<Backend> {
        Ok(match self.iptables_backend.as_str() {
            "auto" => Backend::detect(),
            other => other.parse()?,
        })
    }
}

#[derive(clap::Args)]
struct CaptureArgs {
    /// Destination CIDRs never captured (repeatable), e.g. a management network.
    #[arg(long = "exclude-cidr")]
    exclude_cidrs: Vec<ipnet::IpNet>,
    /// Destination ports never captured (repeatable), e.g. 22.
    #[arg(long = "exclude-port")]
    exclude_ports: Vec<u16>,
    /// Local ports whose inbound plaintext traffic goes through ztunnel (repeatable).
    #[arg(long = "inbound-port")]
    inbound_ports: Vec<u16>,
    #[arg(long, env = "PACKET_MARK", default_value_t = shared_types::constants::DEFAULT_PACKET_MARK)]
    mark: u32,
    /// Also (or only) for IPv6, via ip6tables.
    #[arg(long)]
    ipv6: bool,
    #[command(flatten)]
    backend: BackendArg,
}

impl CaptureArgs {
    fn rule_set(&self) -> redirection::RuleSet {
        let capture = HostCapture {
            mark: self.mark,
            exclude_cidrs: self.exclude_cidrs.clone(),
            exclude_ports: self.exclude_ports.clone(),
            inbound_ports: self.inbound_ports.clone(),
        };
        capture.rule_set(family(self.ipv6))
    }
}

fn family(ipv6: bool) -> IpFamily {
    if ipv6 {
        IpFamily::V6
    } else {
        IpFamily::V4
    }
}

/// mimalloc keeps freed memory for reuse: the data plane allocates and frees frame
/// buffers at a high rate, which glibc's allocator turns into page faults.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Ca {
            command: CaCommand::Init { out, trust_domain },
        }) => {
            let ca = CertificateAuthority::generate_self_signed(&trust_domain)?;
            ca.write(&out)?;
            println!(
                "wrote a self-signed mesh root for {trust_domain} to {}",
                out.display()
            );
            Ok(())
        }
        Some(Command::Capture { action }) => match action {
            CaptureAction::Print(args) => {
                print!("{}", args.rule_set().render());
                Ok(())
            }
            CaptureAction::Apply(args) => {
                iptables::apply(args.backend.resolve()?, &args.rule_set())?;
                println!(
                    "outbound TCP now goes through ztunnel (chain {})",
                    redirection::rules::CHAIN_OUTPUT
                );
                Ok(())
            }
            CaptureAction::Remove { ipv6, backend } => {
                iptables::remove(backend.resolve()?, &HostCapture::removal(family(ipv6)))?;
                println!("capture rules removed");
                Ok(())
            }
        },
        None => {
            // First, while this is the only thread: see `fdtable`.
            let reserved = ztunnel::fdtable::reserve(ztunnel::fdtable::RESERVED);
            let config = cli.config;
            let logging = mesh_runtime::logging::init(&mesh_runtime::logging::Settings::from_env(
                "info",
                Some("ztunnel::"),
            ));
            match reserved {
                Ok(slots) => tracing::debug!(slots, "descriptor table reserved"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not grow the descriptor table up front; sockets may stall while it grows")
                }
            }
            let workers = config.worker_threads;
            ztunnel::workers::run(workers, ztunnel::app::run(config, Some(logging)))?
        }
    }
}
