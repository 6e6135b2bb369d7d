//! Which JetStream failures are worth retrying.
//!
//! A JetStream cluster that is starting, or that lost a server, answers for a while with "no
//! responders", timeouts, "temporarily unavailable" or "insufficient resources" (its peers are
//! not all known yet) while it elects its meta leader and the leaders of its streams. A node must
//! wait that out instead of exiting; it must still stop at once on what waiting cannot fix (a bad
//! bucket name, a bucket that exists with another configuration, replicas on a server that is
//! not clustered, an account without JetStream, a permission violation).

use std::error::Error as StdError;
use std::time::Duration;

use async_nats::jetstream::{self, ErrorCode, context, kv, stream};

/// Whether a failed operation may succeed if tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// The cluster may get there (no responders, timeouts, leader elections).
    Transient,
    /// Waiting will not help (configuration, permissions).
    Permanent,
}

/// Classifies an async-nats error by walking its chain of sources: the first error in the chain
/// that says something definite decides. Errors that say nothing definite are transient: a
/// node would rather wait (bounded by a deadline, with warnings naming the error) than exit
/// because a cluster was slow in a way nobody listed.
pub(crate) fn classify(err: &(dyn StdError + 'static)) -> Retry {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(r) = decide(e) {
            return r;
        }
        cur = e.source();
    }
    Retry::Transient
}

/// What one error of the chain says, if anything definite.
fn decide(e: &(dyn StdError + 'static)) -> Option<Retry> {
    use Retry::{Permanent, Transient};
    if let Some(e) = e.downcast_ref::<jetstream::Error>() {
        return Some(js_code(e.error_code()));
    }
    if let Some(e) = e.downcast_ref::<async_nats::RequestError>() {
        use async_nats::RequestErrorKind as K;
        return match e.kind() {
            K::NoResponders | K::TimedOut => Some(Transient),
            K::InvalidSubject | K::MaxPayloadExceeded => Some(Permanent),
            K::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<context::RequestError>() {
        use context::RequestErrorKind as K;
        return match e.kind() {
            K::NoResponders | K::TimedOut => Some(Transient),
            K::InvalidSubject => Some(Permanent),
            K::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<context::PublishError>() {
        use context::PublishErrorKind as K;
        return match e.kind() {
            // StreamNotFound is a 503 "no responders": the stream has no leader yet.
            K::StreamNotFound | K::TimedOut | K::BrokenPipe | K::MaxAckPending => Some(Transient),
            K::MaxPayloadExceeded | K::WrongLastMessageId | K::WrongLastSequence => Some(Permanent),
            K::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<context::AccountError>() {
        use context::AccountErrorKind as K;
        return match e.kind() {
            K::TimedOut | K::JetStreamUnavailable => Some(Transient),
            K::JetStream(j) => Some(js_code(j.error_code())),
            K::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<context::KeyValueError>() {
        use context::KeyValueErrorKind as K;
        return match e.kind() {
            K::InvalidStoreName => Some(Permanent),
            K::GetBucket | K::JetStream => None,
        };
    }
    if let Some(e) = e.downcast_ref::<context::CreateKeyValueError>() {
        use context::CreateKeyValueErrorKind as K;
        return match e.kind() {
            K::InvalidStoreName | K::TooLongHistory | K::LimitMarkersNotSupported => {
                Some(Permanent)
            }
            K::TimedOut => Some(Transient),
            K::JetStream | K::BucketCreate => None,
        };
    }
    if let Some(e) = e.downcast_ref::<context::CreateStreamError>() {
        use context::CreateStreamErrorKind as K;
        return match e.kind() {
            K::JetStreamUnavailable | K::TimedOut | K::NotFound => Some(Transient),
            K::EmptyStreamName | K::InvalidStreamName | K::DomainAndExternalSet => Some(Permanent),
            K::JetStream(j) => Some(js_code(j.error_code())),
            K::Response | K::ResponseParse => None,
        };
    }
    if let Some(e) = e.downcast_ref::<context::GetStreamError>() {
        use context::GetStreamErrorKind as K;
        return match e.kind() {
            K::EmptyName | K::InvalidStreamName => Some(Permanent),
            K::JetStream(j) => Some(js_code(j.error_code())),
            K::Request => None,
        };
    }
    if let Some(e) = e.downcast_ref::<kv::CreateError>() {
        use kv::CreateErrorKind as K;
        return match e.kind() {
            K::InvalidKey => Some(Permanent),
            // AlreadyExists is an answer, handled by the caller; the rest say what failed,
            // their source says why.
            K::AlreadyExists | K::Publish | K::Ack | K::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<kv::EntryError>() {
        use kv::EntryErrorKind as K;
        return match e.kind() {
            K::InvalidKey => Some(Permanent),
            K::TimedOut => Some(Transient),
            K::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<kv::WatchError>() {
        use kv::WatchErrorKind as K;
        return match e.kind() {
            K::InvalidKey => Some(Permanent),
            K::TimedOut => Some(Transient),
            K::ConsumerCreate | K::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<kv::UpdateError>() {
        use kv::UpdateErrorKind as K;
        return match e.kind() {
            K::InvalidKey => Some(Permanent),
            K::TimedOut => Some(Transient),
            K::WrongLastRevision | K::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<kv::PutError>() {
        use kv::PutErrorKind as K;
        return match e.kind() {
            K::InvalidKey => Some(Permanent),
            K::Publish | K::Ack => None,
        };
    }
    if let Some(e) = e.downcast_ref::<stream::ConsumerError>() {
        use stream::ConsumerErrorKind as K;
        return match e.kind() {
            K::TimedOut => Some(Transient),
            K::InvalidConsumerType | K::InvalidName => Some(Permanent),
            K::JetStream(j) => Some(js_code(j.error_code())),
            K::Request | K::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<stream::DirectGetError>() {
        use stream::DirectGetErrorKind as K;
        return match e.kind() {
            K::TimedOut => Some(Transient),
            // A status answer (503 no responders, 408...): the stream is between leaders.
            K::ErrorResponse(..) => Some(Transient),
            K::InvalidSubject => Some(Permanent),
            K::NotFound | K::Request | K::Other => None,
        };
    }
    None
}

/// JetStream API error codes (the server's `err_code`).
fn js_code(code: ErrorCode) -> Retry {
    match code {
        // The cluster is forming, electing, or missing a server for a while; a stream or
        // consumer is between leaders; placement before every peer is known reports
        // "insufficient resources" or "no suitable peers".
        ErrorCode::CLUSTER_INCOMPLETE
        | ErrorCode::CLUSTER_NO_PEERS
        | ErrorCode::CLUSTER_NOT_ASSIGNED
        | ErrorCode::CLUSTER_NOT_AVAILABLE
        | ErrorCode::CLUSTER_NOT_LEADER
        | ErrorCode::INSUFFICIENT_RESOURCES
        | ErrorCode::RAFT_GENERAL
        | ErrorCode::STREAM_NOT_FOUND
        | ErrorCode::STREAM_OFFLINE
        | ErrorCode::STREAM_CREATE
        | ErrorCode::STREAM_STORE_FAILED
        | ErrorCode::CONSUMER_OFFLINE
        | ErrorCode::CONSUMER_CREATE
        | ErrorCode::CONSUMER_NOT_FOUND
        | ErrorCode::CONSUMER_STORE_FAILED
        | ErrorCode::PEER_REMAP
        // "JetStream not enabled": a server whose JetStream is still starting says so too.
        | ErrorCode::JETSTREAM_NOT_ENABLED => Retry::Transient,
        // Configuration, limits and permissions: the same request fails the same way.
        ErrorCode::BAD_REQUEST
        | ErrorCode::INVALID_JSON
        | ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
        | ErrorCode::NO_ACCOUNT
        | ErrorCode::CLUSTER_NOT_ACTIVE
        | ErrorCode::CLUSTER_REQUIRED
        | ErrorCode::CLUSTER_TAGS
        | ErrorCode::NOT_SUPPORTED_IN_CLUSTER_MODE
        | ErrorCode::STREAM_REPLICAS_NOT_SUPPORTED
        | ErrorCode::STREAM_NAME_EXIST
        | ErrorCode::STREAM_INVALID_CONFIG
        | ErrorCode::STREAM_INVALID
        | ErrorCode::STREAM_SUBJECT_OVERLAP
        | ErrorCode::STREAM_LIMITS
        | ErrorCode::STREAM_MAX_BYTES_REQUIRED
        | ErrorCode::STREAM_SEALED
        | ErrorCode::MAXIMUM_STREAMS_LIMIT
        | ErrorCode::MAXIMUM_CONSUMERS_LIMIT
        | ErrorCode::ACCOUNT_RESOURCES_EXCEEDED
        | ErrorCode::STORAGE_RESOURCES_EXCEEDED
        | ErrorCode::MEMORY_RESOURCES_EXCEEDED
        | ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
        | ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM => Retry::Permanent,
        _ => Retry::Transient,
    }
}

/// Delays between attempts: exponential from 100 ms, capped at 2 s, each with up to as much
/// again of random jitter, so that nodes started together do not retry in lockstep.
pub(crate) fn backoff() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .without_max_times()
        .build()
}

/// Whether a server error (`-ERR`) is a permission violation on the subjects a replica id
/// claim uses (JetStream's API, the KV bucket's subjects, or the reply inboxes).
pub(crate) fn is_claim_permission_violation(server_error: &str) -> bool {
    let e = server_error.to_ascii_lowercase();
    e.contains("permissions violation")
        && (e.contains("$js.") || e.contains("$kv.") || e.contains("_inbox."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::context::{
        CreateKeyValueError, CreateKeyValueErrorKind, CreateStreamError, CreateStreamErrorKind,
        PublishError, PublishErrorKind,
    };

    fn api_error(code: u64) -> jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": 503, "err_code": code, "description": "test"
        }))
        .unwrap()
    }

    #[test]
    fn cluster_states_are_transient_and_configuration_is_not() {
        // The failure of issue 8: a claim's atomic create while the KV stream has no leader.
        let no_leader = kv::CreateError::with_source(
            kv::CreateErrorKind::Publish,
            PublishError::new(PublishErrorKind::StreamNotFound),
        );
        assert_eq!(classify(&no_leader), Retry::Transient);
        let unavailable = CreateKeyValueError::with_source(
            CreateKeyValueErrorKind::BucketCreate,
            CreateStreamError::new(CreateStreamErrorKind::JetStreamUnavailable),
        );
        assert_eq!(classify(&unavailable), Retry::Transient);
        for code in [10008, 10023, 10005, 10009, 10076, 10118, 99_999] {
            let e = CreateKeyValueError::with_source(
                CreateKeyValueErrorKind::BucketCreate,
                CreateStreamError::new(CreateStreamErrorKind::JetStream(api_error(code))),
            );
            assert_eq!(classify(&e), Retry::Transient, "err_code {code}");
        }
        for code in [10058, 10074, 10039, 10052, 10003] {
            let e = CreateKeyValueError::with_source(
                CreateKeyValueErrorKind::BucketCreate,
                CreateStreamError::new(CreateStreamErrorKind::JetStream(api_error(code))),
            );
            assert_eq!(classify(&e), Retry::Permanent, "err_code {code}");
        }
        let bad_name = CreateKeyValueError::new(CreateKeyValueErrorKind::InvalidStoreName);
        assert_eq!(classify(&bad_name), Retry::Permanent);
        let bad_key = kv::CreateError::new(kv::CreateErrorKind::InvalidKey);
        assert_eq!(classify(&bad_key), Retry::Permanent);
        let timeout = kv::EntryError::new(kv::EntryErrorKind::TimedOut);
        assert_eq!(classify(&timeout), Retry::Transient);
        // Nothing definite anywhere in the chain: wait rather than exit.
        let vague = kv::CreateError::new(kv::CreateErrorKind::Other);
        assert_eq!(classify(&vague), Retry::Transient);
    }

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        let d: Vec<Duration> = backoff().take(20).collect();
        assert!(d[0] >= Duration::from_millis(100) && d[0] <= Duration::from_millis(200));
        assert!(d.iter().all(|d| *d <= Duration::from_secs(4)));
        assert!(d[19] >= Duration::from_secs(2));
    }

    #[test]
    fn permission_violations_on_claim_subjects() {
        assert!(is_claim_permission_violation(
            "Permissions Violation for Publish to \"$JS.API.STREAM.INFO.KV_crpf_replicas\""
        ));
        assert!(!is_claim_permission_violation(
            "Permissions Violation for Publish to \"crpf.users.delta\""
        ));
        assert!(!is_claim_permission_violation("maximum payload violation"));
    }
}
