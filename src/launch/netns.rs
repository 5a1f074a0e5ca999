//! Network namespaces for `federico swarm --netns` (Linux, as root): each node runs in its own
//! namespace, joined to the others by a veth link on a bridge, and partitions are cut in the
//! kernel (issue 4).
//!
//! Owns: creating and removing the namespaces, links and addresses of one swarm seed (all with
//! `ip` from iproute2); the address of each silo; cutting and restoring the paths between silos
//! as blackhole routes in each silo's namespace, so packets to the other side are dropped
//! silently and open connections stall and time out as over a real partition, instead of being
//! closed and refused by the nodes themselves; the command that starts a process inside a
//! silo's namespace.
//! Must not: decide when to cut or heal (`launch::faults` does), or judge anything.
//!
//! Layout of a seed with K silos on `10.A.B.0/24`:
//!
//! ```text
//!   federico-P-N-0 (eth0 10.A.B.1) ─┐
//!   federico-P-N-1 (eth0 10.A.B.2) ─┼─ br0 in federico-P-N-hub ── fhP-N (10.A.B.254, the host)
//!   …                               ┘
//! ```
//! The host end lets the launcher reach each node's control channel; nothing else of the
//! machine's network is touched, and dropping the [`Netns`] removes it all.

use anyhow::{Context, bail};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// Every silo listens on this port of its own address.
pub(crate) const NODE_PORT: u16 = 4001;

static SEQUENCE: AtomicU32 = AtomicU32::new(0);

/// The namespaces of one swarm seed; removed when dropped.
pub(crate) struct Netns {
    prefix: String,
    host_if: String,
    net: [u8; 2],
    k: usize,
    /// Per silo, the silos its namespace has a blackhole route to.
    cut: Mutex<Vec<BTreeSet<usize>>>,
    created: Mutex<Vec<String>>,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| "running `ip` (iproute2 is needed for --netns)".to_string())?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Why `--netns` cannot run here, if it cannot: not Linux, not root, no `ip`, or namespaces
/// not allowed.
pub(crate) fn unavailable() -> Option<String> {
    if !cfg!(target_os = "linux") {
        return Some("--netns needs Linux network namespaces".into());
    }
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("--netns needs root (it creates network namespaces and links)".into());
    }
    let probe = format!("federico-probe-{}", std::process::id());
    if let Err(e) = ip(&["netns", "add", &probe]) {
        return Some(format!(
            "--netns cannot create a network namespace here: {e}"
        ));
    }
    let _ = ip(&["netns", "del", &probe]);
    None
}

impl Netns {
    /// Creates the namespaces, bridge and links for `k` silos.
    pub(crate) fn create(k: usize) -> anyhow::Result<Self> {
        if let Some(why) = unavailable() {
            bail!(why);
        }
        if k > 250 {
            bail!("--netns supports at most 250 silos, the scenario has {k}");
        }
        let pid = std::process::id();
        let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        // A /24 of 10.200.0.0/13 the host does not use already.
        let used = Command::new("ip")
            .args(["-4", "-o", "addr", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let routes = Command::new("ip")
            .args(["-4", "route", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let start = pid.wrapping_mul(31).wrapping_add(seq.wrapping_mul(7)) % 2048;
        let net = (0..2048u32)
            .map(|d| {
                let n = (start + d) % 2048;
                [200 + (n / 256) as u8, (n % 256) as u8]
            })
            .find(|[a, b]| {
                let p = format!("10.{a}.{b}.");
                !used.contains(&p) && !routes.contains(&p)
            })
            .context("no free 10.200.0.0/13 subnet for --netns")?;
        let prefix = format!("federico-{pid}-{seq}");
        let me = Self {
            host_if: format!("fh{}-{seq}", pid % 1_000_000),
            prefix,
            net,
            k,
            cut: Mutex::new(vec![BTreeSet::new(); k]),
            created: Mutex::new(Vec::new()),
        };
        me.build().inspect_err(|_| me.remove())?;
        Ok(me)
    }

    fn add_namespace(&self, name: &str) -> anyhow::Result<()> {
        ip(&["netns", "add", name])?;
        self.created.lock().unwrap().push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])
    }

    fn build(&self) -> anyhow::Result<()> {
        let hub = self.hub();
        self.add_namespace(&hub)?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for i in 0..self.k {
            let ns = self.namespace(i);
            self.add_namespace(&ns)?;
            let v = format!("v{i}");
            ip(&[
                "-n", &hub, "link", "add", &v, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            ip(&["-n", &hub, "link", "set", &v, "master", "br0"])?;
            ip(&["-n", &hub, "link", "set", &v, "up"])?;
            let addr = format!("{}/24", self.addr(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        ip(&[
            "link",
            "add",
            &self.host_if,
            "type",
            "veth",
            "peer",
            "name",
            "host",
            "netns",
            &hub,
        ])?;
        ip(&["-n", &hub, "link", "set", "host", "master", "br0"])?;
        ip(&["-n", &hub, "link", "set", "host", "up"])?;
        let host = format!("{}/24", self.host_addr());
        ip(&["addr", "add", &host, "dev", &self.host_if])?;
        ip(&["link", "set", &self.host_if, "up"])?;
        Ok(())
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    /// The namespace silo `i` runs in.
    pub(crate) fn namespace(&self, i: usize) -> String {
        format!("{}-{i}", self.prefix)
    }

    /// Silo `i`'s address.
    pub(crate) fn addr(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net[0], self.net[1], i as u8 + 1)
    }

    /// The launcher's address on the bridge.
    pub(crate) fn host_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net[0], self.net[1], 254)
    }

    /// A command that runs `exe` inside silo `i`'s namespace (`ip netns exec` replaces itself
    /// with `exe`, so the child's pid is the node's).
    pub(crate) fn command(&self, i: usize, exe: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.namespace(i)]).arg(exe);
        c
    }

    /// Drops, in silo `i`'s namespace, every packet to the silos in `others`.
    pub(crate) fn cut(&self, i: usize, others: &[usize]) -> anyhow::Result<()> {
        let ns = self.namespace(i);
        let mut cut = self.cut.lock().unwrap();
        for &j in others {
            if j != i && cut[i].insert(j) {
                let dst = format!("{}/32", self.addr(j));
                ip(&["-n", &ns, "route", "add", "blackhole", &dst])?;
            }
        }
        Ok(())
    }

    /// Removes every cut of silo `i`.
    pub(crate) fn restore(&self, i: usize) -> anyhow::Result<()> {
        let ns = self.namespace(i);
        let mut cut = self.cut.lock().unwrap();
        for j in std::mem::take(&mut cut[i]) {
            let dst = format!("{}/32", self.addr(j));
            ip(&["-n", &ns, "route", "del", "blackhole", &dst])?;
        }
        Ok(())
    }

    fn remove(&self) {
        let _ = ip(&["link", "del", &self.host_if]);
        for ns in self.created.lock().unwrap().drain(..).rev() {
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.remove();
    }
}
