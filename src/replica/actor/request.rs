//! The request API of a replica (README, "Subjects"): single operations with the raw item as
//! payload, batch operations with the framing of [`crate::api::batch`], stats. Queries, and
//! adds at `local` to grow-only kinds, are answered in the subscription tasks
//! ([`super::reads`], [`super::updates`]); other requests reach the actor through its inbound
//! buffer like replication messages, and their replies leave through the publisher task. Every
//! reply carries the header [`REPLICA_HEADER`] naming this replica. The replica also
//! answers the NATS service API for it ([`crate::replica::service`]), which counts what
//! [`Replica::on_api`] answers.

use std::sync::Arc;

use actix::prelude::*;

use super::Replica;
use super::pump::{API_LINGER, Outbound, Route, forward_stream};
use super::reads::{Reads, query};
use super::reply::{ApiReply, ReplyTo, Responder};
use super::updates::{Applied, Lock};
use crate::api::{Request, Response};
use crate::replica::ReplicaError;
use crate::replica::ack::AckLevel;
use crate::replica::core::{self, ImportPath};
use crate::replica::metrics::{Channel, Direction, MergeSource};
use crate::replica::service::ApiService;
use crate::transport::{Message, MessageStream, confirm_subscriptions, subscribe_now};

/// What a request came to, when it did not fail outright.
enum Handled {
    /// A query: answered at once.
    Answer(Response),
    /// An applied update: answered once it reached `level` (see [`Replica::settle`]).
    Settle {
        level: AckLevel,
        changed: bool,
        response: Response,
    },
    /// An import at `logged` or `durable`: answered once a snapshot holding it is saved (the
    /// log holds no merges).
    AfterSnapshot(Response),
}

impl Replica {
    /// Serves the request API, then publishes readiness (`why` says what made the replica
    /// ready): a client that waits for ready, or a probe of `crpf_ready`, must find the API's
    /// subscriptions in place, not "no responders".
    pub(super) fn start_api(&mut self, ctx: &mut Context<Self>, why: String) {
        // First, so that whatever answers requests can count them on its endpoints; it is
        // announced ($SRV) after the API's subscriptions.
        let service = self.new_service();
        // `<...>.api` and `<...>.api.>` (one NATS pattern cannot cover both) in the queue
        // group, so that one ready replica answers; and the same two under
        // `<...>.replica.<id>`, without a group, for requests to this replica alone. Every
        // request on an API subject gets a reply, an error one without a known operation.
        // A catalog filter's node routes the subject without an operation, and its own ones
        // if the replica replicates under the node's id (its subscriptions cover every such
        // filter of the node).
        // And, with `routed_api`, the operations in the queue group (one subscription of the
        // node covers every catalog filter's).
        let by_node = self.cfg.catalog_hosted;
        let own_by_node = by_node && self.core.lease.shared.is_some();
        let queue = self.io.subjects.api_queue.clone();
        let shared_subjects = self
            .io
            .subjects
            .api_subscriptions()
            .into_iter()
            .filter(|s| !(by_node && *s == self.io.subjects.api_root))
            .filter(|s| !(self.cfg.routed_api && *s == self.io.subjects.api))
            .map(|s| (s.to_string(), Some(queue.clone())));
        let own = self
            .io
            .subjects
            .replica_api_subscriptions(self.id())
            .into_iter()
            .filter(|_| !own_by_node)
            .map(|s| (s, None));
        let subscriptions: Vec<_> = shared_subjects.into_iter().chain(own).collect();
        // Queries (and some updates, see `updates`) are answered in the subscription tasks;
        // the rest go to the actor.
        let reads = self.answer_api(&service);
        let service_subjects = match self.cfg.catalog_hosted {
            true => Vec::new(),
            false => service.subscriptions().to_vec(),
        };
        if subscriptions.is_empty() && service_subjects.is_empty() {
            // A catalog filter whose node takes every subject for it: nothing of its own to
            // subscribe or confirm (a task of the actor and a round trip to the server per
            // replica, 100,000 of them as a node starts).
            self.serve_service(service, Vec::new());
            self.publish_ready(&why);
            return;
        }
        let transport = self.io.transport.clone();
        let subscribing = async move {
            let mut api = Vec::with_capacity(subscriptions.len());
            for (subject, queue) in subscriptions {
                let stream = subscribe_now(&transport, &subject, queue.clone()).await;
                api.push((stream, subject, queue));
            }
            let mut srv = Vec::with_capacity(service_subjects.len());
            for subject in service_subjects {
                srv.push((subscribe_now(&transport, &subject, None).await, subject));
            }
            (api, srv)
        };
        ctx.spawn(subscribing.into_actor(self).map(move |(api, srv), act, ctx| {
            // The subscription tasks run on the runtime's workers (`tokio::spawn`), where the
            // NATS connection's task runs, not on the actors' thread: a query is then
            // answered without a wake-up of another thread on its way in (node CPU per
            // `contains` at 16 in flight went from about 8 to 5 µs, CHANGELOG.md's benchmark
            // history). They start before the round trip below, so that requests the server
            // already sends here are answered at once.
            // Not among the tasks aborted at stop: they end when the actor's queue closes,
            // after lingering a moment if the filter was dropped (`API_LINGER`).
            let mut api = api;
            if let Some(give) = act.group_api.take() {
                // The queue group's go to the node, which serves them beyond this actor.
                let (group, own): (Vec<_>, Vec<_>) = api.into_iter().partition(|a| a.2.is_some());
                give(group
                    .into_iter()
                    .map(|(stream, subject, queue)| (stream, subject, queue.unwrap_or_default()))
                    .collect());
                api = own;
            }
            for (stream, subject, queue) in api {
                let reads = reads.clone();
                tokio::spawn(forward_stream(
                    stream,
                    act.io.transport.clone(),
                    (subject, queue),
                    act.chans.inbound_tx.clone(),
                    move |m| reads.route(m),
                    act.shared.clone(),
                    Some(API_LINGER),
                ));
            }
            act.serve_service(service, srv);
            // The server has processed the subscriptions once it answers a request sent after
            // them. Disconnected, nobody could reach the API anyway: ready is not held back.
            let transport = act.io.transport.clone();
            let confirming = async move {
                if let Err(e) = confirm_subscriptions(&transport).await {
                    tracing::warn!(error = %e, "the API's subscriptions were not confirmed");
                }
            };
            ctx.spawn(
                confirming
                    .into_actor(act)
                    .map(move |(), act, _ctx| act.publish_ready(&why)),
            );
        }));
    }

    /// Answers the request API from now on, as `service`: what its node's routes and the
    /// handles find.
    fn answer_api(&self, service: &Arc<ApiService>) -> Arc<Reads> {
        let reads = Arc::new(Reads {
            shared: self.shared.clone(),
            subjects: self.io.subjects.clone(),
            service: service.clone(),
            replica: self.id(),
            updates: self.updates.clone(),
        });
        self.shared.api.store(Some(reads.clone()));
        reads
    }

    /// Makes a replica resuming after parking ready, and serves its request API, before its
    /// actor runs: it was ready, its node routes every subject of its API (nothing to
    /// subscribe), and the request that resumed it is answered at once, not refused as not
    /// serving yet. The actor announces readiness as it starts (`crpf_ready`, the log).
    pub(crate) fn prepare_resumed(&mut self) {
        if self.cfg.serve_api {
            // Its queue group's too: the node's (`routed_api`), or its own that the node took
            // over as it first started (a configured filter's, `GroupApi`).
            debug_assert!(self.cfg.catalog_hosted && self.core.lease.shared.is_some());
            self.core.api_started = true;
            let service = self.new_service();
            self.answer_api(&service);
        }
        self.shared.lifecycle.set_ready();
    }

    /// The NATS service API's instance of this replica.
    fn new_service(&mut self) -> Arc<ApiService> {
        let service = Arc::new(ApiService::new(
            &self.io.subjects,
            &self.cfg.prefix,
            &self.cfg.name,
            self.io.expect.kind,
            self.id(),
            self.uuid(),
        ));
        self.service = Some(service.clone());
        service
    }

    /// Serves the NATS service API on `subscriptions` (a stream each, or `None` to subscribe
    /// in its task): its requests are answered in their subscription tasks, from the
    /// service's own figures, without the actor.
    fn serve_service(
        &mut self,
        service: Arc<ApiService>,
        subscriptions: Vec<(Option<MessageStream>, String)>,
    ) {
        tracing::info!(
            filter = %self.cfg.name,
            replica = self.id(),
            service = service.name(),
            id = service.id(),
            "serving the NATS service API ($SRV)"
        );
        for (stream, subject) in subscriptions {
            let service = service.clone();
            // Answered in the subscription task, like a query; nothing reaches the actor.
            let route = move |msg: Message| match (msg.reply, service.answer(&msg.subject)) {
                (Some(to), Some(answer)) => Route::Reply(to, async_nats::HeaderMap::new(), answer),
                _ => Route::Drop,
            };
            self.tasks.push(tokio::spawn(forward_stream(
                stream,
                self.io.transport.clone(),
                (subject, None),
                self.chans.inbound_tx.clone(),
                route,
                self.shared.clone(),
                None,
            )));
        }
    }

    pub(super) fn on_api(&mut self, request: Request, reply: ReplyTo, ctx: &mut Context<Self>) {
        // Traffic is what came over NATS: a call made in this process (RESP's) is none.
        if matches!(reply, ReplyTo::Nats { .. }) {
            self.telemetry
                .traffic(Direction::In, Channel::Api, request.payload_len());
        }
        match self.api_request(request) {
            Ok(Handled::Answer(response)) => self.send_reply(reply, Ok(response)),
            Ok(Handled::Settle {
                level,
                changed,
                response,
            }) => self.settle(level, changed, Responder::Api { reply, response }, ctx),
            Ok(Handled::AfterSnapshot(response)) => {
                self.answer_after_snapshot(reply, response, ctx)
            }
            Err(e) => self.send_reply(reply, Err(e)),
        }
    }

    /// Answers once a snapshot taken now (holding what was merged) is saved, or with its
    /// error.
    fn answer_after_snapshot(
        &mut self,
        reply: ReplyTo,
        response: Response,
        ctx: &mut Context<Self>,
    ) {
        let Some(data) = self.core.snapshots.data().cloned() else {
            return self.send_reply(reply, Ok(response));
        };
        ctx.spawn(self.snapshot_off_thread(data).map(move |r, act, _| {
            let saved = act.snapshot_saved_now(r);
            act.send_reply(reply, saved.map(|()| response));
        }));
    }

    fn api_request(&mut self, request: Request) -> Result<Handled, ReplicaError> {
        let op = request.op();
        Ok(match request {
            _ if op.is_update() => {
                let updates = self.updates.clone();
                let level = updates.level(request.ack())?;
                let mut reserve = || {
                    self.reserve_tags()?;
                    Ok(self.tag_limit())
                };
                let Applied {
                    level,
                    changed,
                    response,
                    ..
                } = updates
                    .apply(&request, level, Lock::Wait, &mut reserve, false)?
                    .expect("the actor waits for the lock");
                if changed {
                    self.local_change();
                }
                Handled::Settle {
                    level,
                    changed,
                    response,
                }
            }
            // Queries are answered in the subscription tasks; the same answer here.
            _ if op.is_query() => Handled::Answer(query(&self.shared, &request)?),
            Request::Stats => {
                let stats = serde_json::to_value(self.stats()).expect("stats serialize");
                Handled::Answer(Response::Stats(stats))
            }
            Request::Export { format } => Handled::Answer(Response::Exported(
                crate::replica::interop::export(&self.read(), format)?,
            )),
            Request::Import {
                format,
                filter,
                ack,
            } => {
                // Refused before anything is merged if the replica cannot give it.
                let level = core::import_level(ack, self.updates.level(None)?);
                self.updates.check_level(level)?;
                match core::import_path(level) {
                    ImportPath::Merge => {
                        self.import_filter(format, &filter)?;
                        Handled::Answer(Response::Imported)
                    }
                    // A merge is on disk only with a snapshot
                    // ([`crate::replica::core::UnloggedMerges`]); `logged` too: the log does
                    // not hold an import, a saved snapshot does.
                    ImportPath::MergeThenSnapshot => {
                        self.import_filter(format, &filter)?;
                        Handled::AfterSnapshot(Response::Imported)
                    }
                    ImportPath::AsDelta => {
                        let changed = self.import_as_delta(format, &filter)?;
                        Handled::Settle {
                            level,
                            changed,
                            response: Response::Imported,
                        }
                    }
                }
            }
            _ => unreachable!("every operation is handled above"),
        })
    }

    /// `import` (issue 51, [`crate::replica::interop`]): merges as a full state from
    /// elsewhere does ([`crate::replica::ReplicaHandle::merge`]).
    fn import_filter(&mut self, format: crate::GoFormat, bytes: &[u8]) -> Result<(), ReplicaError> {
        use crate::replica::interop;
        let (_, state) = interop::decode(format, bytes)?;
        interop::check_fits(&self.read(), &state)?;
        let t = std::time::Instant::now();
        let merged = self.write_to_merge().merge(&state);
        self.record_merge(MergeSource::Local, t, merged.is_ok());
        merged?;
        self.local_change();
        Ok(())
    }

    /// `import` at `replicated` (`crate::replica::core::import`): merged as a local update,
    /// the bits it sets joining the pending delta that the commit logs and publishes for
    /// peers to confirm. Refused, nothing merged, if that delta is over the size one message
    /// carries beside its commit's other updates. Whether it recorded anything (an import
    /// that sets no bit is answered at once, as such an add is).
    fn import_as_delta(
        &mut self,
        format: crate::GoFormat,
        bytes: &[u8],
    ) -> Result<bool, ReplicaError> {
        use crate::replica::interop;
        let (_, state) = interop::decode(format, bytes)?;
        let max_payload = self.io.transport.max_payload();
        let t = std::time::Instant::now();
        let mut f = self.write();
        // While merged bits are on no saved snapshot, the log must hold the import's whole
        // footprint, as an add's: a bit a peer's delta set would be lost at a crash.
        let whole = self.shared.unlogged.footprints();
        let (delta, delta_bytes) = interop::import_delta(&f, &state, whole)?;
        core::admit_replicated_import(delta_bytes, max_payload)?;
        let applied = interop::apply_import_delta(&mut f, &delta);
        drop(f);
        self.record_merge(MergeSource::Local, t, applied.is_ok());
        applied?;
        let changed = !delta.bits.is_empty();
        if changed {
            self.local_change();
        }
        Ok(changed)
    }

    /// Sends the answer `result` where `reply` says: an error counted.
    pub(super) fn send_reply(&mut self, reply: ReplyTo, result: Result<Response, ReplicaError>) {
        if let Err(e) = &result {
            self.api_error(e);
        }
        match reply {
            ReplyTo::Nats {
                subject,
                format,
                served,
            } => {
                let body = ApiReply::of_result(result, format);
                if let Some((to, headers, payload)) = body.finish(self.id(), served, subject) {
                    self.telemetry
                        .traffic(Direction::Out, Channel::Api, payload.len());
                    self.enqueue(Outbound::Reply(Box::new((to, payload, headers))));
                }
            }
            // The caller may have given up waiting: nothing to do then.
            ReplyTo::InProcess(tx) => {
                let _ = tx.send(result);
            }
        }
    }

    /// Counts a request API error by reason (apart from replication rejects).
    fn api_error(&self, e: &ReplicaError) {
        self.count_api_errors(e.reason(), 1);
    }

    fn count_api_errors(&self, reason: &'static str, n: u64) {
        self.telemetry.api_errors(reason, n);
    }
}
