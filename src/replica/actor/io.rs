//! The shell's I/O, grouped: what a replica publishes and subscribes with, how it frames its
//! messages, its log's writer ([`Io`]), and its queues ([`Channels`]).

use std::sync::Arc;

use super::Inbound;
use super::pump::Outbound;
use crate::replica::wal::WalWriter;
use crate::transport::digests::DigestBatcher;
use crate::transport::{LogLimiter, MessageStream, Subjects, Transport};
use crate::wire::{Expect, WireCodec};

/// What a replica publishes and subscribes with, and how it frames.
pub(super) struct Io {
    pub transport: Arc<dyn Transport>,
    /// Replication's publications and subscription (see [`super::Setup::replication_transport`]).
    pub replication_transport: Arc<dyn Transport>,
    /// Shared with its request API, its replication router and its `$SRV` service: six
    /// strings each copy.
    pub subjects: Arc<Subjects>,
    /// What its frames and its peers' must be (filter, kind, parameters, generation).
    pub expect: Expect,
    /// Encodes and decodes (signs and verifies) this replica's frames.
    pub codec: WireCodec,
    /// Rate-limits its warnings.
    pub limiter: Arc<LogLimiter>,
    /// Its node's digest batches, where its digests go if it has one.
    pub digest_batches: Option<Arc<DigestBatcher>>,
    /// The write-ahead log's writer, with a data directory.
    pub wal: Option<WalWriter>,
}

/// A replica's queues: messages in (from its subscriptions and its handles), frames out (to
/// its publisher task).
pub(super) struct Channels {
    pub inbound_tx: flume::Sender<Inbound>,
    /// Taken as the actor starts (a stream of the actor's).
    pub inbound_rx: Option<flume::Receiver<Inbound>>,
    pub outbound: flume::Sender<Outbound>,
    /// What the publisher task takes from; the task runs while there is something to take
    /// ([`super::Shared::publishing`]).
    pub outbound_rx: flume::Receiver<Outbound>,
    /// Its own replication subscription, until the actor starts forwarding it; none if the
    /// node routes its replication subject.
    pub replication: Option<MessageStream>,
}
