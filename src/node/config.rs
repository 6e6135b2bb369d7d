//! The node's configuration: a TOML file (see `configs/`) with `CRPF_` environment overrides.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::replica::ReplicaConfig;
use crate::transport::NatsConfig;
use crate::wire::{AuthKeys, KeyError};

/// A configuration that cannot be used; the message names the offending field.
#[derive(Debug, Error)]
#[non_exhaustive]
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
    /// The RESP front end ([`crate::resp`]): the request API over the Redis protocol. None:
    /// not served.
    #[serde(default)]
    pub resp: Option<crate::resp::RespConfig>,
    /// The filter catalog: filters created and dropped at run time (README, "Filters as
    /// data").
    #[serde(default)]
    pub catalog: CatalogSection,
    /// One replica per entry: the filters the node holds from its start (generation 0, not
    /// in the catalog). None is fine: filters then come from the catalog.
    #[serde(default)]
    pub filters: Vec<ReplicaConfig>,
    /// The cluster keys read from `node.auth_key_file` and `node.auth_accepted_key_files`,
    /// for the filters created at run time too.
    #[serde(skip)]
    pub auth_keys: Option<AuthKeys>,
}

/// The `[catalog]` section: filters created and dropped at run time, and what protects a
/// node from them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogSection {
    /// Follow the catalog (start and stop replicas of the filters created and dropped in it)
    /// and serve its request API. Off: the node holds its configured filters only.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Most filters a node hosts from the catalog; a create beyond it is refused.
    #[serde(default = "default_max_filters")]
    pub max_filters: usize,
    /// Largest filter a create may declare, in bytes of its initial state (see
    /// [`crate::FilterSpec::memory_bytes`]); a larger one is refused (valkey-bloom's
    /// `bloom-memory-usage-limit`).
    #[serde(default = "default_max_filter_bytes")]
    pub max_filter_bytes: u64,
    /// Replica settings of the filters created at run time, as in a `[[filters]]` entry
    /// without `name` and `filter` (which the create gives) and `data_dir` (which is
    /// `<node.data_dir>/<name>.g<generation>`).
    #[serde(default)]
    pub defaults: RuntimeFilterDefaults,
    /// Filters created at run time that get their own metric series (`filter` and `replica`
    /// labels); the others add up under `filter="_catalog"`, so that the number of series
    /// does not grow with the number of filters. Configured filters have their own unless
    /// `declared_metrics = "node"`.
    #[serde(default)]
    pub metrics_filters: Vec<String>,
    /// Where the filters of the configuration file (`[[filters]]`) record their metrics:
    /// `node` (the default), the node-wide series of the catalog filters
    /// (`filter="_catalog"`), but for those `metrics_filters` names (with the catalog on
    /// only: without it nothing parks, and they keep their own), or `own`, series of
    /// their own each (the default before issue 52: ~40 series, ~21 KB each, and a replica
    /// that never parks). Only those in the node-wide series park when idle, as catalog
    /// filters (README, "Filters as data"): a parked replica's own gauges would stand still.
    #[serde(default)]
    pub declared_metrics: DeclaredMetrics,
    /// Who takes the request API's operations of the catalog filters: `node` (the default),
    /// one queue subscription of the node for all of them (`<prefix>.*.api.>` in the group
    /// `<prefix>.api`), or `filter`, one of each replica in its filter's group
    /// (`<prefix>.<filter>.api`), as earlier versions did. A cluster must not mix the two:
    /// a request would reach one node of each group (README, "Filters as data").
    #[serde(default)]
    pub api_queue: ApiQueue,
    /// A catalog filter's replica that nothing used for this long parks, if it has no peer
    /// and nothing in flight: its actor goes, its state stays with the node, and the next
    /// request or message resumes it at once (README, "Filters as data"). 0: never.
    #[serde(default = "default_park_after_ms")]
    pub park_after_ms: u64,
    /// How long a dropped filter's data directory is kept, moved aside into
    /// `<node.data_dir>/.dropped/`, before it is removed (README, "Dropped filters"). The
    /// default is a day.
    #[serde(default = "default_drop_retention_ms")]
    pub drop_retention_ms: u64,
}

/// Where declared filters record their metrics ([`CatalogSection::declared_metrics`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeclaredMetrics {
    /// Series of their own (`filter` and `replica` labels), each ~40 series; never parked.
    Own,
    /// The node-wide series (`filter="_catalog"`), as catalog filters: one rule for both,
    /// `metrics_filters` naming those an operator watches one by one.
    #[default]
    Node,
}

/// Whose queue subscription takes the catalog filters' request API ([`CatalogSection::api_queue`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApiQueue {
    /// One subscription of the node for all its catalog filters: a node's subscriptions do
    /// not grow with its filters (each one's cost ~7 KB of memory).
    #[default]
    Node,
    /// One subscription of each replica, in its filter's queue group.
    Filter,
}

fn default_true() -> bool {
    true
}

fn default_max_filters() -> usize {
    100_000
}

fn default_max_filter_bytes() -> u64 {
    64 << 20
}

fn default_park_after_ms() -> u64 {
    60_000
}

fn default_drop_retention_ms() -> u64 {
    86_400_000
}

impl Default for CatalogSection {
    fn default() -> Self {
        Self {
            enabled: true,
            max_filters: default_max_filters(),
            max_filter_bytes: default_max_filter_bytes(),
            defaults: RuntimeFilterDefaults::default(),
            metrics_filters: Vec::new(),
            declared_metrics: DeclaredMetrics::default(),
            api_queue: ApiQueue::default(),
            park_after_ms: default_park_after_ms(),
            drop_retention_ms: default_drop_retention_ms(),
        }
    }
}

/// Replica settings of filters created at run time; unset fields take the defaults of
/// [`ReplicaConfig`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeFilterDefaults {
    /// [`ReplicaConfig::prefix`].
    pub prefix: Option<String>,
    /// [`ReplicaConfig::ack`].
    pub ack: Option<crate::replica::AckLevel>,
    /// [`ReplicaConfig::delta_interval_ms`].
    pub delta_interval_ms: Option<u64>,
    /// [`ReplicaConfig::anti_entropy_interval_ms`].
    pub anti_entropy_interval_ms: Option<u64>,
    /// [`ReplicaConfig::min_push_interval_ms`].
    pub min_push_interval_ms: Option<u64>,
    /// [`ReplicaConfig::catch_up_timeout_ms`].
    pub catch_up_timeout_ms: Option<u64>,
    /// [`ReplicaConfig::snapshot_interval_ms`].
    pub snapshot_interval_ms: Option<u64>,
    /// [`ReplicaConfig::metrics_interval_ms`].
    pub metrics_interval_ms: Option<u64>,
    /// [`ReplicaConfig::retire_after_ms`] (also of the node's shared replica id).
    pub retire_after_ms: Option<u64>,
    /// [`ReplicaConfig::id_lease_renew_ms`]: how often the node renews its shared replica id.
    pub id_lease_renew_ms: Option<u64>,
    /// [`ReplicaConfig::id_lease_block`]: tags the node's shared id reserves ahead.
    pub id_lease_block: Option<u64>,
    /// [`ReplicaConfig::replicated_timeout_ms`].
    pub replicated_timeout_ms: Option<u64>,
    /// [`ReplicaConfig::fsync_interval_ms`].
    pub fsync_interval_ms: Option<u64>,
    /// [`ReplicaConfig::max_item_bytes`].
    pub max_item_bytes: Option<usize>,
    /// [`ReplicaConfig::max_batch_items`].
    pub max_batch_items: Option<usize>,
}

impl RuntimeFilterDefaults {
    /// The replica configuration of `name` with `spec`, these settings applied.
    pub fn replica_config(&self, name: &str, spec: crate::FilterSpec) -> ReplicaConfig {
        let mut c = ReplicaConfig::new(name, spec);
        if let Some(p) = &self.prefix {
            c.prefix = p.clone();
        }
        c.ack = self.ack.or(c.ack);
        let set = |field: &mut u64, v: Option<u64>| {
            if let Some(v) = v {
                *field = v;
            }
        };
        set(&mut c.delta_interval_ms, self.delta_interval_ms);
        set(
            &mut c.anti_entropy_interval_ms,
            self.anti_entropy_interval_ms,
        );
        set(&mut c.min_push_interval_ms, self.min_push_interval_ms);
        set(&mut c.catch_up_timeout_ms, self.catch_up_timeout_ms);
        set(&mut c.snapshot_interval_ms, self.snapshot_interval_ms);
        set(&mut c.metrics_interval_ms, self.metrics_interval_ms);
        set(&mut c.retire_after_ms, self.retire_after_ms);
        set(&mut c.id_lease_renew_ms, self.id_lease_renew_ms);
        set(&mut c.id_lease_block, self.id_lease_block);
        set(&mut c.replicated_timeout_ms, self.replicated_timeout_ms);
        set(&mut c.fsync_interval_ms, self.fsync_interval_ms);
        c.max_item_bytes = self.max_item_bytes.unwrap_or(c.max_item_bytes);
        c.max_batch_items = self.max_batch_items.unwrap_or(c.max_batch_items);
        c
    }
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
    /// File of the cluster key (at least 32 bytes; surrounding whitespace is ignored) that
    /// turns on authenticated envelopes for every filter: frames are signed with it
    /// (HMAC-SHA256), and frames not signed by an accepted key are rejected. None: frames
    /// carry a checksum only.
    #[serde(default)]
    pub auth_key_file: Option<PathBuf>,
    /// Files of further keys accepted but not used to sign, for key rotation: add the new
    /// key here on every node, then make it `auth_key_file` (keeping the old one here), then
    /// drop the old one.
    #[serde(default)]
    pub auth_accepted_key_files: Vec<PathBuf>,
    /// Join a NATS cluster without a cluster key: anyone who can publish on the filters'
    /// subjects can then change their state (README, "Security"). Off: a node with `[nats]`
    /// and no `auth_key_file` refuses to start. The in-process bus needs no key.
    #[serde(default)]
    pub allow_unauthenticated: bool,
    /// Worker threads of the runtime beside the replicas' thread (the actors run on the main
    /// thread; the workers run the NATS connection's I/O and answer queries). 0: one thread
    /// for everything, so that a request never crosses threads inside the node. The default,
    /// 1, keeps the I/O beside the actors without tasks moving between workers: with 2, a
    /// single `add` cost the node 20-40% more CPU in side-by-side runs (CHANGELOG.md,
    /// benchmark history, request API). More workers serve more concurrent batch queries on
    /// a larger machine.
    #[serde(default = "default_io_threads")]
    pub io_threads: usize,
    /// Threads that write and fsync the write-ahead logs of all the node's filters (each log
    /// served by one of them; a thread's fsyncs of many logs are grouped in one round). Fixed,
    /// whatever the number of filters; at least 1.
    #[serde(default = "default_wal_threads")]
    pub wal_threads: usize,
}

fn default_io_threads() -> usize {
    1
}

fn default_wal_threads() -> usize {
    crate::replica::wal::DEFAULT_WRITER_THREADS
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
            auth_key_file: None,
            auth_accepted_key_files: Vec::new(),
            allow_unauthenticated: false,
            io_threads: default_io_threads(),
            wal_threads: default_wal_threads(),
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
        cfg.apply_auth_keys()?;
        Ok(cfg)
    }

    /// Reads the key files of `[node]` into every filter's `auth_keys`. Errors name the field
    /// and the file, never the key.
    fn apply_auth_keys(&mut self) -> Result<(), ConfigError> {
        let Some(signing) = &self.node.auth_key_file else {
            if !self.node.auth_accepted_key_files.is_empty() {
                return Err(ConfigError::Invalid {
                    field: "node.auth_accepted_key_files".into(),
                    reason: "accepted keys need a signing key: set node.auth_key_file".into(),
                });
            }
            return Ok(());
        };
        let read = |field: String, path: &Path| {
            AuthKeys::read_key_file(path).map_err(|e| ConfigError::Invalid {
                field,
                reason: match e {
                    KeyError::Read { .. } => e.to_string(),
                    _ => format!("{}: {e}", path.display()),
                },
            })
        };
        let mut keys = vec![read("node.auth_key_file".into(), signing)?];
        for (i, path) in self.node.auth_accepted_key_files.iter().enumerate() {
            keys.push(read(format!("node.auth_accepted_key_files[{i}]"), path)?);
        }
        let keys = AuthKeys::new(keys).map_err(|e| ConfigError::Invalid {
            field: "node.auth_key_file".into(),
            reason: e.to_string(),
        })?;
        for f in &mut self.filters {
            f.auth_keys = Some(keys.clone());
        }
        self.auth_keys = Some(keys);
        Ok(())
    }

    fn apply_data_dir(&mut self) {
        if let Some(base) = &self.node.data_dir {
            for f in self.filters.iter_mut().filter(|f| f.data_dir.is_none()) {
                f.data_dir = Some(base.join(&f.name));
            }
        }
    }

    /// Checks what serde cannot: a filter or the catalog, unique names, valid replica
    /// settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(Err(crate::resp::RespError::Zero(field))) =
            self.resp.as_ref().map(crate::resp::RespConfig::validate)
        {
            return Err(ConfigError::Invalid {
                field: format!("resp.{field}"),
                reason: "must be at least 1".into(),
            });
        }
        if self.filters.is_empty() && !self.catalog.enabled {
            return Err(ConfigError::Invalid {
                field: "filters".into(),
                reason: "declare at least one [[filters]] entry, or enable [catalog]".into(),
            });
        }
        let mut template = self.catalog.defaults.replica_config(
            "template",
            crate::FilterSpec::new(crate::FilterKind::GBloom, 1_000, 0.01),
        );
        // Filters created at run time keep their state under the node's data directory: the
        // levels that need a log are theirs exactly when there is one.
        template.data_dir = self.node.data_dir.clone();
        template.validate().map_err(|reason| ConfigError::Invalid {
            field: "catalog.defaults".into(),
            reason,
        })?;
        if self.node.wal_threads == 0 {
            return Err(ConfigError::Invalid {
                field: "node.wal_threads".into(),
                reason: "must be at least 1".into(),
            });
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.node.log) {
            return Err(ConfigError::Invalid {
                field: "node.log".into(),
                reason: format!("not a log filter (RUST_LOG syntax): {e}"),
            });
        }
        // A set, not a look at every earlier entry: 100,000 `[[filters]]` took 50 s to check.
        let mut names = std::collections::HashSet::with_capacity(self.filters.len());
        for (i, f) in self.filters.iter().enumerate() {
            f.validate().map_err(|reason| ConfigError::Invalid {
                field: format!("filters[{i}]"),
                reason,
            })?;
            if !names.insert(f.name.as_str()) {
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
        if self.nats.is_some()
            && self.node.auth_key_file.is_none()
            && !self.node.allow_unauthenticated
        {
            return Err(ConfigError::Invalid {
                field: "node.auth_key_file".into(),
                reason: "a node that joins a NATS cluster needs a cluster key, or anyone who \
                         can publish there can change its filters: run `crpf keygen --out \
                         cluster.key` once, give every node that file as node.auth_key_file \
                         (CRPF_NODE__AUTH_KEY_FILE); or set node.allow_unauthenticated = true \
                         to accept unsigned frames"
                    .into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::AckLevel;

    /// The commented examples in `configs/` are what users copy: they must load.
    #[test]
    fn example_configs_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        for name in [
            "node.toml",
            "cluster/node1.toml",
            "cluster/node2.toml",
            "cluster/node3.toml",
        ] {
            // The cluster's key is made on the operator's machine (`crpf keygen`): here, one
            // made for the test stands in for the file the example names.
            let dir = tempfile::tempdir().unwrap();
            let key = dir.path().join("cluster.key");
            std::fs::write(&key, crate::node::new_key_text().unwrap()).unwrap();
            let text = std::fs::read_to_string(root.join(name)).unwrap();
            let text = text.replace("\"./data/cluster.key\"", &format!("{key:?}"));
            let cfg = NodeConfig::from_toml_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!cfg.filters.is_empty(), "{name}");
            assert_eq!(
                cfg.nats.is_some(),
                cfg.auth_keys.is_some(),
                "{name}: an example that joins NATS uses a cluster key"
            );
        }
        // Its key file lives on the operator's machine: only that field may fail.
        match NodeConfig::load(&root.join("auth-tls.toml")) {
            Ok(_) => {}
            Err(ConfigError::Invalid { field, .. }) => assert_eq!(field, "node.auth_key_file"),
            Err(e) => panic!("auth-tls.toml: {e}"),
        }
    }

    #[test]
    fn a_name_declared_twice_is_refused_wherever_the_second_is() {
        let entry = |name: &str| {
            format!(
                "[[filters]]\nname = \"{name}\"\nfilter = {{ kind = \"g_bloom\", capacity = 10, fpr = 0.01 }}\n"
            )
        };
        let many: String = (0..1_000).map(|i| entry(&format!("f{i}"))).collect();
        assert!(NodeConfig::from_toml_str(&many).is_ok());
        let twice = format!("{many}{}", entry("f500"));
        match NodeConfig::from_toml_str(&twice) {
            Err(ConfigError::Invalid { field, reason }) => {
                assert_eq!(field, "filters[1000].name");
                assert!(reason.contains("`f500` is declared twice"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_resp_section_takes_defaults_and_refuses_zero_limits() {
        let with_resp = |resp: &str| {
            NodeConfig::from_toml_str(&format!(
                "[resp]\n{resp}\n[[filters]]\nname = \"a\"\nfilter = {{ kind = \"g_bloom\", capacity = 100, fpr = 0.01 }}\n"
            ))
        };
        let cfg = with_resp("listen = \"127.0.0.1:6380\"").unwrap();
        let resp = cfg.resp.unwrap();
        assert_eq!(
            resp,
            crate::resp::RespConfig::new("127.0.0.1:6380".parse().unwrap())
        );
        assert_eq!(
            invalid_field(with_resp("listen = \"127.0.0.1:6380\"\nmax_pipeline = 0")),
            ("resp.max_pipeline".into(), "must be at least 1".into())
        );
        assert!(matches!(with_resp(""), Err(ConfigError::Load(e)) if e.contains("listen")));
        assert!(NodeConfig::from_toml_str("[[filters]]\nname = \"a\"\nfilter = { kind = \"g_bloom\", capacity = 100, fpr = 0.01 }\n").unwrap().resp.is_none());
    }

    fn with_keys(node: &str) -> Result<NodeConfig, ConfigError> {
        NodeConfig::from_toml_str(&format!(
            "[node]\n{node}\n[[filters]]\nname = \"a\"\nfilter = {{ kind = \"g_bloom\", capacity = 100, fpr = 0.01 }}\n\
             [[filters]]\nname = \"b\"\nfilter = {{ kind = \"or_cuckoo\", capacity = 100, fpr = 0.01 }}\n"
        ))
    }

    fn invalid_field(r: Result<NodeConfig, ConfigError>) -> (String, String) {
        match r {
            Err(ConfigError::Invalid { field, reason }) => (field, reason),
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    /// Issue 49: items up to 1 MiB by default (RedisBloom takes any size), and both item
    /// limits settable for filters the catalog makes.
    #[test]
    fn item_limits_default_to_a_mebibyte_and_catalog_defaults_set_them() {
        let spec = crate::FilterSpec::new(crate::FilterKind::GBloom, 100, 0.01);
        let cfg = NodeConfig::from_toml_str("[node]\n").unwrap();
        let runtime = cfg.catalog.defaults.replica_config("r", spec.clone());
        assert_eq!(runtime.max_item_bytes, 1 << 20);
        let cfg = NodeConfig::from_toml_str(
            "[node]\n[catalog.defaults]\nmax_item_bytes = 10\nmax_batch_items = 5\n",
        )
        .unwrap();
        let runtime = cfg.catalog.defaults.replica_config("r", spec);
        assert_eq!((runtime.max_item_bytes, runtime.max_batch_items), (10, 5));
        let (field, reason) = invalid_field(NodeConfig::from_toml_str(
            "[node]\n[catalog.defaults]\nmax_item_bytes = 0\n",
        ));
        assert_eq!(field, "catalog.defaults");
        assert!(
            reason.contains("max_item_bytes must be positive"),
            "{reason}"
        );
    }

    /// Issue 25: `logged` and `fsync_interval_ms` in `[[filters]]` and `[catalog.defaults]`,
    /// with the default, the range, and the data directory the level needs.
    #[test]
    fn logged_level_and_fsync_interval_are_read_and_checked() {
        let node = |data: &str, filter: &str, defaults: &str| {
            NodeConfig::from_toml_str(&format!(
                "[node]\n{data}\n[catalog.defaults]\n{defaults}\n\
                 [[filters]]\nname = \"a\"\nfilter = {{ kind = \"g_bloom\", capacity = 100, fpr = 0.01 }}\n{filter}\n"
            ))
        };
        let data = "data_dir = \"/var/lib/crpf\"";
        let cfg = node(data, "", "").unwrap();
        assert_eq!(cfg.filters[0].fsync_interval_ms, 1_000);
        assert_eq!(cfg.catalog.defaults.fsync_interval_ms, None);

        let cfg = node(
            data,
            "ack = \"logged\"\nfsync_interval_ms = 250",
            "ack = \"logged\"\nfsync_interval_ms = 2000",
        )
        .unwrap();
        assert_eq!(cfg.filters[0].ack, Some(AckLevel::Logged));
        assert_eq!(cfg.filters[0].fsync_interval_ms, 250);
        let runtime = cfg.catalog.defaults.replica_config(
            "r",
            crate::FilterSpec::new(crate::FilterKind::GBloom, 100, 0.01),
        );
        assert_eq!(
            (runtime.ack, runtime.fsync_interval_ms),
            (Some(AckLevel::Logged), 2000)
        );

        for bad in ["0", "60001"] {
            let (field, reason) =
                invalid_field(node(data, &format!("fsync_interval_ms = {bad}"), ""));
            assert_eq!(field, "filters[0]");
            assert!(
                reason.contains("fsync_interval_ms must be 1 to 60000"),
                "{reason}"
            );
            let (field, _) = invalid_field(node(data, "", &format!("fsync_interval_ms = {bad}")));
            assert_eq!(field, "catalog.defaults");
        }
        node(data, "fsync_interval_ms = 60000", "fsync_interval_ms = 1").unwrap();
        // Without a data directory there is no log to write.
        let (field, reason) = invalid_field(node("", "ack = \"logged\"", ""));
        assert_eq!(field, "filters[0]");
        assert!(reason.contains("needs a data_dir"), "{reason}");
        let (field, _) = invalid_field(node("", "", "ack = \"logged\""));
        assert_eq!(field, "catalog.defaults");
        assert!(node("", "ack = \"eventually\"", "").is_err());
    }

    #[test]
    fn log_and_io_threads_are_read_and_a_bad_log_filter_names_its_field() {
        let cfg = with_keys("log = \"crpf=debug,warn\"\nio_threads = 0").unwrap();
        assert_eq!(
            (cfg.node.log.as_str(), cfg.node.io_threads),
            ("crpf=debug,warn", 0)
        );
        let (field, reason) = invalid_field(with_keys("log = \"crpf=[\""));
        assert_eq!(field, "node.log", "{reason}");
    }

    #[test]
    fn declared_metrics_default_to_the_node_wide_series_and_take_own() {
        let read = |catalog: &str| NodeConfig::from_toml_str(&format!("[catalog]\n{catalog}"));
        assert_eq!(
            read("").unwrap().catalog.declared_metrics,
            DeclaredMetrics::Node
        );
        let own = read("declared_metrics = \"own\"").unwrap();
        assert_eq!(own.catalog.declared_metrics, DeclaredMetrics::Own);
        assert!(read("declared_metrics = \"filter\"").is_err());
    }

    #[test]
    fn wal_threads_default_to_the_pool_size_and_zero_is_refused() {
        let cfg = with_keys("").unwrap();
        assert_eq!(
            cfg.node.wal_threads,
            crate::replica::wal::DEFAULT_WRITER_THREADS
        );
        assert_eq!(with_keys("wal_threads = 3").unwrap().node.wal_threads, 3);
        let (field, reason) = invalid_field(with_keys("wal_threads = 0"));
        assert_eq!(field, "node.wal_threads", "{reason}");
    }

    #[test]
    fn key_files_apply_to_every_filter() {
        let dir = tempfile::tempdir().unwrap();
        let (k1, k2) = (dir.path().join("k1"), dir.path().join("k2"));
        std::fs::write(&k1, "first key of forty bytes, give or take..\n").unwrap();
        std::fs::write(&k2, [7u8; 32]).unwrap();
        let cfg = with_keys("").unwrap();
        assert!(cfg.filters.iter().all(|f| f.auth_keys.is_none()));

        let cfg = with_keys(&format!(
            "auth_key_file = {:?}\nauth_accepted_key_files = [{:?}]",
            k1, k2
        ))
        .unwrap();
        let keys = cfg.filters[0].auth_keys.clone().expect("keys applied");
        assert_eq!(keys.len(), 2);
        assert_eq!(cfg.filters[1].auth_keys, Some(keys.clone()));
        // The first key signs.
        let only_first = AuthKeys::new([b"first key of forty bytes, give or take..".to_vec()]);
        assert!(only_first.unwrap().verify(b"m", &keys.sign(b"m")));
        // Never shown.
        assert!(!format!("{cfg:?}").contains("forty"));
    }

    #[test]
    fn joining_nats_without_a_key_is_refused_unless_allowed() {
        let with_nats = |node: &str| {
            NodeConfig::from_toml_str(&format!(
                "[node]\n{node}\n[nats]\nservers = [\"nats://127.0.0.1:4222\"]\n\
                 [[filters]]\nname = \"a\"\nfilter = {{ kind = \"g_bloom\", capacity = 100, fpr = 0.01 }}\n"
            ))
        };
        let (field, reason) = invalid_field(with_nats(""));
        assert_eq!(field, "node.auth_key_file");
        for hint in ["crpf keygen", "allow_unauthenticated = true"] {
            assert!(reason.contains(hint), "{reason}");
        }
        let open = with_nats("allow_unauthenticated = true").unwrap();
        assert!(open.auth_keys.is_none());
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k");
        std::fs::write(&key, crate::node::new_key_text().unwrap()).unwrap();
        let keyed = with_nats(&format!("auth_key_file = {key:?}")).unwrap();
        assert!(keyed.filters[0].auth_keys.is_some());
        // The in-process bus needs no key.
        assert!(with_keys("").unwrap().auth_keys.is_none());
    }

    #[test]
    fn bad_key_files_name_their_field() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, [1u8; 32]).unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "0123456789abcdef0123456789abcde\n").unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let missing = dir.path().join("missing");

        let (field, reason) = invalid_field(with_keys(&format!("auth_key_file = {missing:?}")));
        assert_eq!(field, "node.auth_key_file");
        assert!(reason.contains("missing"), "{reason}");
        let (field, reason) = invalid_field(with_keys(&format!("auth_key_file = {empty:?}")));
        assert_eq!(field, "node.auth_key_file");
        assert!(reason.contains("empty"), "{reason}");
        let (field, reason) = invalid_field(with_keys(&format!("auth_key_file = {short:?}")));
        assert_eq!(field, "node.auth_key_file");
        assert!(reason.contains("31 bytes"), "{reason}");
        assert!(!reason.contains("0123456789"), "the key leaked: {reason}");
        let (field, _) = invalid_field(with_keys(&format!(
            "auth_key_file = {good:?}\nauth_accepted_key_files = [{good:?}, {short:?}]"
        )));
        assert_eq!(field, "node.auth_accepted_key_files[1]");
        let (field, _) = invalid_field(with_keys(&format!("auth_accepted_key_files = [{good:?}]")));
        assert_eq!(field, "node.auth_accepted_key_files");
    }
}
