//! Acknowledgement levels of updates: how much must have happened to an update before its
//! replica answers for it (the request API's `Crpf-Ack` header, `ack` in configuration).
//! The bookkeeping of updates waiting for their level is the replica's (`crate::replica`).

use serde::{Deserialize, Serialize};

/// How much must have happened to an update before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckLevel {
    /// Applied in memory. Fastest; a crash before the next commit (every `delta_interval_ms`)
    /// loses it.
    Local,
    /// Applied in memory, answered at once like `Local`, and committed within a millisecond:
    /// written to the write-ahead log without waiting for an fsync, which comes at most
    /// `fsync_interval_ms` later (Redis's `appendfsync everysec`). A crash of the process
    /// loses only the updates whose commit was not written yet (in flight); a crash of the
    /// machine also those written in the last `fsync_interval_ms`. Needs a data directory.
    Logged,
    /// In the write-ahead log, fsynced, before the answer: survives a crash of the process or
    /// the machine. Needs a data directory.
    Durable,
    /// Durable where there is a data directory, and merged by `replicated_peers` peers (by
    /// default a majority of the filter's known replicas, this one included: the ids its
    /// registry holds, whether their replicas are heard from or not) before the answer:
    /// survives the loss of this replica's disk.
    Replicated,
}

impl AckLevel {
    /// Every level, weakest first.
    pub const ALL: [AckLevel; 4] = [
        AckLevel::Local,
        AckLevel::Logged,
        AckLevel::Durable,
        AckLevel::Replicated,
    ];

    /// Whether its updates are answered when applied (else they wait for a commit).
    pub fn answered_at_apply(self) -> bool {
        matches!(self, AckLevel::Local | AckLevel::Logged)
    }

    /// Whether it needs a write-ahead log (a data directory).
    pub fn needs_log(self) -> bool {
        matches!(self, AckLevel::Logged | AckLevel::Durable)
    }

    /// The name used in configuration and in the request API's `Crpf-Ack` header.
    pub fn name(self) -> &'static str {
        match self {
            AckLevel::Local => "local",
            AckLevel::Logged => "logged",
            AckLevel::Durable => "durable",
            AckLevel::Replicated => "replicated",
        }
    }
}

impl std::fmt::Display for AckLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AckLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        AckLevel::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!("unknown ack level `{s}` (local, logged, durable or replicated)")
            })
    }
}
