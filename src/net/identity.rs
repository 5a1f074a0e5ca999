//! Who a silo is and whom it accepts: the persisted keypair (its peer ID survives restarts)
//! and the federation manifest (members' peer IDs and optional addresses).
//! Owns: key files (`federico keygen`), manifest parsing and validation, and the mapping from
//! manifest order to [`NodeId`] (member i is `NodeId(i)`, as in the simulator).
//! Must not: open connections or decide anything about rounds.

use crate::ids::NodeId;
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Errors of keys and manifests.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A file could not be read or written.
    #[error("{what} {}: {error}", path.display())]
    Io {
        /// What the file is to federico ("key file", "manifest", "folder").
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error (in the message, so not a `source`: `{:#}` would repeat it).
        error: std::io::Error,
    },
    /// A key file that is not a libp2p keypair.
    #[error("key file {}: not a federico key ({reason}); `federico keygen --out FILE` writes one", path.display())]
    BadKey {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Refusing to overwrite a key (that would change the silo's peer ID).
    #[error("{0} exists: refusing to overwrite a key (it would change the silo's peer ID)")]
    KeyExists(PathBuf),
    /// The manifest is invalid; the message names the field.
    #[error("manifest {path}: {reason}")]
    Manifest {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field.
        reason: String,
    },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> IdentityError + 'a {
    move |error| IdentityError::Io {
        what,
        path: path.to_path_buf(),
        error,
    }
}

/// Generates a new Ed25519 keypair and writes it to `path` (mode 0600), refusing to overwrite.
pub fn keygen(path: &Path) -> Result<Keypair, IdentityError> {
    if path.exists() {
        return Err(IdentityError::KeyExists(path.to_path_buf()));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io("folder", dir))?;
    }
    let key = Keypair::generate_ed25519();
    let bytes = key
        .to_protobuf_encoding()
        .expect("an Ed25519 key always encodes");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path).map_err(io("key file", path))?;
    std::io::Write::write_all(&mut f, &bytes).map_err(io("key file", path))?;
    f.sync_all().map_err(io("key file", path))?;
    Ok(key)
}

/// Reads a key written by [`keygen`].
pub fn load_key(path: &Path) -> Result<Keypair, IdentityError> {
    let bytes = std::fs::read(path).map_err(io("key file", path))?;
    // libp2p's own reason names protobuf fields or cargo features, which say nothing to a user.
    Keypair::from_protobuf_encoding(&bytes).map_err(|_| IdentityError::BadKey {
        path: path.to_path_buf(),
        reason: format!(
            "{} bytes that do not decode as an Ed25519 keypair",
            bytes.len()
        ),
    })
}

/// One member of the federation, as written in the manifest.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberFile {
    name: String,
    peer_id: String,
    #[serde(default)]
    addrs: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFile {
    #[serde(default)]
    open: bool,
    #[serde(default)]
    epoch_steps: Option<u64>,
    #[serde(default, rename = "member")]
    members: Vec<MemberFile>,
    #[serde(default)]
    relays: Vec<String>,
}

/// A member of the federation.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// Human name of the silo (`hospital-a`); node configs refer to it.
    pub name: String,
    /// Its libp2p peer ID (from its key).
    pub peer_id: PeerId,
    /// Where it can be dialled, if known (otherwise found through discovery).
    pub addrs: Vec<Multiaddr>,
}

/// The federation manifest: members in a fixed order; member i is `NodeId(i)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// Whether peers not listed may connect (they join as late joiners).
    pub open: bool,
    /// Sub-steps per round of FedeRiCo's `mstep = "epoch"`: one local epoch of the largest
    /// silo, ⌈max n_i / batch_size⌉ ([`crate::learn::Federation::epoch_steps`]). A
    /// federation-wide number (every owner steps once per sub-step), so it lives here, not in a
    /// node's config; `federico init` and `federico swarm` write it.
    pub epoch_steps: Option<u64>,
    /// The listed members.
    pub members: Vec<Member>,
    /// Circuit relays (`federico relay`) every member reserves a slot on and reaches the others
    /// through when it cannot dial them directly: each a full address ending in `/p2p/<id>`.
    pub relays: Vec<Relay>,
}

/// A circuit relay of the manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct Relay {
    /// Its peer ID (the address's last part).
    pub peer_id: PeerId,
    /// Where it listens, ending in `/p2p/<peer_id>`.
    pub addr: Multiaddr,
}

impl Relay {
    /// The address at which `member` is reached through this relay.
    pub fn circuit_to(&self, member: PeerId) -> Multiaddr {
        self.addr
            .clone()
            .with(libp2p::multiaddr::Protocol::P2pCircuit)
            .with(libp2p::multiaddr::Protocol::P2p(member))
    }
}

/// Parses `relays[i]`: a multiaddr ending in `/p2p/<peer id>` that names no member.
fn parse_relay(i: usize, a: &str, ids: &HashMap<PeerId, usize>) -> Result<Relay, String> {
    let addr: Multiaddr = a
        .parse()
        .map_err(|e| format!("relays[{i}]: {a:?} is not a multiaddr: {e}"))?;
    let Some(libp2p::multiaddr::Protocol::P2p(peer_id)) = addr.iter().last() else {
        return Err(format!(
            "relays[{i}]: {a:?} must end in /p2p/<the relay's peer ID> (printed by `federico \
             relay`)"
        ));
    };
    if addr
        .iter()
        .any(|p| p == libp2p::multiaddr::Protocol::P2pCircuit)
    {
        return Err(format!(
            "relays[{i}]: {a:?} is itself a relayed address; give the relay's own address"
        ));
    }
    if let Some(j) = ids.get(&peer_id) {
        return Err(format!(
            "relays[{i}]: {peer_id} is member[{j}]; a relay is a separate `federico relay` \
             process with its own key"
        ));
    }
    Ok(Relay { peer_id, addr })
}

impl Manifest {
    /// Reads and validates a manifest file.
    pub fn load(path: &Path) -> Result<Self, IdentityError> {
        let text = std::fs::read_to_string(path).map_err(io("manifest", path))?;
        Self::parse(&text).map_err(|reason| IdentityError::Manifest {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parses manifest text; the error names the offending field.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: ManifestFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.members.is_empty() {
            return Err("no [[member]] entries: list at least this silo".into());
        }
        if file.epoch_steps == Some(0) {
            return Err("epoch_steps must be at least 1, got 0".into());
        }
        let mut members = Vec::with_capacity(file.members.len());
        let mut names = HashMap::new();
        let mut ids = HashMap::new();
        for (i, m) in file.members.into_iter().enumerate() {
            if m.name.trim().is_empty() {
                return Err(format!("member[{i}].name is empty"));
            }
            let peer_id: PeerId = m.peer_id.parse().map_err(|e| {
                format!("member[{i}].peer_id {:?} is not a peer ID: {e}", m.peer_id)
            })?;
            if let Some(j) = names.insert(m.name.clone(), i) {
                return Err(format!("member[{i}].name {:?} repeats member[{j}]", m.name));
            }
            if let Some(j) = ids.insert(peer_id, i) {
                return Err(format!(
                    "member[{i}].peer_id repeats member[{j}] ({peer_id})"
                ));
            }
            let addrs = m
                .addrs
                .iter()
                .map(|a| {
                    a.parse::<Multiaddr>()
                        .map_err(|e| format!("member[{i}].addrs: {a:?} is not a multiaddr: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            members.push(Member {
                name: m.name,
                peer_id,
                addrs,
            });
        }
        let relays = file
            .relays
            .iter()
            .enumerate()
            .map(|(i, a)| parse_relay(i, a, &ids))
            .collect::<Result<Vec<_>, _>>()?;
        // A member address through a relay goes through one this manifest lists: the nodes
        // admit no other relay.
        for (i, m) in members.iter().enumerate() {
            for a in &m.addrs {
                let mut parts = a.iter().collect::<Vec<_>>();
                let Some(cut) = parts
                    .iter()
                    .position(|p| *p == libp2p::multiaddr::Protocol::P2pCircuit)
                else {
                    continue;
                };
                parts.truncate(cut);
                let via = match parts.last() {
                    Some(libp2p::multiaddr::Protocol::P2p(id)) => Some(*id),
                    _ => None,
                };
                if !via.is_some_and(|id| relays.iter().any(|r| r.peer_id == id)) {
                    return Err(format!(
                        "member[{i}].addrs: {a} goes through a relay that is not in `relays` \
                         (list the relay's own address there, ending in /p2p/<its peer ID>)"
                    ));
                }
            }
        }
        Ok(Self {
            open: file.open,
            epoch_steps: file.epoch_steps,
            members,
            relays,
        })
    }

    /// Writes the manifest as TOML (used by `federico swarm`).
    pub fn to_toml(&self) -> String {
        let mut out = format!(
            "# Federation manifest: members' peer IDs, in a fixed order (member i is node i).\n\
             # Connections from peers not listed are refused unless open = true.\n\
             open = {}\n",
            self.open
        );
        if let Some(s) = self.epoch_steps {
            out.push_str(&format!(
                "# Sub-steps per round of FedeRiCo's mstep = \"epoch\": one epoch of the largest \
                 silo,\n# ceil(its training samples / train.batch_size). The same for every member.\n\
                 epoch_steps = {s}\n"
            ));
        }
        if !self.relays.is_empty() {
            out.push_str(&format!(
                "# Circuit relays (`federico relay`): members reserve a slot on each and reach \
                 the others\n# through them when they cannot dial them directly.\n\
                 relays = [{}]\n",
                self.relays
                    .iter()
                    .map(|r| format!("\"{}\"", r.addr))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for m in &self.members {
            out.push_str(&format!(
                "\n[[member]]\nname = {:?}\npeer_id = \"{}\"\naddrs = [{}]\n",
                m.name,
                m.peer_id,
                m.addrs
                    .iter()
                    .map(|a| format!("\"{a}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out
    }

    /// The node id of a listed peer.
    pub fn node_of(&self, peer: &PeerId) -> Option<NodeId> {
        self.members
            .iter()
            .position(|m| &m.peer_id == peer)
            .map(|i| NodeId(i as u32))
    }

    /// The member called `name`.
    pub fn by_name(&self, name: &str) -> Option<(NodeId, &Member)> {
        self.members
            .iter()
            .enumerate()
            .find(|(_, m)| m.name == name)
            .map(|(i, m)| (NodeId(i as u32), m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_keeps_its_peer_id_and_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/a.key");
        let key = keygen(&path).unwrap();
        assert_eq!(
            load_key(&path).unwrap().public().to_peer_id(),
            key.public().to_peer_id()
        );
        assert!(matches!(keygen(&path), Err(IdentityError::KeyExists(_))));
        std::fs::write(&path, b"not a key").unwrap();
        assert!(matches!(load_key(&path), Err(IdentityError::BadKey { .. })));
    }

    #[test]
    fn manifests_roundtrip_and_bad_ones_name_the_field() {
        let a = Keypair::generate_ed25519().public().to_peer_id();
        let b = Keypair::generate_ed25519().public().to_peer_id();
        let m = Manifest {
            open: false,
            epoch_steps: Some(3),
            members: vec![
                Member {
                    name: "a".into(),
                    peer_id: a,
                    addrs: vec!["/ip4/127.0.0.1/tcp/4001".parse().unwrap()],
                },
                Member {
                    name: "b".into(),
                    peer_id: b,
                    addrs: vec![],
                },
            ],
            relays: vec![],
        };
        let back = Manifest::parse(&m.to_toml()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.node_of(&b), Some(NodeId(1)));
        let e = Manifest::parse("[[member]]\nname = \"a\"\npeer_id = \"xyz\"\n").unwrap_err();
        assert!(e.contains("member[0].peer_id"), "{e}");
        let dup = format!(
            "[[member]]\nname = \"a\"\npeer_id = \"{a}\"\n[[member]]\nname = \"a\"\npeer_id = \"{b}\"\n"
        );
        assert!(
            Manifest::parse(&dup)
                .unwrap_err()
                .contains("member[1].name")
        );
        assert!(
            Manifest::parse("open = true\n")
                .unwrap_err()
                .contains("[[member]]")
        );
        assert!(Manifest::parse("opn = true\n").unwrap_err().contains("opn"));
        let zero = format!("epoch_steps = 0\n[[member]]\nname = \"a\"\npeer_id = \"{a}\"\n");
        assert!(Manifest::parse(&zero).unwrap_err().contains("epoch_steps"));
    }

    #[test]
    fn a_manifest_names_relays_by_full_address_and_refuses_a_member_or_a_circuit() {
        let a = Keypair::generate_ed25519().public().to_peer_id();
        let r = Keypair::generate_ed25519().public().to_peer_id();
        let member = format!("\n[[member]]\nname = \"a\"\npeer_id = \"{a}\"\n");
        let ok = format!("relays = [\"/ip4/203.0.113.5/tcp/4100/p2p/{r}\"]\n{member}");
        let m = Manifest::parse(&ok).unwrap();
        assert_eq!(m.relays.len(), 1);
        assert_eq!(m.relays[0].peer_id, r);
        assert_eq!(
            m.relays[0].circuit_to(a).to_string(),
            format!("/ip4/203.0.113.5/tcp/4100/p2p/{r}/p2p-circuit/p2p/{a}")
        );
        assert_eq!(Manifest::parse(&m.to_toml()).unwrap(), m);
        for (bad, says) in [
            ("/ip4/203.0.113.5/tcp/4100".to_string(), "must end in /p2p/"),
            (format!("/ip4/203.0.113.5/tcp/4100/p2p/{a}"), "is member[0]"),
            (
                format!("/ip4/203.0.113.5/tcp/4100/p2p/{r}/p2p-circuit/p2p/{r}"),
                "itself a relayed address",
            ),
            ("not an address".to_string(), "is not a multiaddr"),
        ] {
            let e = Manifest::parse(&format!("relays = [\"{bad}\"]\n{member}")).unwrap_err();
            assert!(e.contains("relays[0]") && e.contains(says), "{bad}: {e}");
        }
        // A member's address may go through a listed relay, and through no other.
        let b = Keypair::generate_ed25519().public().to_peer_id();
        let via = |relay: PeerId| {
            format!(
                "relays = [\"/ip4/203.0.113.5/tcp/4100/p2p/{r}\"]\n{member}\n[[member]]\n\
                 name = \"b\"\npeer_id = \"{b}\"\n\
                 addrs = [\"/ip4/203.0.113.5/tcp/4100/p2p/{relay}/p2p-circuit\"]\n"
            )
        };
        assert!(Manifest::parse(&via(r)).is_ok());
        let e = Manifest::parse(&via(a)).unwrap_err();
        assert!(
            e.contains("member[1].addrs") && e.contains("not in `relays`"),
            "{e}"
        );
    }
}
