//! A microservice built of actix actors that embeds a filter replica: a sign-up service that
//! rejects user names already taken anywhere in the cluster, answering from its local replica
//! without a round trip, while the replica converges with its peers in the background.
//!
//! ```text
//! cargo run --release --example actix_service                       # in-process bus
//! cargo run --release --example actix_service -- nats://127.0.0.1:4222
//! ```

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use crpf::replica::{Replica, ReplicaConfig, ReplicaHandle};
use crpf::transport::{InProcessBus, NatsConfig, NatsTransport, Transport};
use crpf::wire::FilterKind;

/// The service's own actor: business logic around the replica handle.
struct SignupService {
    taken: ReplicaHandle,
}

impl Actor for SignupService {
    type Context = Context<Self>;
}

/// Sign up a user name; `Ok(false)` if it is (probably) taken.
#[derive(Message)]
#[rtype(result = "Result<bool, crpf::replica::ReplicaError>")]
struct SignUp(String);

impl Handler<SignUp> for SignupService {
    type Result = ResponseFuture<Result<bool, crpf::replica::ReplicaError>>;

    fn handle(&mut self, msg: SignUp, _: &mut Context<Self>) -> Self::Result {
        let taken = self.taken.clone();
        Box::pin(async move {
            // Reads are local and never wait behind replication work.
            if taken.contains(msg.0.as_bytes()) {
                return Ok(false);
            }
            taken.add(msg.0.into_bytes()).await?;
            Ok(true)
        })
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let transport: Arc<dyn Transport> = match std::env::args().nth(1) {
        Some(url) => Arc::new(NatsTransport::connect(NatsConfig::with_servers([url])).await?),
        None => Arc::new(InProcessBus::new()),
    };
    // Two instances of the service, as two processes would run them.
    let cfg = ReplicaConfig::for_kind("usernames", FilterKind::GBloom, 1_000_000, 0.001);
    let east = SignupService {
        taken: Replica::start(cfg.clone(), transport.clone()).await?,
    }
    .start();
    let west_replica = Replica::start(cfg, transport).await?;
    let west = SignupService {
        taken: west_replica.clone(),
    }
    .start();

    println!(
        "east signs up alice: {}",
        east.send(SignUp("alice".into())).await??
    );
    // Replication is asynchronous: west learns of alice within a delta interval.
    west_replica
        .wait_until(Duration::from_secs(10), |f| f.contains(b"alice"))
        .await;
    println!(
        "west signs up alice: {} (taken in the east)",
        west.send(SignUp("alice".into())).await??
    );
    println!(
        "west signs up bob:   {}",
        west.send(SignUp("bob".into())).await??
    );
    Ok(())
}
