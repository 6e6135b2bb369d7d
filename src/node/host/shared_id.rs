//! The replica id a node's catalog filters (and configured filters without tags) share
//! ([`SharedId`]), kept in its data directory across restarts.

use std::path::Path;
use std::sync::Arc;

use crate::FilterSpec;
use crate::node::NodeError;
use crate::node::config::CatalogSection;
use crate::replica::{Identity, ReplicaConfig, SharedId};
use crate::transport::Transport;

/// Whether a configured filter of `kind` takes the node's shared id (with one, `shared`)
/// instead of claiming and renewing one of its own (two JetStream requests per filter every
/// `id_lease_renew_ms`, and two more at its start: 10,000 configured filters kept
/// nats-server 75% busy). Only kinds without tags, whose replicas issue nothing under their
/// id that another replica of the filter must never issue again: a replica outside any node
/// (or on a node without a catalog) claims in the filter's own namespace, whose ids may equal
/// the node's (see [`SharedId`]), and tags issued twice would lose elements. Kinds whose ids
/// serve one run only (`counting_cuckoo`) keep their own as everywhere.
pub(super) fn declared_shares_id(shared: bool, kind: crate::FilterKind) -> bool {
    shared && kind.reuses_ids() && !kind.tagged()
}

/// The settings of the node's shared id: the catalog's replica defaults.
pub(super) fn lease_template(settings: &CatalogSection) -> ReplicaConfig {
    let spec = FilterSpec::new(crate::FilterKind::GBloom, 1_000, 0.01);
    settings.defaults.replica_config("_node", spec)
}

/// The file of a node's data directory that keeps its uuid and shared replica id, so that a
/// restart takes the id back (above its own reservation) instead of leaving one to retire.
pub(super) const NODE_ID_FILE: &str = "node-id.json";

/// Claims the node's shared id (see [`SharedId`]): the one its data directory names, if any.
pub(super) async fn claim_node_id(
    data_dir: Option<&Path>,
    transport: &Arc<dyn Transport>,
    template: &ReplicaConfig,
) -> Result<Arc<SharedId>, NodeError> {
    let path = data_dir.map(|d| d.join(NODE_ID_FILE));
    let known: Option<Identity> = match &path {
        Some(p) => match std::fs::read(p) {
            Ok(bytes) => Some(serde_json::from_slice(&bytes).map_err(|e| {
                NodeError::Failed(format!("{}: not a node identity: {e}", p.display()))
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        },
        None => None,
    };
    let uuid = known.map_or_else(uuid::Uuid::new_v4, |k| k.uuid);
    let id = SharedId::claim(
        transport,
        uuid,
        known.map(|k| k.replica),
        template.id_lease_block,
    )
    .await?;
    if let Some(dir) = data_dir {
        crate::replica::durable::create_dir_synced(&*crate::replica::disk::real(), dir)?;
        let json = serde_json::to_vec(&id.identity()).expect("an identity encodes");
        crate::replica::durable::write_atomically(dir, NODE_ID_FILE, &json)?;
    }
    tracing::info!(
        replica = id.identity().replica, uuid = %uuid, floor = id.floor(),
        "claimed the node's replica id for its catalog filters"
    );
    Ok(id)
}
