//! A client of a running node through `crpf::client` (typed requests over async-nats). The
//! protocol underneath is plain NATS (README, "Subjects"): any client in any language can do the
//! same with raw item bytes, the batch framing and JSON replies. Start a node first
//! (`crpf node --config configs/node.toml` with a NATS server), then:
//!
//! ```text
//! cargo run --release --example nats_client -- nats://127.0.0.1:4222 sessions
//! ```

use std::time::Duration;

use crpf::client::{Client, ClientError};
use crpf::replica::AckLevel;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let filter = args.next().unwrap_or_else(|| "sessions".into());
    let nats = async_nats::connect(&url).await?;
    let client = Client::new(nats, "crpf", &filter).with_timeout(Duration::from_secs(5));

    client.add("session-42", None).await?;
    println!(
        "contains session-42: {}",
        client.contains("session-42").await?
    );
    println!(
        "contains session-43: {}",
        client.contains("session-43").await?
    );

    // A batch: one request, one commit, one acknowledgement (here: fsynced, if the node has a
    // data directory; else the replica says the level is unavailable).
    let batch: Vec<String> = (0..1000).map(|i| format!("session-{i}")).collect();
    match client.madd(&batch, Some(AckLevel::Durable)).await {
        Ok(r) => println!("madd: {} of {} added", r.count(), batch.len()),
        Err(ClientError::Server { message, .. }) => {
            println!("madd durable refused ({message}); again at the default level");
            let r = client.madd(&batch, None).await?;
            println!("madd: {} of {} added", r.count(), batch.len());
        }
        Err(e) => return Err(e.into()),
    }
    let found = client
        .mcontains(["session-7", "session-999", "nobody"])
        .await?;
    println!("mcontains session-7, session-999, nobody: {found:?}");

    // Remove works on the OR kinds only; other kinds answer with an error.
    match client.remove("session-42", None).await {
        Ok(removed) => println!("removed session-42: {removed}"),
        Err(e) => println!("remove: {e}"),
    }
    // An empty item gets an error reply.
    if let Err(e) = client.add("", None).await {
        println!("add of an empty item: {e}");
    }

    // Any replica, then the one that answered, addressed alone.
    let stats = client.stats().await?;
    println!(
        "replica {} of `{}`: {} items, digest {}, {} peers",
        stats.replica, stats.filter, stats.figures.cardinality, stats.digest, stats.peers
    );
    let same = client.replica(stats.replica).stats().await?;
    assert_eq!(same.uuid, stats.uuid);
    Ok(())
}
