//! `federico init`: a federation of N silos on one machine in one command, as `flwr new` does.
//! Owns: the folder it writes — keys, a manifest with distinct 127.0.0.1 ports, a shard and a
//! node config per silo, all with paths relative to the folder — and the comments that say what
//! to change for real hosts.
//! Must not: start anything (the user starts each node), or touch a folder that exists.

use super::{SiloPaths, silo_config, write_shards};
use crate::net::config::Deadlines;
use crate::net::{Manifest, Member, keygen};
use crate::scenario::Scenario;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// The scenario `init` cuts shards from unless told otherwise: the quick start's synthetic
/// label groups (no download needed).
pub const DEFAULT_SCENARIO: &str = include_str!("../../simulations/quickstart.toml");

const MANIFEST_HEAD: &str = "\
# Federation manifest written by `federico init`: every member's peer ID, in a fixed order, and
# where it listens. Every silo uses the same file.
#
# As written, all members run on this machine (127.0.0.1, one port each). For real hosts:
# - each silo runs `federico keygen --out keys/<silo>.key` on its own machine and sends only
#   the printed peer ID; replace the peer_id lines with those (the keys in keys/ here are for
#   trying it out on one machine; never copy a key to another host);
# - replace 127.0.0.1 in addrs with each host's address, and open the port (TCP) there.
";

const CONFIG_HEAD: &str = "\
# Node config written by `federico init`; start this silo with
#   federico node --config {path}
# Relative paths are relative to this file. For a real host: listen on
# /ip4/0.0.0.0/tcp/<port> (or the host's address) instead of 127.0.0.1, point [data] at this
# silo's own files (format = \"csv\" | \"idx\" | \"cifar10\" | \"images\", docs/federation.md)
# or a shard, and keep `key` on this machine only. CSV columns in their own units need the
# federation's `scale = \"<scale.json>\"` (docs/data.md: `federico scale` makes it from
# per-silo column sums), the same file at every silo; text labels and image folders, its
# `class_names = [...]` in class-id order.
";

/// What `init` wrote.
#[derive(Debug)]
pub struct Initialised {
    /// Node config paths, in member order, as given under the output folder.
    pub configs: Vec<PathBuf>,
    /// Their listen addresses.
    pub addrs: Vec<String>,
}

/// Writes a federation of `n` silos into `out` (which must not exist): `keys/silo-<i>.key`,
/// `manifest.toml`, `shards/` cut from `scenario` at `seed`, and `silo-<i>.toml` listening on
/// 127.0.0.1 at `port + i`. Written into a temporary sibling first and renamed: an error leaves
/// nothing behind.
pub fn init(
    scenario: &Scenario,
    seed: u64,
    data_dir: Option<&Path>,
    out: &Path,
    port: u16,
) -> anyhow::Result<Initialised> {
    let n = scenario.split.clients;
    if n < 2 {
        bail!("a federation needs at least 2 silos, got {n}");
    }
    if u32::from(port) + n as u32 > 65536 || port == 0 {
        bail!(
            "ports {port}..{} do not fit in 1..=65535",
            u32::from(port) + n as u32 - 1
        );
    }
    if out.exists() {
        bail!(
            "{} already exists; choose another --out (init never overwrites keys or state)",
            out.display()
        );
    }
    let name = out
        .file_name()
        .with_context(|| format!("--out {} names no folder", out.display()))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = parent.join(format!(
        ".{}.init-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let written = write_all(scenario, seed, data_dir, &tmp, out, port);
    match written {
        Ok(addrs) => {
            std::fs::rename(&tmp, out)
                .with_context(|| format!("moving {} to {}", tmp.display(), out.display()))?;
            let configs = (0..n).map(|i| out.join(format!("silo-{i}.toml"))).collect();
            Ok(Initialised { configs, addrs })
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

fn write_all(
    scenario: &Scenario,
    seed: u64,
    data_dir: Option<&Path>,
    dir: &Path,
    shown_dir: &Path,
    port: u16,
) -> anyhow::Result<Vec<String>> {
    let n = scenario.split.clients;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let (_, epoch_steps) = write_shards(scenario, seed, data_dir, &dir.join("shards"))?;
    let addrs: Vec<String> = (0..n)
        .map(|i| format!("/ip4/127.0.0.1/tcp/{}", u32::from(port) + i as u32))
        .collect();
    let mut members = Vec::with_capacity(n);
    for (i, addr) in addrs.iter().enumerate() {
        let key = keygen(&dir.join("keys").join(format!("silo-{i}.key")))?;
        members.push(Member {
            name: format!("silo-{i}"),
            peer_id: key.public().to_peer_id(),
            addrs: vec![addr.parse()?],
        });
    }
    let manifest = Manifest {
        open: false,
        epoch_steps: Some(epoch_steps),
        members,
        relays: Vec::new(),
    };
    std::fs::write(
        dir.join("manifest.toml"),
        format!("{MANIFEST_HEAD}\n{}", manifest.to_toml()),
    )?;
    for (i, addr) in addrs.iter().enumerate() {
        let name = format!("silo-{i}");
        let cfg = silo_config(
            scenario,
            seed,
            SiloPaths {
                name: &name,
                key: PathBuf::from("keys").join(format!("{name}.key")),
                manifest: PathBuf::from("manifest.toml"),
                listen: vec![addr.clone()],
                state_dir: PathBuf::from("state").join(&name),
                shard: PathBuf::from("shards").join(format!("{name}.shard")),
            },
            &Deadlines::default(),
        )?;
        let shown = shown_dir.join(format!("{name}.toml"));
        let head = CONFIG_HEAD.replace("{path}", &shown.display().to_string());
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!("{head}\n{}", toml::to_string(&cfg)?),
        )?;
    }
    Ok(addrs)
}
