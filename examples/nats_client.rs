//! A client that speaks only NATS: no crpf types, just requests on the subjects of DESIGN.md
//! section 5 with raw item bytes, and JSON replies. Any NATS client in any language does the
//! same. Start a node first (`crpf node --config configs/node.toml` with a NATS server), then:
//!
//! ```text
//! cargo run --release --example nats_client -- nats://127.0.0.1:4222 sessions
//! ```

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let filter = args.next().unwrap_or_else(|| "sessions".into());
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(5)))
        .connect(&url)
        .await?;
    let ask = |op: &'static str, item: &'static [u8]| {
        let (client, subject) = (client.clone(), format!("crpf.{filter}.api.{op}"));
        async move {
            let reply = client.request(subject.clone(), item.into()).await?;
            println!(
                "{subject} {:?} -> {}",
                String::from_utf8_lossy(item),
                String::from_utf8_lossy(&reply.payload)
            );
            Ok::<_, async_nats::RequestError>(())
        }
    };
    ask("add", b"session-42").await?;
    ask("contains", b"session-42").await?;
    ask("contains", b"session-43").await?;
    ask("remove", b"session-42").await?;
    ask("contains", b"session-42").await?;
    ask("add", b"").await?; // an empty item gets a JSON error reply
    ask("stats", b"").await?;
    Ok(())
}
