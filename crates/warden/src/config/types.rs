//! The value types of settings that are more than a number or a path, each parsed from the
//! same text on the command line and in the config file.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Serde through the type's `FromStr` and `Display`, so the config file takes the same text as
/// the command line.
macro_rules! serde_by_text {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A duration written for people: `500ms`, `30s`, `5m`, `12h`, `1h 30m`. Never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Human(pub Duration);

impl FromStr for Human {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let d = humantime::parse_duration(s)
            .map_err(|e| format!("{s:?} is not a duration like 500ms, 30s, 5m or 12h ({e})"))?;
        if d.is_zero() {
            return Err(format!("{s:?} is zero; give a duration above zero"));
        }
        Ok(Self(d))
    }
}

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

serde_by_text!(Human);

/// A duration as [`Human`] writes it (`"15m"`), or a bare number of seconds, which
/// `build_timeout` took before it was written like every other duration (`900`, `"900"`): old
/// config files and scripts keep working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanOrSecs(pub Duration);

impl FromStr for HumanOrSecs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().parse::<u64>() {
            Ok(0) => Err(format!("{s:?} is zero; give a duration above zero")),
            Ok(n) => Ok(Self(Duration::from_secs(n))),
            Err(_) => s.parse::<Human>().map(|h| Self(h.0)),
        }
    }
}

impl fmt::Display for HumanOrSecs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Human(self.0).fmt(f)
    }
}

impl Serialize for HumanOrSecs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanOrSecs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Secs(u64),
            Text(String),
        }
        match Written::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a duration like \"30s\", \"15m\" or \"1h\"")
        })? {
            Written::Secs(n) => n.to_string().parse(),
            Written::Text(t) => t.parse(),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// A role a `warden up` process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Role {
    /// The single entry point: TLS, authentication, routing to instances.
    Gateway,
    /// Runs instances on this node.
    Agent,
    /// The admin API, metrics and status.
    Api,
    /// Probes instances through their nodes' ports and removes the records of dead ones (on a
    /// cluster).
    Checker,
}

impl Role {
    /// Every role this build runs, the default.
    pub const ALL: [Role; 3] = [Role::Gateway, Role::Agent, Role::Api];
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        <Self as clap::ValueEnum>::from_str(s, false).map_err(|_| {
            format!("{s:?} is not a role; use gateway, agent, api or checker, separated by commas")
        })
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Gateway => "gateway",
            Self::Agent => "agent",
            Self::Api => "api",
            Self::Checker => "checker",
        })
    }
}

serde_by_text!(Role);

/// How sandbox limits are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Cgroups {
    /// cgroups where warden may write a hierarchy, else rlimits.
    Auto,
    /// rlimits only.
    Off,
}

impl FromStr for Cgroups {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        <Self as clap::ValueEnum>::from_str(s, false)
            .map_err(|_| format!("{s:?} is not a cgroups mode; use auto or off"))
    }
}

impl fmt::Display for Cgroups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Off => "off",
        })
    }
}

serde_by_text!(Cgroups);

/// Whether this node keeps an audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuditMode {
    /// Every role records to `<data dir>/audit/`; while the log cannot write, warden serves on
    /// with an alarm (`/readyz`, `warden status`, metrics).
    On,
    /// As `on`, but while the log cannot write, every request that would reach an app or sign
    /// in and every API change is refused (503) until it can (fail closed).
    Required,
    /// Nothing is recorded (for measuring what the trail costs; not for production).
    Off,
}

impl FromStr for AuditMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        <Self as clap::ValueEnum>::from_str(s, false)
            .map_err(|_| format!("{s:?} is not an audit mode; use on, required or off"))
    }
}

impl fmt::Display for AuditMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::On => "on",
            Self::Required => "required",
            Self::Off => "off",
        })
    }
}

serde_by_text!(AuditMode);

/// Whether the shared break-glass admin token is written and accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AdminToken {
    /// Written to `<data dir>/admin-token` and accepted as the owner.
    On,
    /// Neither written nor accepted (an existing file is removed): only operators' tokens
    /// open the API. Refused at start while no owner operator exists.
    Off,
}

impl FromStr for AdminToken {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        <Self as clap::ValueEnum>::from_str(s, false)
            .map_err(|_| format!("{s:?} is no admin-token setting; use on or off"))
    }
}

impl fmt::Display for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

serde_by_text!(AdminToken);

/// The store backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store(pub warden_store::Backend);

impl FromStr for Store {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        s.parse()
            .map(Self)
            .map_err(|e: warden_store::StoreError| e.to_string())
    }
}

impl fmt::Display for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

serde_by_text!(Store);

/// An IPv4 network, `a.b.c.d/n`, without host bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(pub std::net::Ipv4Addr, pub u8);

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        warden_sandbox::bridge::BridgeConfig::parse_cidr(s)
            .map(|(a, p)| Self(a, p))
            .map_err(|e| e.to_string())
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.0, self.1)
    }
}

serde_by_text!(Cidr);

/// A network interface name for the bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeName(pub String);

impl FromStr for BridgeName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        warden_sandbox::bridge::BridgeConfig::validate_name(s)
            .map(|()| Self(s.to_owned()))
            .map_err(|e| e.to_string())
    }
}

impl fmt::Display for BridgeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

serde_by_text!(BridgeName);

/// A PostgreSQL URL warden administers (`--data`); its password is never shown: `Debug` names
/// only what follows the `@`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DataUrl(pub String);

impl std::fmt::Debug for DataUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = self.0.rsplit_once('@').map_or("…", |(_, host)| host);
        write!(f, "postgres://…@{shown}")
    }
}

impl std::str::FromStr for DataUrl {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(DataUrl(s.to_owned()))
    }
}

/// One OpenID Connect provider (`[[oidc]]` in the config file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcTable {
    /// The provider's id in warden: in the sign-in paths (`/login/oidc/<id>`), provider users'
    /// names (`alice_<id>`) and the audit trail (`oidc:<id>`); a valid name.
    pub id: String,
    /// The sign-in page's button text [absent: the id].
    #[serde(default)]
    pub label: Option<String>,
    /// The issuer URL; discovery must name exactly it. https, or http to a loopback address.
    pub issuer: String,
    /// warden's client id at the provider.
    pub client_id: String,
    /// A file holding warden's client secret (never the secret itself: it would show in `ps`
    /// and in copies of the config).
    pub client_secret_file: PathBuf,
    /// Scopes asked for besides `openid`.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// The exact redirect URL registered at the provider: this gateway's
    /// `/login/oidc/<id>/callback` as browsers reach it.
    pub redirect_url: String,
    /// The claim that names the person [`preferred_username`; `sub` where absent].
    #[serde(default = "default_username_claim")]
    pub username_claim: String,
    /// PEM trust roots for the provider's TLS [absent: the system's].
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Shortest time between two fetches of the provider's keys caused by a token naming an
    /// unknown key \[10s\].
    #[serde(default)]
    pub jwks_refetch: Option<Human>,
    /// Claims → clearance rules: `{ claim, value, level, categories, groups }`; the lowest
    /// level of the matching rules, the union of their categories and groups; no rule giving a
    /// level matched, no access.
    #[serde(default)]
    pub rules: Vec<warden_oidc::ClaimRule>,
    /// Claims → operator roles, for `warden login --provider <id>`: `{ claim, value, role =
    /// "owner" | "deployer" | "viewer", apps }` (apps only, and required, for a deployer);
    /// owner only if an owner rule matches, the union of the matching deployer rules' apps,
    /// viewer if a viewer rule matches; no rule matched, no operator access [absent: this
    /// provider makes no operators].
    #[serde(default)]
    pub operator_rules: Vec<warden_oidc::OperatorRule>,
    /// The exact redirect URL registered at the provider for the dashboard's sign-in: the
    /// API's `/ui/login/oidc/<id>/callback` as browsers reach it [absent: the dashboard offers
    /// no sign-in through this provider]. Needs `operator_rules`.
    #[serde(default)]
    pub dashboard_redirect_url: Option<String>,
}

fn default_scopes() -> Vec<String> {
    vec!["profile".into(), "groups".into()]
}

fn default_username_claim() -> String {
    "preferred_username".into()
}
