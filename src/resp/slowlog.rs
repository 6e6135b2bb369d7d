//! `SLOWLOG` and `MONITOR`: what tools send to see what a server does.
//!
//! `SLOWLOG` keeps the last [`SLOWLOG_LEN`] commands on keys and transactions (`DEL`,
//! `BF.RESERVE`, `EXPIRE`, `KEYS`, `EXEC`...: what goes through the catalog or runs one
//! command after the other) that took [`SLOWER_THAN`] or longer from their turn to their
//! reply, in Redis's entry form. Filter commands (`BF.ADD`...) are not timed one by one:
//! their hot path reads no clock per command.
//!
//! `MONITOR` streams every command this node's RESP front end parses, as Redis prints them
//! (`+<unix time> [0 <client address>] "arg" ...`); `AUTH` and `HELLO`'s arguments are shown
//! as `(redacted)`. Nothing is formatted while no connection monitors.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::broadcast;

use super::parse::Args;
use super::reply::Reply;

/// Entries kept (Redis's `slowlog-max-len` default).
pub(super) const SLOWLOG_LEN: usize = 128;

/// Commands this slow or slower are kept (Redis's `slowlog-log-slower-than` default).
pub(super) const SLOWER_THAN: Duration = Duration::from_millis(10);

/// Arguments kept per entry, and bytes per argument (as Redis).
const MAX_ARGS: usize = 32;
const MAX_ARG_BYTES: usize = 128;

/// Lines a monitoring connection may fall behind by; beyond, it skips the oldest.
const MONITOR_BACKLOG: usize = 4096;

struct Entry {
    id: u64,
    unix_s: i64,
    micros: i64,
    args: Vec<Bytes>,
    addr: String,
    name: Bytes,
}

/// The slow commands, the newest first, and the monitors' feed.
pub(super) struct Watch {
    entries: Mutex<VecDeque<Entry>>,
    next_id: AtomicU64,
    monitors: AtomicUsize,
    feed: broadcast::Sender<Bytes>,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            entries: Mutex::default(),
            next_id: AtomicU64::new(0),
            monitors: AtomicUsize::new(0),
            feed: broadcast::channel(MONITOR_BACKLOG).0,
        }
    }
}

/// A command's arguments as an entry keeps them: at most 32, each at most 128 bytes, with
/// Redis's notes of what was left out.
pub(super) fn summary(args: &Args) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(args.len().min(MAX_ARGS));
    for i in 0..args.len() {
        if i == MAX_ARGS - 1 && args.len() > MAX_ARGS {
            out.push(Bytes::from(format!(
                "... ({} more arguments)",
                args.len() - MAX_ARGS + 1
            )));
            break;
        }
        let a = args.arg(i);
        if a.len() > MAX_ARG_BYTES {
            let mut cut = a[..MAX_ARG_BYTES].to_vec();
            cut.extend_from_slice(
                format!("... ({} more bytes)", a.len() - MAX_ARG_BYTES).as_bytes(),
            );
            out.push(cut.into());
        } else {
            out.push(Bytes::copy_from_slice(a));
        }
    }
    out
}

fn now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

impl Watch {
    /// Keeps a command that took `took`, if that is slow.
    pub(super) fn took(&self, took: Duration, args: Vec<Bytes>, addr: SocketAddr, name: Bytes) {
        if took < SLOWER_THAN {
            return;
        }
        let entry = Entry {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            unix_s: now().as_secs() as i64,
            micros: took.as_micros().min(i64::MAX as u128) as i64,
            args,
            addr: addr.to_string(),
            name,
        };
        let mut entries = self.entries.lock().expect("slowlog lock");
        entries.push_front(entry);
        entries.truncate(SLOWLOG_LEN);
    }

    /// `SLOWLOG GET [count]` (`-1`: all), `LEN`, `RESET`.
    pub(super) fn get(&self, count: i64) -> Reply {
        let entries = self.entries.lock().expect("slowlog lock");
        let n = usize::try_from(count).unwrap_or(usize::MAX);
        let bulk = |b: &Bytes| Reply::Bulk(b.clone());
        Reply::Array(
            entries
                .iter()
                .take(n)
                .map(|e| {
                    Reply::Array(vec![
                        Reply::Int(e.id as i64),
                        Reply::Int(e.unix_s),
                        Reply::Int(e.micros),
                        Reply::Array(e.args.iter().map(bulk).collect()),
                        Reply::Bulk(Bytes::copy_from_slice(e.addr.as_bytes())),
                        Reply::Bulk(e.name.clone()),
                    ])
                })
                .collect(),
        )
    }

    pub(super) fn len(&self) -> usize {
        self.entries.lock().expect("slowlog lock").len()
    }

    pub(super) fn reset(&self) {
        self.entries.lock().expect("slowlog lock").clear();
    }

    /// Whether a connection monitors (one load per command).
    pub(super) fn monitored(&self) -> bool {
        self.monitors.load(Ordering::Relaxed) > 0
    }

    /// A new monitor: its feed, and what ends it when dropped.
    pub(super) fn monitor(&self) -> Monitor<'_> {
        self.monitors.fetch_add(1, Ordering::Relaxed);
        Monitor {
            watch: self,
            feed: self.feed.subscribe(),
        }
    }

    /// Sends `args`, served for the client at `addr`, to the monitors.
    pub(super) fn feed(&self, args: &Args, addr: SocketAddr) {
        let t = now();
        let mut line = format!("+{}.{:06} [0 {addr}]", t.as_secs(), t.subsec_micros()).into_bytes();
        let redacted = {
            let name = args.arg(0);
            name.eq_ignore_ascii_case(b"AUTH") || name.eq_ignore_ascii_case(b"HELLO")
        };
        for i in 0..args.len() {
            line.push(b' ');
            if redacted && i > 0 {
                line.extend_from_slice(b"\"(redacted)\"");
            } else {
                quote(&mut line, args.arg(i));
            }
        }
        line.extend_from_slice(b"\r\n");
        let _ = self.feed.send(line.into());
    }
}

/// A connection that monitors.
pub(super) struct Monitor<'a> {
    watch: &'a Watch,
    feed: broadcast::Receiver<Bytes>,
}

impl Monitor<'_> {
    /// The next line (lines it fell behind by are skipped).
    pub(super) async fn next(&mut self) -> Option<Bytes> {
        loop {
            match self.feed.recv().await {
                Ok(line) => return Some(line),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl Drop for Monitor<'_> {
    fn drop(&mut self) {
        self.watch.monitors.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Redis's quoting of an argument (`sdscatrepr`).
fn quote(out: &mut Vec<u8>, arg: &[u8]) {
    out.push(b'"');
    for &b in arg {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            7 => out.extend_from_slice(b"\\a"),
            8 => out.extend_from_slice(b"\\b"),
            b if b.is_ascii_graphic() || b == b' ' => out.push(b),
            b => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_quoted_as_redis_does() {
        let mut out = Vec::new();
        quote(&mut out, b"a \"b\"\\\n\x00\xff");
        assert_eq!(out, b"\"a \\\"b\\\"\\\\\\n\\x00\\xff\"");
    }

    #[test]
    fn only_slow_commands_are_kept_newest_first_up_to_the_limit() {
        let w = Watch::default();
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        w.took(
            Duration::from_millis(1),
            vec![Bytes::from("fast")],
            addr,
            Bytes::new(),
        );
        assert_eq!(w.len(), 0);
        for i in 0..SLOWLOG_LEN + 2 {
            w.took(
                SLOWER_THAN,
                vec![Bytes::from(i.to_string())],
                addr,
                Bytes::new(),
            );
        }
        assert_eq!(w.len(), SLOWLOG_LEN);
        let Reply::Array(got) = w.get(1) else {
            panic!()
        };
        let Reply::Array(e) = &got[0] else { panic!() };
        assert_eq!(e[0], Reply::Int(SLOWLOG_LEN as i64 + 1));
        w.reset();
        assert_eq!(w.len(), 0);
    }
}
