//! `wringer rank`: the rank worker, started by `wringer run` (locally, over SSH, or as a
//! Slurm task), never by hand.

use std::net::SocketAddr;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    pub rendezvous: SocketAddr,
    #[arg(long, required_unless_present = "slurm")]
    pub rank: Option<u32>,
    /// The address this rank's listeners bind to and advertise to the other ranks.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: std::net::IpAddr,
    /// Read the run token from the first line of stdin (ranks started over SSH), and exit
    /// when stdin closes.
    #[arg(long)]
    pub token_stdin: bool,
    /// Started as a Slurm task laid out `cyclic` or `block:N`: the rank comes from
    /// SLURM_PROCID, and its end is reported on stdout.
    #[arg(long, conflicts_with = "rank")]
    pub slurm: Option<String>,
    /// Slurm tasks: the address to bind on each node of the step, in node order.
    #[arg(long, value_delimiter = ',', requires = "slurm")]
    pub bind_per_node: Vec<std::net::IpAddr>,
    /// Slurm tasks: bind to this interface's IPv4 address on each node.
    #[arg(long, requires = "slurm", conflicts_with = "bind_per_node")]
    pub bind_interface: Option<String>,
    /// Slurm tasks: run the rank under this command (strace, for the lifecycle audit),
    /// one word each; `{rank}` becomes the rank.
    #[arg(long = "trace-word", requires = "slurm", allow_hyphen_values = true)]
    pub trace_words: Vec<String>,
    /// The verbs audit: re-exec with the verbs observer preloaded, tracing to
    /// `PREFIX.<pid>.verbs` (this process and every program it starts).
    #[arg(long)]
    pub verbs_trace: Option<String>,
    /// The happens-before audit: re-exec with the sync observer preloaded (this process and
    /// every program it starts report their pthread synchronisation into the syscall trace).
    #[arg(long)]
    pub sync_observer: bool,
    /// Where the sync observer writes each process's module map (`PREFIX.<pid>.maps`), for
    /// call sites as file:line.
    #[arg(long, requires = "sync_observer")]
    pub sync_maps: Option<String>,
    /// Perturbations without a tracer: re-exec with the perturbation observer preloaded,
    /// delaying calls by these rules (`SYSCALL,ENTER_US,EXIT_US,FIRST,LAST,STEP;…`).
    #[arg(long)]
    pub perturb_rules: Option<String>,
    /// Where each perturbed process writes which calls it delayed (`PREFIX.<pid>`).
    #[arg(long, requires = "perturb_rules")]
    pub perturb_log: Option<String>,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let Args {
        rendezvous,
        rank,
        bind,
        token_stdin,
        slurm,
        bind_per_node,
        bind_interface,
        trace_words,
        verbs_trace,
        sync_observer,
        sync_maps,
        perturb_rules,
        perturb_log,
    } = a;
    if let Some(prefix) = &sync_maps {
        std::env::set_var(wringer::rank::sync_observer::MAPS_ENV, prefix);
    }
    if sync_observer {
        wringer::rank::sync_observer::preload_self()?;
    }
    if let Some(rules) = &perturb_rules {
        wringer::rank::perturb_observer::preload_self(rules, perturb_log.as_deref())?;
    }
    if let Some(prefix) = &verbs_trace {
        wringer::rank::verbs_observer::preload_self(prefix)?;
    }
    let code = match (slurm, rank) {
        (Some(layout), _) => wringer::rank::slurm_task::run(
            rendezvous,
            &layout,
            wringer::rank::slurm_task::Binding {
                per_node: &bind_per_node,
                interface: bind_interface.as_deref(),
            },
            &trace_words,
        )
        .map(i32::from),
        (None, Some(rank)) => {
            wringer::rank::worker::run(rendezvous, rank, bind, token_stdin).map(|()| 0)
        }
        (None, None) => Err(anyhow::anyhow!("`wringer rank` needs --rank or --slurm")),
    };
    wringer::rank::preload::remove_written();
    code
}
