//! The node as RESP's keyspace: the front end finds, creates, drops and expires the node's
//! filters through [`Keyspace`], a trait of its own, so that `resp` does not depend on `node`.

use super::{Expiry, HostError, Node};
use crate::replica::ReplicaHandle;
use crate::resp::{Keyspace, redisbloom};
use futures::future::BoxFuture;

impl Keyspace for Node {
    fn filter(&self, name: &str) -> Option<ReplicaHandle> {
        self.hosted_replica(name).filter(ReplicaHandle::serves_api)
    }

    fn query_parked(
        &self,
        name: &str,
        request: &crate::api::Request,
    ) -> Option<crate::resp::ParkedAnswer> {
        Node::query_parked(self, name, request)
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.filters().into_iter().map(|f| f.name).collect();
        names.sort();
        names
    }

    fn filter_count(&self) -> usize {
        Node::len(self)
    }

    fn spec(&self, name: &str) -> Option<crate::FilterSpec> {
        Node::spec(self, name)
    }

    fn create(
        &self,
        name: String,
        spec: crate::FilterSpec,
    ) -> BoxFuture<'static, Result<bool, String>> {
        let node = self.clone();
        Box::pin(async move {
            match node.create_filter(&name, spec).await {
                Ok(created) => Ok(created.new),
                // RedisBloom's answer for a key that exists, whatever it holds.
                Err(
                    HostError::Catalog(crate::transport::CatalogError::Exists { .. })
                    | HostError::Configured(_),
                ) => Err(redisbloom::EXISTS.into()),
                Err(e) => Err(format!("ERR {e}")),
            }
        })
    }

    fn drop_filter(&self, name: String) -> BoxFuture<'static, Result<bool, String>> {
        let node = self.clone();
        Box::pin(async move {
            match Node::drop_filter(&node, &name).await {
                Ok(dropped) => Ok(dropped.is_some()),
                Err(e) => Err(format!("ERR {e}")),
            }
        })
    }

    fn may_drop(&self, name: &str) -> Result<(), String> {
        Node::may_drop(self, name).map_err(|e| format!("ERR {e}"))
    }

    fn expiry(&self, name: &str) -> Option<Option<u64>> {
        Node::expiry(self, name)
    }

    fn set_expiry(
        &self,
        name: String,
        at_ms: Option<u64>,
    ) -> BoxFuture<'static, Result<bool, String>> {
        let node = self.clone();
        Box::pin(async move {
            match Node::set_expiry(&node, &name, at_ms).await {
                Ok(Expiry::Missing) => Ok(false),
                Ok(_) => Ok(true),
                Err(e) => Err(format!("ERR {e}")),
            }
        })
    }
}
