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
//!
//! Behind NAT (`federico swarm --nat S`), the bridge is the public internet and the silos sit at
//! S sites (silo i at site i mod S), each behind a router that masquerades its LAN (`nft`) and
//! forwards nothing new inward but the launcher's control connections; a relay has the only
//! open port on the public side:
//!
//! ```text
//!   silo (10.A.C.i+1) ─ lan ─ federico-P-N-r0 (NAT, 10.A.B.101) ─┐
//!   silo …            ─┘                                          ├─ br0 ── host (10.A.B.254)
//!   silo (10.A.D.i+1) ─ lan ─ federico-P-N-r1 (NAT, 10.A.B.102) ─┤
//!                           federico-P-N-relay (10.A.B.200)      ─┘
//! ```

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
    /// Behind NAT: each site's LAN (`10.A.C.0/24`); empty for one flat bridge.
    sites: Vec<[u8; 2]>,
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

/// Runs `program args` inside namespace `ns`.
fn netns_exec(ns: &str, program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .output()
        .with_context(|| format!("running {program} in {ns}"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` in {ns} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Loads `rules` into namespace `ns`'s nftables.
fn nft(ns: &str, rules: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running nft (the nftables package is needed for --nat)")?;
    child
        .stdin
        .take()
        .context("nft's stdin")?
        .write_all(rules.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft in {ns} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Why `--nat` cannot run here beyond [`unavailable`]: no `nft` (the nftables package).
pub(crate) fn nat_unavailable() -> Option<String> {
    match Command::new("nft").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("--nat needs nft (install the nftables package)".into()),
    }
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
    /// Creates the namespaces, bridge and links for `k` silos: on one flat bridge (`sites` = 0),
    /// or at `sites` NATed sites with a relay's namespace on the public side.
    pub(crate) fn create(k: usize, sites: usize) -> anyhow::Result<Self> {
        if let Some(why) = unavailable() {
            bail!(why);
        }
        if sites > 0 {
            if let Some(why) = nat_unavailable() {
                bail!(why);
            }
            if sites > 16 || k > 250 {
                bail!("--nat supports at most 16 sites and 250 silos");
            }
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
        let mut free = (0..2048u32)
            .map(|d| {
                let n = (start + d) % 2048;
                [200 + (n / 256) as u8, (n % 256) as u8]
            })
            .filter(|[a, b]| {
                let p = format!("10.{a}.{b}.");
                !used.contains(&p) && !routes.contains(&p)
            });
        let net = free
            .next()
            .context("no free 10.200.0.0/13 subnet for --netns")?;
        let site_nets: Vec<[u8; 2]> = free.take(sites).collect();
        if site_nets.len() < sites {
            bail!("no {sites} free 10.200.0.0/13 subnets for --nat");
        }
        let prefix = format!("federico-{pid}-{seq}");
        let me = Self {
            host_if: format!("fh{}-{seq}", pid % 1_000_000),
            prefix,
            net,
            k,
            sites: site_nets,
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
        if !self.sites.is_empty() {
            return self.build_behind_nat();
        }
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
        self.plug_host()
    }

    /// Joins namespace `ns` to the bridge of namespace `bridge_ns` by a veth (`port` there,
    /// `eth0` or `inner` inside `ns`), with address `addr`/24.
    fn plug(
        &self,
        bridge_ns: &str,
        port: &str,
        ns: &str,
        inner: &str,
        addr: Ipv4Addr,
    ) -> anyhow::Result<()> {
        let bridge = if bridge_ns == self.hub() {
            "br0"
        } else {
            "lan"
        };
        ip(&[
            "-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", inner, "netns",
            ns,
        ])?;
        ip(&["-n", bridge_ns, "link", "set", port, "master", bridge])?;
        ip(&["-n", bridge_ns, "link", "set", port, "up"])?;
        ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", inner])?;
        ip(&["-n", ns, "link", "set", inner, "up"])
    }

    /// The NAT layout: a router per site (its LAN bridge, masquerade, and a filter that drops
    /// whatever comes in unasked, as home and office NATs do: forwarded or for the router
    /// itself, so a hole-punching SYN that comes early is lost, not refused),
    /// the silos on the LANs, the relay's namespace on the public bridge, and host routes to
    /// the LANs through the routers (the launcher's control connections only: the routers
    /// forward nothing else inward).
    fn build_behind_nat(&self) -> anyhow::Result<()> {
        let hub = self.hub();
        let relay = self.relay_namespace();
        self.add_namespace(&relay)?;
        self.plug(&hub, "relay", &relay, "eth0", self.relay_addr())?;
        self.plug_host()?;
        for (s, lan) in self.sites.iter().enumerate() {
            let r = self.router(s);
            self.add_namespace(&r)?;
            self.plug(&hub, &format!("r{s}"), &r, "eth0", self.router_addr(s))?;
            ip(&["-n", &r, "link", "add", "lan", "type", "bridge"])?;
            let gw = Ipv4Addr::new(10, lan[0], lan[1], 254);
            ip(&["-n", &r, "addr", "add", &format!("{gw}/24"), "dev", "lan"])?;
            ip(&["-n", &r, "link", "set", "lan", "up"])?;
            netns_exec(&r, "sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"])?;
            let rules = format!(
                "table ip nat {{\n chain post {{\n  type nat hook postrouting priority srcnat;\n  \
                 oifname \"eth0\" masquerade\n }}\n}}\n\
                 table ip filter {{\n chain inward {{\n  type filter hook forward priority filter; \
                 policy drop;\n  ct state established,related accept\n  iifname \"lan\" accept\n  \
                 ip saddr {host} accept\n }}\n \
                 chain local {{\n  type filter hook input priority filter; policy drop;\n  \
                 ct state established,related accept\n  iifname {{ \"lan\", \"lo\" }} accept\n \
                 }}\n}}\n",
                host = self.host_addr()
            );
            nft(&r, &rules)?;
            ip(&[
                "route",
                "add",
                &format!("10.{}.{}.0/24", lan[0], lan[1]),
                "via",
                &self.router_addr(s).to_string(),
            ])?;
        }
        for i in 0..self.k {
            let s = i % self.sites.len();
            let ns = self.namespace(i);
            self.add_namespace(&ns)?;
            self.plug(&self.router(s), &format!("v{i}"), &ns, "eth0", self.addr(i))?;
            let lan = self.sites[s];
            let gw = Ipv4Addr::new(10, lan[0], lan[1], 254).to_string();
            ip(&["-n", &ns, "route", "add", "default", "via", &gw])?;
        }
        Ok(())
    }

    /// The launcher's end on the public bridge.
    fn plug_host(&self) -> anyhow::Result<()> {
        let hub = self.hub();
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
        ip(&["link", "set", &self.host_if, "up"])
    }

    fn router(&self, site: usize) -> String {
        format!("{}-r{site}", self.prefix)
    }

    /// Site `site`'s router on the public bridge (its NAT's public address).
    pub(crate) fn router_addr(&self, site: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net[0], self.net[1], 101 + site as u8)
    }

    pub(crate) fn relay_namespace(&self) -> String {
        format!("{}-relay", self.prefix)
    }

    /// The relay's public address (behind NAT only).
    pub(crate) fn relay_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net[0], self.net[1], 200)
    }

    /// Whether the silos sit behind NAT.
    pub(crate) fn behind_nat(&self) -> bool {
        !self.sites.is_empty()
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    /// The namespace silo `i` runs in.
    pub(crate) fn namespace(&self, i: usize) -> String {
        format!("{}-{i}", self.prefix)
    }

    /// Silo `i`'s address (behind NAT, on its site's LAN).
    pub(crate) fn addr(&self, i: usize) -> Ipv4Addr {
        match self.sites.get(i % self.sites.len().max(1)) {
            Some(lan) => Ipv4Addr::new(10, lan[0], lan[1], i as u8 + 1),
            None => Ipv4Addr::new(10, self.net[0], self.net[1], i as u8 + 1),
        }
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
        for lan in &self.sites {
            let _ = ip(&["route", "del", &format!("10.{}.{}.0/24", lan[0], lan[1])]);
        }
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
