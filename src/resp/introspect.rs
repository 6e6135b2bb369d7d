//! What the front end says about itself: `COMMAND` (the commands it serves, in Redis's
//! command-info form, which cluster-aware clients and `redis-cli` read) and `INFO`.

use bytes::Bytes;

use super::parse::Args;
use super::reply::Reply;

/// One command: its name, Redis arity (negative: at least that many arguments, the name
/// counted), flags, and where its keys are (first, last, step; 0 0 0 for none).
struct Spec {
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
}

const fn spec(
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
) -> Spec {
    Spec {
        name,
        arity,
        flags,
        keys,
    }
}

const WRITE: &[&str] = &["write", "denyoom"];
const READ: &[&str] = &["readonly", "fast"];
const ADMIN: &[&str] = &["fast"];
const NONE: (i64, i64, i64) = (0, 0, 0);
const KEY: (i64, i64, i64) = (1, 1, 1);
const ALL_KEYS: (i64, i64, i64) = (1, -1, 1);

/// Every command served: what `COMMAND`, `COMMAND COUNT`, `COMMAND INFO` and `COMMAND LIST`
/// answer from.
const COMMANDS: &[Spec] = &[
    spec("ping", -1, ADMIN, NONE),
    spec("echo", 2, ADMIN, NONE),
    spec("quit", -1, ADMIN, NONE),
    spec("auth", -2, ADMIN, NONE),
    spec("hello", -1, ADMIN, NONE),
    spec("client", -2, ADMIN, NONE),
    spec("command", -1, ADMIN, NONE),
    spec("config", -2, ADMIN, NONE),
    spec("info", -1, ADMIN, NONE),
    spec("memory", -2, READ, (2, 2, 1)),
    spec("select", 2, ADMIN, NONE),
    spec("multi", 1, ADMIN, NONE),
    spec("exec", 1, ADMIN, NONE),
    spec("discard", 1, ADMIN, NONE),
    spec("watch", -2, ADMIN, ALL_KEYS),
    spec("unwatch", 1, ADMIN, NONE),
    spec("bf.reserve", -4, WRITE, KEY),
    spec("bf.add", 3, WRITE, KEY),
    spec("bf.madd", -3, WRITE, KEY),
    spec("bf.insert", -4, WRITE, KEY),
    spec("bf.exists", 3, READ, KEY),
    spec("bf.mexists", -3, READ, KEY),
    spec("bf.card", 2, READ, KEY),
    spec("bf.info", -2, READ, KEY),
    spec("bf.debug", 2, READ, KEY),
    spec("bf.scandump", 3, READ, KEY),
    spec("bf.loadchunk", 4, WRITE, KEY),
    spec("cf.scandump", 3, READ, KEY),
    spec("cf.loadchunk", 4, WRITE, KEY),
    spec("cf.reserve", -3, WRITE, KEY),
    spec("cf.add", 3, WRITE, KEY),
    spec("cf.addnx", 3, WRITE, KEY),
    spec("cf.insert", -4, WRITE, KEY),
    spec("cf.insertnx", -4, WRITE, KEY),
    spec("cf.exists", 3, READ, KEY),
    spec("cf.mexists", -3, READ, KEY),
    spec("cf.del", 3, WRITE, KEY),
    spec("cf.count", 3, READ, KEY),
    spec("cf.info", 2, READ, KEY),
    spec("cf.compact", 2, WRITE, KEY),
    spec("crpf.reserve", -5, WRITE, KEY),
    spec("crpf.mdel", -3, WRITE, KEY),
    spec("crpf.stats", 2, READ, KEY),
    spec("crpf.ack", 2, ADMIN, NONE),
    spec("del", -2, &["write"], ALL_KEYS),
    spec("unlink", -2, &["write", "fast"], ALL_KEYS),
    spec("exists", -2, READ, ALL_KEYS),
    spec("type", 2, READ, KEY),
    spec("dbsize", 1, READ, NONE),
    spec("keys", 2, &["readonly"], NONE),
    spec("scan", -2, &["readonly"], NONE),
    spec("flushdb", -1, &["write"], NONE),
    spec("flushall", -1, &["write"], NONE),
    spec("randomkey", 1, &["readonly"], NONE),
    spec("expire", -3, &["write", "fast"], KEY),
    spec("pexpire", -3, &["write", "fast"], KEY),
    spec("expireat", -3, &["write", "fast"], KEY),
    spec("pexpireat", -3, &["write", "fast"], KEY),
    spec("persist", 2, &["write", "fast"], KEY),
    spec("ttl", 2, READ, KEY),
    spec("pttl", 2, READ, KEY),
    spec("expiretime", 2, READ, KEY),
    spec("pexpiretime", 2, READ, KEY),
    spec("role", 1, ADMIN, NONE),
    spec("time", 1, ADMIN, NONE),
    spec("module", -2, ADMIN, NONE),
    spec("monitor", 1, &["admin"], NONE),
    spec("slowlog", -2, &["admin"], NONE),
];

fn text(s: &str) -> Reply {
    Reply::Bulk(Bytes::copy_from_slice(s.as_bytes()))
}

/// Redis 7's command-info entry: name, arity, flags, first key, last key, step, ACL
/// categories, tips, key specs, subcommands (the last four empty).
fn info(spec: &Spec) -> Reply {
    Reply::Array(vec![
        text(spec.name),
        Reply::Int(spec.arity),
        Reply::Array(spec.flags.iter().map(|f| Reply::Simple(f)).collect()),
        Reply::Int(spec.keys.0),
        Reply::Int(spec.keys.1),
        Reply::Int(spec.keys.2),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
    ])
}

fn find(name: &[u8]) -> Option<&'static Spec> {
    COMMANDS
        .iter()
        .find(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
}

/// `COMMAND [COUNT | INFO name... | LIST | DOCS [name...]]`.
pub(super) fn command(args: &Args) -> Reply {
    let n = args.len() - 1;
    if n == 0 {
        return Reply::Array(COMMANDS.iter().map(info).collect());
    }
    let sub = args.arg(1).to_ascii_uppercase();
    match sub.as_slice() {
        b"COUNT" if n == 1 => Reply::Int(COMMANDS.len() as i64),
        b"LIST" if n == 1 => Reply::Array(COMMANDS.iter().map(|c| text(c.name)).collect()),
        b"INFO" if n == 1 => Reply::Array(COMMANDS.iter().map(info).collect()),
        b"INFO" => Reply::Array(
            args.from(2)
                .map(|name| find(name).map_or(Reply::Null, info))
                .collect(),
        ),
        // RedisBloom's entries for its commands (and crpf's own, alike): the group and the
        // module. Redis documents its own commands at length; clients take a map without
        // them, and a name without docs is left out, as Redis does with unknown ones.
        b"DOCS" => {
            let documented = |c: &&Spec| c.name.starts_with("bf.") || c.name.starts_with("cf.");
            let doc = |c: &Spec| {
                (
                    text(c.name),
                    Reply::Map(vec![
                        (text("group"), text("module")),
                        (text("module"), text("bf")),
                    ]),
                )
            };
            if n == 1 {
                Reply::Map(COMMANDS.iter().filter(documented).map(doc).collect())
            } else {
                Reply::Map(
                    args.from(2)
                        .filter_map(find)
                        .filter(|c| documented(c))
                        .map(doc)
                        .collect(),
                )
            }
        }
        b"COUNT" | b"LIST" => Reply::err(format!(
            "wrong number of arguments for 'command|{}' command",
            String::from_utf8_lossy(&sub).to_ascii_lowercase()
        )),
        _ => Reply::err(format!(
            "unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(&sub[..sub.len().min(64)])
        )),
    }
}

/// What `INFO` reports of the front end and its node.
pub(super) struct Facts {
    /// The address served.
    pub(super) port: u16,
    /// When the front end started.
    pub(super) started: std::time::Instant,
    /// Open connections.
    pub(super) clients: usize,
    /// `max_connections`.
    pub(super) max_clients: usize,
    /// Filters (keys).
    pub(super) keys: usize,
    /// Connections accepted since the start (`total_connections_received`).
    pub(super) connections_received: u64,
    /// Commands parsed since the start (`total_commands_processed`).
    pub(super) commands_processed: u64,
    /// Connections refused at `max_connections` (`rejected_connections`).
    pub(super) rejected_connections: u64,
    /// The node is still starting: commands on keys answer `-LOADING`.
    pub(super) loading: bool,
}

/// RedisBloom's module version (2.8.2), which clients compare against to tell which
/// commands and options the server has.
pub(super) const BF_MODULE_VERSION: i64 = 20802;

/// The `bf` module as `MODULE LIST` and `HELLO` name it: clients ask whether RedisBloom is
/// loaded. (crpf implements its commands itself; there is no module file.)
pub(super) fn bf_module() -> Reply {
    let text = |s: &str| Reply::Bulk(Bytes::copy_from_slice(s.as_bytes()));
    Reply::Map(vec![
        (text("name"), text("bf")),
        (text("ver"), Reply::Int(BF_MODULE_VERSION)),
        (text("path"), text("crpf (built in)")),
        (text("args"), Reply::Array(Vec::new())),
    ])
}

/// `CLIENT HELP`.
pub(super) fn client_help() -> Reply {
    const LINES: [&str; 13] = [
        "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "GETNAME",
        "    Return the name of the current connection.",
        "ID",
        "    Return the ID of the current connection.",
        "INFO",
        "    Return information about the current client connection.",
        "KILL <ip:port> | KILL <option> <value> [<option> <value> [...]]",
        "    Kill connections: options ID <id>, ADDR <ip:port>, LADDR <ip:port>, SKIPME (YES|NO).",
        "LIST [ID <id> [<id> ...]]",
        "    Return information about client connections.",
        "SETNAME <name>",
        "    Assign the name <name> to the current connection.",
    ];
    Reply::Array(
        LINES
            .iter()
            .map(|l| Reply::Bulk(Bytes::copy_from_slice(l.as_bytes())))
            .collect(),
    )
}

/// The process's resident memory, from `/proc/self/statm` (0 where there is none).
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .unwrap_or(0);
    pages * 4096
}

/// `INFO [section...]`: the sections `server`, `clients`, `memory`, `persistence`, `stats`,
/// `replication`, `cluster`, `keyspace` and `modules` (all of them without an argument or with
/// `all`, `default` or `everything`), in Redis's `field:value` text. Only fields whose value
/// is true of crpf: crpf keeps no RDB or AOF file, replicates over NATS rather than as a
/// Redis replica, and is no Redis cluster.
pub(super) fn info_text(sections: &[String], facts: &Facts) -> Reply {
    const KNOWN: [&str; 9] = [
        "server",
        "clients",
        "memory",
        "persistence",
        "stats",
        "replication",
        "cluster",
        "keyspace",
        "modules",
    ];
    let all = sections.is_empty()
        || sections
            .iter()
            .any(|s| matches!(s.as_str(), "all" | "default" | "everything"));
    let wanted = |section: &str| all || sections.iter().any(|s| s == section);
    let mut out = String::new();
    for section in KNOWN.into_iter().filter(|s| wanted(s)) {
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        match section {
            "server" => {
                out.push_str("# Server\r\n");
                out.push_str("redis_version:7.2.0\r\n");
                out.push_str(&format!("crpf_version:{}\r\n", env!("CARGO_PKG_VERSION")));
                out.push_str("redis_mode:standalone\r\n");
                out.push_str(&format!("os:{}\r\n", std::env::consts::OS));
                out.push_str("arch_bits:64\r\n");
                out.push_str(&format!("process_id:{}\r\n", std::process::id()));
                out.push_str(&format!("tcp_port:{}\r\n", facts.port));
                out.push_str(&format!(
                    "uptime_in_seconds:{}\r\n",
                    facts.started.elapsed().as_secs()
                ));
            }
            "clients" => {
                out.push_str("# Clients\r\n");
                out.push_str(&format!("connected_clients:{}\r\n", facts.clients));
                out.push_str(&format!("maxclients:{}\r\n", facts.max_clients));
                // No command blocks a connection.
                out.push_str("blocked_clients:0\r\n");
            }
            "persistence" => {
                out.push_str("# Persistence\r\n");
                out.push_str(&format!("loading:{}\r\n", u8::from(facts.loading)));
                // Durability is each filter's write-ahead log and snapshots (`ack`).
                out.push_str("rdb_bgsave_in_progress:0\r\n");
                out.push_str("aof_enabled:0\r\n");
                out.push_str("aof_rewrite_in_progress:0\r\n");
            }
            "stats" => {
                out.push_str("# Stats\r\n");
                out.push_str(&format!(
                    "total_connections_received:{}\r\n",
                    facts.connections_received
                ));
                out.push_str(&format!(
                    "total_commands_processed:{}\r\n",
                    facts.commands_processed
                ));
                out.push_str(&format!(
                    "rejected_connections:{}\r\n",
                    facts.rejected_connections
                ));
                // No key expires or is evicted.
                out.push_str("expired_keys:0\r\n");
                out.push_str("evicted_keys:0\r\n");
            }
            "replication" => {
                out.push_str("# Replication\r\n");
                // Filters replicate among nodes over NATS, each node a writable peer.
                out.push_str("role:master\r\n");
                out.push_str("connected_slaves:0\r\n");
            }
            "cluster" => {
                out.push_str("# Cluster\r\n");
                out.push_str("cluster_enabled:0\r\n");
            }
            "memory" => {
                let rss = resident_bytes();
                out.push_str("# Memory\r\n");
                out.push_str(&format!("used_memory:{rss}\r\n"));
                out.push_str(&format!(
                    "used_memory_human:{:.2}M\r\n",
                    rss as f64 / (1 << 20) as f64
                ));
                out.push_str(&format!("used_memory_rss:{rss}\r\n"));
                out.push_str("maxmemory:0\r\n");
            }
            "keyspace" => {
                out.push_str("# Keyspace\r\n");
                if facts.keys > 0 {
                    out.push_str(&format!("db0:keys={},expires=0,avg_ttl=0\r\n", facts.keys));
                }
            }
            "modules" => {
                out.push_str("# Modules\r\n");
                // What clients look for to tell RedisBloom's commands are there.
                out.push_str(&format!(
                    "module:name=bf,ver={BF_MODULE_VERSION},api=1,filters=0,usedby=[],using=[],\
                     options=[]\r\n"
                ));
            }
            _ => unreachable!("a known section"),
        }
    }
    Reply::Text(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lists_every_command_with_its_arity() {
        let args = |ws: &[&str]| Args::of(ws);
        assert_eq!(
            command(&args(&["COMMAND", "COUNT"])),
            Reply::Int(COMMANDS.len() as i64)
        );
        let Reply::Array(found) = command(&args(&["COMMAND", "INFO", "BF.ADD", "nope"])) else {
            panic!("an array");
        };
        assert_eq!(found[1], Reply::Null);
        let Reply::Array(entry) = &found[0] else {
            panic!("an entry")
        };
        assert_eq!(entry[1], Reply::Int(3));
        let mut names: Vec<&str> = COMMANDS.iter().map(|c| c.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), COMMANDS.len(), "each command once");
    }

    #[test]
    fn info_has_the_sections_asked_for() {
        let facts = Facts {
            port: 6379,
            started: std::time::Instant::now(),
            clients: 2,
            max_clients: 10,
            keys: 3,
            connections_received: 7,
            commands_processed: 40,
            rejected_connections: 1,
            loading: true,
        };
        let Reply::Text(all) = info_text(&[], &facts) else {
            panic!("bulk")
        };
        let all = String::from_utf8(all.to_vec()).unwrap();
        for line in [
            "# Server",
            "connected_clients:2",
            "db0:keys=3",
            "module:name=bf",
            // What redis-py's test harness and `redis-cli --stat` read.
            "cluster_enabled:0",
            "loading:1",
            "role:master",
            "blocked_clients:0",
            "total_commands_processed:40",
            "total_connections_received:7",
            "rejected_connections:1",
        ] {
            assert!(all.contains(line), "{line} in {all}");
        }
        let Reply::Text(some) = info_text(&["keyspace".into()], &facts) else {
            panic!("bulk")
        };
        assert_eq!(
            &some[..],
            b"# Keyspace\r\ndb0:keys=3,expires=0,avg_ttl=0\r\n"
        );
    }
}
