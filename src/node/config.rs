//! The node's configuration: a TOML file (see `configs/`) with `CRPF_` environment overrides.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::replica::ReplicaConfig;
use crate::transport::NatsConfig;

/// A configuration that cannot be used; the message names the offending field.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file is unreadable or not TOML, or fields are unknown, missing or mistyped.
    #[error("{0}")]
    Load(String),
    /// The values parse but do not make sense together.
    #[error("invalid configuration: `{field}`: {reason}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// Why it is rejected.
        reason: String,
    },
}

/// Everything a `crpf node` runs: where it exports metrics, how it reaches NATS, and the
/// filters it holds a replica of.
///
/// ```
/// let cfg = crpf::node::NodeConfig::from_toml_str(r#"
///     [node]
///     metrics_addr = "127.0.0.1:9464"
///
///     [[filters]]
///     name = "sessions"
///     filter = { kind = "or_cuckoo", capacity = 100000, fpr = 0.01 }
/// "#).unwrap();
/// assert!(cfg.nats.is_none()); // no [nats]: the in-process bus
/// assert_eq!(cfg.filters[0].name, "sessions");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Node-wide settings.
    #[serde(default)]
    pub node: NodeSection,
    /// How to reach NATS; without it the node's replicas talk over an in-process bus.
    #[serde(default)]
    pub nats: Option<NatsConfig>,
    /// One replica per entry.
    pub filters: Vec<ReplicaConfig>,
}

/// The `[node]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// Where the Prometheus exporter listens (`/metrics`).
    #[serde(default = "default_metrics_addr")]
    pub metrics_addr: SocketAddr,
    /// Base data directory: a filter without its own `data_dir` keeps its state in
    /// `<data_dir>/<filter name>`. None: state lives in memory only.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    /// Log filter (`RUST_LOG` syntax) when `RUST_LOG` is not set.
    #[serde(default = "default_log")]
    pub log: String,
}

fn default_metrics_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9464))
}

fn default_log() -> String {
    "info".into()
}

impl Default for NodeSection {
    fn default() -> Self {
        Self {
            metrics_addr: default_metrics_addr(),
            data_dir: None,
            log: default_log(),
        }
    }
}

/// Environment variables override file values: `CRPF_NODE__METRICS_ADDR=0.0.0.0:9464`,
/// `CRPF_NATS__SERVERS='["nats://a:4222","nats://b:4222"]'`. Only variables with a `__`
/// section separator count, so that other `CRPF_` variables do not trip unknown-field checks.
fn env() -> Env {
    Env::prefixed("CRPF_")
        .filter(|k| k.as_str().contains("__"))
        .split("__")
}

/// One line per problem, each naming its field as a dotted path (`node.metrics_addr`,
/// `filters.0.filter.capacity`) and where the value came from.
fn describe(errors: figment::Error) -> String {
    errors
        .into_iter()
        .map(|e| {
            let field = e.path.join(".");
            let origin = e
                .metadata
                .as_ref()
                .map(|m| format!(" ({})", m.name))
                .unwrap_or_default();
            if field.is_empty() {
                format!("configuration{origin}: {}", e.kind)
            } else {
                format!("`{field}`{origin}: {}", e.kind)
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl NodeConfig {
    /// Loads a TOML file, applies environment overrides, and validates.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        if !path.is_file() {
            return Err(ConfigError::Invalid {
                field: "--config".into(),
                reason: format!("{} is not a readable file", path.display()),
            });
        }
        Self::from_figment(Figment::from(Toml::file_exact(path)).merge(env()))
    }

    /// Parses TOML text (no environment overrides) and validates.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Self::from_figment(Figment::from(Toml::string(text)))
    }

    fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        let mut cfg: NodeConfig = figment
            .extract()
            .map_err(|e| ConfigError::Load(describe(e)))?;
        cfg.apply_data_dir();
        cfg.validate()?;
        Ok(cfg)
    }

    fn apply_data_dir(&mut self) {
        if let Some(base) = &self.node.data_dir {
            for f in self.filters.iter_mut().filter(|f| f.data_dir.is_none()) {
                f.data_dir = Some(base.join(&f.name));
            }
        }
    }

    /// Checks what serde cannot: at least one filter, unique names, valid replica settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.filters.is_empty() {
            return Err(ConfigError::Invalid {
                field: "filters".into(),
                reason: "declare at least one [[filters]] entry".into(),
            });
        }
        for (i, f) in self.filters.iter().enumerate() {
            f.validate().map_err(|reason| ConfigError::Invalid {
                field: format!("filters[{i}]"),
                reason,
            })?;
            if self.filters[..i].iter().any(|g| g.name == f.name) {
                return Err(ConfigError::Invalid {
                    field: format!("filters[{i}].name"),
                    reason: format!("`{}` is declared twice", f.name),
                });
            }
        }
        if let Some(nats) = &self.nats
            && nats.servers.is_empty()
        {
            return Err(ConfigError::Invalid {
                field: "nats.servers".into(),
                reason: "give at least one server URL, or drop [nats] for the in-process bus"
                    .into(),
            });
        }
        Ok(())
    }
}
