//! A RESP reply in either protocol, and its encoding: what every command family answers.

use bytes::{BufMut, Bytes, BytesMut};

use crate::api::batch;

/// The protocol a connection speaks: RESP2 until `HELLO 3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// RESP2: booleans as `:1`/`:0`, maps as flat arrays, null as `$-1`.
    #[default]
    Resp2,
    /// RESP3 (`HELLO 3`): `#t`/`#f`, `%` maps, `_` null.
    Resp3,
}

/// A reply, in either protocol ([`Reply::encode_as`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Reply {
    /// `+<text>`.
    Simple(&'static str),
    /// `:<n>`.
    Int(i64),
    /// A boolean: RESP3 `#t`/`#f`, RESP2 `:1`/`:0` (RedisBloom's replies to adds and
    /// queries).
    Bool(bool),
    /// RESP3 `%<n>` and the pairs; RESP2 a flat array of keys and values.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 `_`; RESP2 `$-1`.
    Null,
    /// `$<len>` and the bytes.
    Bulk(Bytes),
    /// `*<n>` and the elements.
    Array(Vec<Reply>),
    /// `*<n>` of `:1` and `:0` read from a checked bitmap of `n` results
    /// ([`batch::check_bitmap`]), a `0` as `refused` where given: a batch's answer without a
    /// `Reply` per item.
    Bits {
        /// The results, bit `i` of byte `i / 8` for item `i`.
        bitmap: Bytes,
        /// How many.
        items: usize,
        /// The reply of an item refused (else `:0`).
        refused: Option<Box<Reply>>,
    },
    /// A double: RESP3 `,` and RESP2 a bulk string, of `%.17g` (Redis 7.2's
    /// `RedisModule_ReplyWithDouble`; `TOPK.INFO`'s decay).
    Double(f64),
    /// `-<text>`: the text starts with the error's kind (`ERR`, `NOAUTH`...).
    Error(String),
    /// Text for people: RESP3 a verbatim string (`=`, format `txt`), RESP2 a bulk string
    /// (`INFO`).
    Text(Bytes),
    /// RESP3 a map of this one field, RESP2 an array of its value: RedisBloom's
    /// `BF.INFO key field`.
    FieldOrValue(Box<Reply>, Box<Reply>),
    /// RESP2 the integer, RESP3 the boolean: RedisBloom's answer for an item `CF.INSERT`
    /// could not add (`-1` / `false`).
    IntOrBool {
        /// The RESP2 integer.
        resp2: i64,
        /// The RESP3 boolean.
        resp3: bool,
    },
}

impl Reply {
    /// An `ERR` error.
    pub fn err(text: impl std::fmt::Display) -> Self {
        Reply::Error(format!("ERR {text}"))
    }

    /// Appends the reply's RESP2 encoding.
    pub fn encode(&self, out: &mut BytesMut) {
        self.encode_as(out, Protocol::Resp2)
    }

    /// Appends the reply's encoding in `protocol`.
    pub fn encode_as(&self, out: &mut BytesMut, protocol: Protocol) {
        let resp3 = protocol == Protocol::Resp3;
        match self {
            Reply::Simple(s) => line(out, b'+', s.as_bytes()),
            Reply::Int(0) => out.put_slice(b":0\r\n"),
            Reply::Int(1) => out.put_slice(b":1\r\n"),
            Reply::Int(n) => line(out, b':', itoa::Buffer::new().format(*n).as_bytes()),
            Reply::Bool(b) => out.put_slice(match (resp3, b) {
                (true, true) => b"#t\r\n",
                (true, false) => b"#f\r\n",
                (false, true) => b":1\r\n",
                (false, false) => b":0\r\n",
            }),
            Reply::Null if resp3 => out.put_slice(b"_\r\n"),
            Reply::Null => out.put_slice(b"$-1\r\n"),
            Reply::Map(pairs) => {
                let (kind, n) = if resp3 {
                    (b'%', pairs.len())
                } else {
                    (b'*', 2 * pairs.len())
                };
                line(out, kind, itoa::Buffer::new().format(n).as_bytes());
                for (k, v) in pairs {
                    k.encode_as(out, protocol);
                    v.encode_as(out, protocol);
                }
            }
            Reply::Bulk(b) => {
                line(out, b'$', itoa::Buffer::new().format(b.len()).as_bytes());
                out.put_slice(b);
                out.put_slice(b"\r\n");
            }
            Reply::Array(items) => {
                line(
                    out,
                    b'*',
                    itoa::Buffer::new().format(items.len()).as_bytes(),
                );
                items.iter().for_each(|r| r.encode_as(out, protocol));
            }
            Reply::Bits {
                bitmap,
                items,
                refused,
            } => {
                line(out, b'*', itoa::Buffer::new().format(*items).as_bytes());
                for i in 0..*items {
                    // Checked when built from an answer; a short bitmap reads as zeros.
                    match (batch::bitmap_bit(bitmap, i), refused) {
                        (true, _) => Reply::Bool(true).encode_as(out, protocol),
                        (false, Some(e)) => e.encode_as(out, protocol),
                        (false, None) => Reply::Bool(false).encode_as(out, protocol),
                    }
                }
            }
            Reply::Text(b) if resp3 => {
                line(
                    out,
                    b'=',
                    itoa::Buffer::new().format(b.len() + 4).as_bytes(),
                );
                out.put_slice(b"txt:");
                out.put_slice(b);
                out.put_slice(b"\r\n");
            }
            Reply::Text(b) => Reply::Bulk(b.clone()).encode_as(out, protocol),
            Reply::FieldOrValue(field, value) if resp3 => {
                out.put_slice(b"%1\r\n");
                field.encode_as(out, protocol);
                value.encode_as(out, protocol);
            }
            Reply::FieldOrValue(_, value) => {
                out.put_slice(b"*1\r\n");
                value.encode_as(out, protocol);
            }
            Reply::Double(v) if resp3 => line(out, b',', format_g17(*v).as_bytes()),
            Reply::Double(v) => Reply::Bulk(Bytes::from(format_g17(*v))).encode_as(out, protocol),
            Reply::IntOrBool { resp3: b, .. } if resp3 => Reply::Bool(*b).encode_as(out, protocol),
            Reply::IntOrBool { resp2: n, .. } => Reply::Int(*n).encode_as(out, protocol),
            // One line: an error text must not end the reply early.
            Reply::Error(e) => {
                let text: String = e
                    .chars()
                    .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
                    .collect();
                line(out, b'-', text.as_bytes());
            }
        }
    }
}

/// C's `%.17g` of a finite double: 17 significant digits, trailing zeros dropped, an exponent
/// below 1e-4 or from 1e17.
fn format_g17(v: f64) -> String {
    if v.is_nan() {
        // Redis's `addReplyDouble`.
        return "nan".into();
    }
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let sci = format!("{v:.16e}");
    let (mantissa, e) = sci.split_once('e').expect("scientific");
    let e: i32 = e.parse().expect("exponent");
    let trim = |s: &str| -> String {
        match s.contains('.') {
            true => s.trim_end_matches('0').trim_end_matches('.').to_string(),
            false => s.to_string(),
        }
    };
    if (-4..17).contains(&e) {
        trim(&format!("{v:.*}", (16 - e) as usize))
    } else {
        format!(
            "{}e{}{:02}",
            trim(mantissa),
            if e < 0 { '-' } else { '+' },
            e.abs()
        )
    }
}

fn line(out: &mut BytesMut, kind: u8, body: &[u8]) {
    out.put_u8(kind);
    out.put_slice(body);
    out.put_slice(b"\r\n");
}
