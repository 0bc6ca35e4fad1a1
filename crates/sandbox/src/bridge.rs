//! Network mode `bridged`: each sandbox gets a veth pair whose outer end is an isolated port of
//! the node's bridge, for apps that need egress.
//!
//! Everything is done over rtnetlink, with no `ip` processes: the agent creates the bridge (with
//! the gateway address) the first time a bridged instance needs it; `sandbox-init`'s helper
//! creates the veth pair with its inner end already in the sandbox's network namespace; init
//! configures the inner end (address, up, default route) before the sandbox counts as prepared,
//! so a slot of the slot pool has its network ready too.
//!
//! Bridge ports are marked isolated (`IFLA_BRPORT_ISOLATED`): the kernel forwards nothing
//! between two isolated ports, so an instance reaches the host (and, with forwarding and NAT
//! set up by the operator, the world) but never another instance. The gateway keeps reaching
//! the app through the connection-handing socket, as in isolated mode.
//!
//! Addresses are handed out per node from the bridge's network, lowest free first, and come
//! back when the sandbox is gone.

use std::collections::BTreeSet;
use std::io;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoBridgePort, InfoData, InfoKind, InfoPortData, InfoPortKind, InfoVeth, LinkAttribute,
    LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use serde::{Deserialize, Serialize};

/// Why bridge settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BridgeConfigError {
    /// Not `a.b.c.d/n`.
    #[error("{0:?} is not an IPv4 network like 10.213.0.0/16")]
    NotANetwork(String),
    /// A prefix too short or too long for a bridge of instances.
    #[error("prefix /{prefix} of {network:?} is out of range; use /8 to /29")]
    Prefix {
        /// The network as given.
        network: String,
        /// Its prefix length.
        prefix: u8,
    },
    /// Host bits are set.
    #[error("{network:?} has host bits set; use the network address, e.g. {suggested}")]
    HostBits {
        /// The network as given.
        network: String,
        /// The network address with the host bits cleared.
        suggested: String,
    },
    /// Not a usable interface name.
    #[error("bridge name {0:?} must be 1 to 15 letters, digits, '-' or '_'")]
    Name(String),
}

/// Why a sandbox could not get an address on the bridge.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// Bridges and veth pairs need root.
    #[error("network \"bridged\" needs warden to run as root (it creates a bridge and a veth pair per instance); run it as root or use network \"isolated\"")]
    NotRoot,
    /// The kernel refused to set the bridge up.
    #[error("cannot set up bridge {name}: {source}")]
    Setup {
        /// The bridge.
        name: String,
        /// Why.
        source: io::Error,
    },
    /// Every address is leased.
    #[error("every address of bridge {name} ({network}/{prefix}) is in use; give warden up a larger --bridge-cidr")]
    Full {
        /// The bridge.
        name: String,
        /// Its network.
        network: Ipv4Addr,
        /// Its prefix length.
        prefix: u8,
    },
}

/// Name of the interface inside the sandbox.
pub const INSIDE_IF: &str = "eth0";

/// The node's bridge, from `warden up --bridge` and `--bridge-cidr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConfig {
    /// Interface name of the bridge.
    pub name: String,
    /// Network address of the bridge's subnet.
    pub network: Ipv4Addr,
    /// Prefix length of the subnet; the bridge holds the first host address.
    pub prefix: u8,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        Self {
            name: "warden0".into(),
            network: Ipv4Addr::new(10, 213, 0, 0),
            prefix: 16,
        }
    }
}

impl BridgeConfig {
    /// Parses `a.b.c.d/n` into a network and prefix, refusing host bits and tiny subnets.
    pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), BridgeConfigError> {
        let bad = || BridgeConfigError::NotANetwork(s.to_owned());
        let (addr, prefix) = s.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        if !(8..=29).contains(&prefix) {
            return Err(BridgeConfigError::Prefix {
                network: s.to_owned(),
                prefix,
            });
        }
        if u32::from(addr) & !mask(prefix) != 0 {
            return Err(BridgeConfigError::HostBits {
                network: s.to_owned(),
                suggested: format!(
                    "{}/{prefix}",
                    Ipv4Addr::from(u32::from(addr) & mask(prefix))
                ),
            });
        }
        Ok((addr, prefix))
    }

    /// Checks that the name is a usable interface name.
    pub fn validate_name(name: &str) -> Result<(), BridgeConfigError> {
        let ok = !name.is_empty()
            && name.len() < 16
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if ok {
            Ok(())
        } else {
            Err(BridgeConfigError::Name(name.to_owned()))
        }
    }

    fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }

    /// Host numbers instances may use: after the gateway, before broadcast.
    fn hosts(&self) -> std::ops::Range<u32> {
        2..(1u32 << (32 - self.prefix)) - 1
    }
}

fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// What `sandbox-init` needs to wire one sandbox to the bridge (part of its plan).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BridgedPlan {
    /// The bridge to attach the outer end to.
    pub bridge: String,
    /// Name of the outer end, on the host.
    pub host_if: String,
    /// The sandbox's address.
    pub addr: Ipv4Addr,
    /// Prefix length of the bridge's subnet.
    pub prefix: u8,
    /// The bridge's own address: the sandbox's default route.
    pub gateway: Ipv4Addr,
}

/// The node's bridge and the addresses handed out on it.
pub struct Bridge {
    config: BridgeConfig,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Whether the bridge was set up by this agent (`Some(true)`: created, so removed at
    /// shutdown; `Some(false)`: it existed already).
    set_up: Option<bool>,
    used: BTreeSet<u32>,
}

/// One address of the bridge's subnet, held while a sandbox may use it.
pub struct AddrLease {
    bridge: Arc<Bridge>,
    host: u32,
    /// The sandbox's wiring.
    pub plan: BridgedPlan,
}

impl Drop for AddrLease {
    fn drop(&mut self) {
        crate::lock(&self.bridge.state).used.remove(&self.host);
    }
}

impl Bridge {
    /// The bridge of `config`, set up when an instance first needs it.
    pub fn new(config: BridgeConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            state: Mutex::new(State::default()),
        })
    }

    /// A free address for one sandbox, setting the bridge up first if needed.
    pub fn lease(self: &Arc<Self>) -> Result<AddrLease, BridgeError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(BridgeError::NotRoot);
        }
        let mut state = crate::lock(&self.state);
        if state.set_up.is_none() {
            let created = ensure_bridge(&self.config).map_err(|source| BridgeError::Setup {
                name: self.config.name.clone(),
                source,
            })?;
            if created {
                tracing::info!(bridge = %self.config.name, gateway = %self.config.gateway(), prefix = self.config.prefix, "bridge created");
            }
            state.set_up = Some(created);
        }
        let host = self
            .config
            .hosts()
            .find(|h| !state.used.contains(h))
            .ok_or_else(|| BridgeError::Full {
                name: self.config.name.clone(),
                network: self.config.network,
                prefix: self.config.prefix,
            })?;
        state.used.insert(host);
        let addr = Ipv4Addr::from(u32::from(self.config.network) + host);
        Ok(AddrLease {
            bridge: self.clone(),
            host,
            plan: BridgedPlan {
                bridge: self.config.name.clone(),
                host_if: host_if_name(&self.config.name, host),
                addr,
                prefix: self.config.prefix,
                gateway: self.config.gateway(),
            },
        })
    }

    /// Removes the bridge if this agent created it. The veth pairs went with their sandboxes.
    pub fn remove_if_created(&self) {
        if crate::lock(&self.state).set_up != Some(true) {
            return;
        }
        match delete_link(&self.config.name) {
            Ok(()) => tracing::info!(bridge = %self.config.name, "bridge removed"),
            Err(e) => {
                tracing::warn!(bridge = %self.config.name, error = %e, "cannot remove the bridge")
            }
        }
    }
}

/// `wv` + four hex digits of the bridge name + the host number: unique per bridge and host,
/// within the kernel's 15 characters.
fn host_if_name(bridge: &str, host: u32) -> String {
    let tag = crate::spread::fnv(bridge.as_bytes());
    format!("wv{:04x}{host:x}", tag & 0xffff)
}

// === rtnetlink ===

/// A route netlink socket of the calling thread's network namespace.
struct Rtnl {
    socket: Socket,
    seq: u32,
}

impl Rtnl {
    fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Self { socket, seq: 0 })
    }

    /// Sends one request and waits for the kernel's acknowledgement.
    fn ack(&mut self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.seq += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        loop {
            let (bytes, _) = self.socket.recv_from_full()?;
            let mut offset = 0;
            while offset < bytes.len() {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[offset..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = reply.header.length as usize;
                if reply.header.sequence_number == self.seq {
                    if let NetlinkPayload::Error(e) = reply.payload {
                        return match e.code {
                            None => Ok(()),
                            Some(_) => Err(e.to_io()),
                        };
                    }
                }
                if len == 0 {
                    break;
                }
                offset += len;
            }
        }
    }

    fn set_link(&mut self, link: LinkMessage) -> io::Result<()> {
        self.ack(RouteNetlinkMessage::SetLink(link), 0)
    }
}

fn index_of(name: &str) -> io::Result<Option<u32>> {
    match nix::net::if_::if_nametoindex(name) {
        Ok(i) => Ok(Some(i)),
        Err(nix::errno::Errno::ENODEV) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn up(index: u32) -> LinkMessage {
    let mut link = LinkMessage::default();
    link.header.index = index;
    link.header.flags = LinkFlags::Up;
    link.header.change_mask = LinkFlags::Up;
    link
}

fn add_address(nl: &mut Rtnl, index: u32, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
    let mut msg = AddressMessage::default();
    msg.header.family = AddressFamily::Inet;
    msg.header.prefix_len = prefix;
    msg.header.index = index;
    let broadcast = Ipv4Addr::from(u32::from(addr) | !mask(prefix));
    msg.attributes = vec![
        AddressAttribute::Local(addr.into()),
        AddressAttribute::Address(addr.into()),
        AddressAttribute::Broadcast(broadcast),
    ];
    nl.ack(
        RouteNetlinkMessage::NewAddress(msg),
        NLM_F_CREATE | NLM_F_EXCL,
    )
}

/// Creates the bridge with the gateway address unless it exists; true if it was created.
fn ensure_bridge(config: &BridgeConfig) -> io::Result<bool> {
    let mut nl = Rtnl::open()?;
    let created = match index_of(&config.name)? {
        Some(_) => false,
        None => {
            let mut link = LinkMessage::default();
            link.attributes = vec![
                LinkAttribute::IfName(config.name.clone()),
                LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Bridge)]),
            ];
            nl.ack(
                RouteNetlinkMessage::NewLink(link),
                NLM_F_CREATE | NLM_F_EXCL,
            )?;
            true
        }
    };
    let index = index_of(&config.name)?
        .ok_or_else(|| io::Error::other("the bridge vanished right after it was created"))?;
    match add_address(&mut nl, index, config.gateway(), config.prefix) {
        Ok(()) => {}
        // An existing bridge may carry the address already.
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e),
    }
    nl.set_link(up(index))?;
    Ok(created)
}

fn delete_link(name: &str) -> io::Result<()> {
    let Some(index) = index_of(name)? else {
        return Ok(());
    };
    let mut link = LinkMessage::default();
    link.header.index = index;
    Rtnl::open()?.ack(RouteNetlinkMessage::DelLink(link), 0)
}

/// In `sandbox-init`'s helper, on the host: creates the veth pair with its inner end named
/// [`INSIDE_IF`] in the network namespace of process `pid`, and makes the outer end an isolated,
/// up port of the bridge.
pub fn attach(plan: &BridgedPlan, pid: u32) -> io::Result<()> {
    let mut nl = Rtnl::open()?;
    let bridge = index_of(&plan.bridge)?.ok_or_else(|| {
        io::Error::other(format!(
            "bridge {} does not exist (was it deleted while warden runs?)",
            plan.bridge
        ))
    })?;
    // A sandbox that just ended may still be tearing its namespace (and so this name) down.
    if index_of(&plan.host_if)?.is_some() {
        delete_link(&plan.host_if)?;
    }
    let mut peer = LinkMessage::default();
    peer.attributes = vec![
        LinkAttribute::IfName(INSIDE_IF.into()),
        LinkAttribute::NetNsPid(pid),
    ];
    let mut link = LinkMessage::default();
    link.attributes = vec![
        LinkAttribute::IfName(plan.host_if.clone()),
        LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
        ]),
    ];
    nl.ack(
        RouteNetlinkMessage::NewLink(link),
        NLM_F_CREATE | NLM_F_EXCL,
    )?;
    let index = index_of(&plan.host_if)?
        .ok_or_else(|| io::Error::other("the veth pair vanished right after it was created"))?;
    let mut master = LinkMessage::default();
    master.header.index = index;
    master.attributes = vec![LinkAttribute::Controller(bridge)];
    nl.set_link(master)?;
    let mut isolated = LinkMessage::default();
    isolated.header.index = index;
    isolated.attributes = vec![LinkAttribute::LinkInfo(vec![
        LinkInfo::PortKind(InfoPortKind::Bridge),
        LinkInfo::PortData(InfoPortData::BridgePort(vec![InfoBridgePort::Isolated(
            true,
        )])),
    ])];
    // Port settings are link info, which the kernel reads only from RTM_NEWLINK (as `ip link
    // set ... type bridge_slave` sends it); RTM_SETLINK would ignore them.
    nl.ack(RouteNetlinkMessage::NewLink(isolated), 0)?;
    nl.set_link(up(index))
}

/// In init, inside the sandbox's network namespace: address, up, default route.
pub fn configure_inside(plan: &BridgedPlan) -> io::Result<()> {
    let mut nl = Rtnl::open()?;
    let index = index_of(INSIDE_IF)?
        .ok_or_else(|| io::Error::other(format!("{INSIDE_IF} is missing inside the sandbox")))?;
    add_address(&mut nl, index, plan.addr, plan.prefix)?;
    nl.set_link(up(index))?;
    let mut route = RouteMessage::default();
    route.header.address_family = AddressFamily::Inet;
    route.header.table = RouteHeader::RT_TABLE_MAIN;
    route.header.protocol = RouteProtocol::Boot;
    route.header.scope = RouteScope::Universe;
    route.header.kind = RouteType::Unicast;
    route.attributes = vec![
        RouteAttribute::Gateway(RouteAddress::Inet(plan.gateway)),
        RouteAttribute::Oif(index),
    ];
    nl.ack(
        RouteNetlinkMessage::NewRoute(route),
        NLM_F_CREATE | NLM_F_EXCL,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cidrs_parse_and_refuse_what_cannot_work() {
        assert_eq!(
            BridgeConfig::parse_cidr("10.213.0.0/16").unwrap(),
            (Ipv4Addr::new(10, 213, 0, 0), 16)
        );
        for bad in [
            "10.213.0.0",
            "10.213.0.1/16",
            "10.0.0.0/30",
            "10.0.0.0/4",
            "x/16",
        ] {
            assert!(BridgeConfig::parse_cidr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts_skip_network_gateway_and_broadcast() {
        let c = BridgeConfig {
            name: "b".into(),
            network: Ipv4Addr::new(10, 0, 0, 0),
            prefix: 29,
        };
        assert_eq!(c.gateway(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(c.hosts(), 2..7);
    }

    #[test]
    fn host_interface_names_fit_the_kernel_limit() {
        let name = host_if_name("warden0", (1 << 24) - 2);
        assert!(name.len() <= 15, "{name}");
        assert_ne!(host_if_name("a", 2), host_if_name("b", 2));
    }
}
