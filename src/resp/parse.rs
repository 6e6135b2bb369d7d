//! The request side of RESP (the Redis protocol): a command is an array of bulk strings
//! (`*2\r\n$6\r\nBF.ADD\r\n...`), or an inline line of words for people at a terminal
//! (`PING\r\n`). Only that, not arbitrary RESP: a request never nests, so parsing needs no
//! recursion, and every length is checked against [`ParseLimits`] before anything is
//! buffered for it. (`redis-protocol` decodes nested arrays recursively with no depth bound:
//! a few megabytes of `*1\r\n` would overflow the stack.)

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;
use thiserror::Error;

/// Bounds on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseLimits {
    /// Arguments of one command, its name included.
    pub max_args: usize,
    /// Bytes of one command's arguments together (an inline line included).
    pub max_request_bytes: usize,
}

/// A request that is not RESP, or exceeds the limits. The connection cannot be resynchronised
/// after one: it is answered with the error and closed, as Redis does.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ParseError {
    /// A length or count line is not a decimal number in range.
    #[error("Protocol error: invalid {what} length `{line}`")]
    BadLength {
        /// Which length: `multibulk` or `bulk`.
        what: &'static str,
        /// The line, lossily decoded and cut short.
        line: String,
    },
    /// A byte where `$` or `\r\n` must be.
    #[error("Protocol error: expected {expected}, got `{got}`")]
    Unexpected {
        /// What the protocol needs here.
        expected: &'static str,
        /// What came, lossily decoded.
        got: String,
    },
    /// More arguments than [`ParseLimits::max_args`].
    #[error("Protocol error: {args} arguments exceed the limit of {max}")]
    TooManyArgs {
        /// Arguments announced.
        args: u64,
        /// The limit.
        max: usize,
    },
    /// A request longer than [`ParseLimits::max_request_bytes`].
    #[error("Protocol error: request exceeds the limit of {max} bytes")]
    TooLarge {
        /// The limit.
        max: usize,
    },
}

/// Where a command's arguments start and end in its buffer. Inline up to four: the commands
/// that come by the million (`BF.ADD k x`, `CMS.INCRBY k x 1`) allocate nothing for them.
type SpanList = SmallVec<[(usize, usize); 4]>;

/// The arguments of a complete command (start and end in the buffer), and the bytes it took.
type Spans = (SpanList, usize);

/// Longest line of a count or length (`*` or `$`, at most 20 digits, `\r\n`).
const MAX_LENGTH_LINE: usize = 24;

/// The arguments of one command, the name first: spans of the request's bytes (one buffer,
/// not a copy or a reference count per argument).
#[derive(Debug, Clone)]
pub struct Args {
    request: Bytes,
    spans: SpanList,
}

impl Args {
    /// Arguments, the name included.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// No arguments (an empty command).
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Bytes of the request, framing included.
    pub fn size(&self) -> usize {
        self.request.len()
    }

    /// Argument `i`.
    pub fn arg(&self, i: usize) -> &[u8] {
        let (a, b) = self.spans[i];
        &self.request[a..b]
    }

    /// Argument `i` as a view of the request's buffer.
    pub fn bytes(&self, i: usize) -> Bytes {
        let (a, b) = self.spans[i];
        self.request.slice(a..b)
    }

    /// Arguments `from..` as the items of a request: views of the request's buffer.
    pub fn items(&self, from: usize) -> crate::api::Items {
        self.items_at(from.min(self.spans.len())..self.spans.len())
    }

    /// The arguments at `indexes` as the items of a request: views of the request's buffer.
    pub fn items_at(&self, indexes: impl Iterator<Item = usize>) -> crate::api::Items {
        let spans = indexes.map(|i| self.spans[i]).collect();
        crate::api::Items::new(self.request.clone(), spans)
    }

    /// Arguments `from..`.
    pub fn from(&self, from: usize) -> impl ExactSizeIterator<Item = &[u8]> {
        self.spans[from.min(self.spans.len())..]
            .iter()
            .map(|&(a, b)| &self.request[a..b])
    }

    /// The arguments of `words`, as a client would send them.
    pub fn of<T: AsRef<[u8]>>(words: &[T]) -> Self {
        let mut request = Vec::new();
        let mut spans = SpanList::with_capacity(words.len());
        for w in words {
            let start = request.len();
            request.extend_from_slice(w.as_ref());
            spans.push((start, request.len()));
        }
        Args {
            request: request.into(),
            spans,
        }
    }
}

/// Longest inline command (Redis's bound too): a line is searched for its end as it arrives.
pub const MAX_INLINE_BYTES: usize = 64 << 10;

/// Takes commands off a connection's buffer, one at a time. A command that is not complete
/// yet is resumed where its parse stopped when more bytes arrive, so a request dripping in
/// byte by byte costs no re-parse of what came before.
#[derive(Debug, Default)]
pub struct Parser {
    partial: Option<Partial>,
}

/// A command parsed in part: offsets into the (unconsumed) buffer.
#[derive(Debug)]
enum Partial {
    /// A multibulk request: the arguments so far, how many are still to come, where the next
    /// one starts, and the bytes of the arguments so far.
    Multibulk {
        spans: SpanList,
        remaining: u64,
        at: usize,
        total: usize,
    },
    /// An inline line: no `\n` in the bytes scanned so far.
    Inline { scanned: usize },
}

impl Parser {
    /// Takes the first complete command off `buf`: its arguments, or `None` if more bytes are
    /// needed. An empty command (`*0`, a blank line) has no arguments. After an error the
    /// buffer cannot be parsed further (the connection is closed).
    pub fn next_command(
        &mut self,
        buf: &mut BytesMut,
        limits: ParseLimits,
    ) -> Result<Option<Args>, ParseError> {
        let partial = match self.partial.take() {
            Some(p) => p,
            None => match buf.first() {
                None => return Ok(None),
                Some(b'*') => {
                    let Some((count, at)) = length_line(buf, 0, "multibulk")? else {
                        return Ok(None);
                    };
                    // Redis takes `*0` and `*-1` as nothing to do.
                    let Ok(count) = u64::try_from(count) else {
                        buf.advance(at);
                        return Ok(Some(Args::of::<&[u8]>(&[])));
                    };
                    if count > limits.max_args as u64 {
                        return Err(ParseError::TooManyArgs {
                            args: count,
                            max: limits.max_args,
                        });
                    }
                    Partial::Multibulk {
                        // Grown as arguments arrive, not as announced.
                        spans: SpanList::with_capacity((count as usize).min(256)),
                        remaining: count,
                        at,
                        total: 0,
                    }
                }
                Some(_) => Partial::Inline { scanned: 0 },
            },
        };
        let done = match partial {
            Partial::Multibulk {
                spans,
                remaining,
                at,
                total,
            } => multibulk(buf, limits, spans, remaining, at, total)?,
            Partial::Inline { scanned } => inline(buf, limits, scanned)?,
        };
        match done {
            Ok((spans, consumed)) => {
                let request = buf.split_to(consumed).freeze();
                Ok(Some(Args { request, spans }))
            }
            Err(partial) => {
                self.partial = Some(partial);
                Ok(None)
            }
        }
    }
}

/// The rest of a multibulk request, from argument `at` on (`remaining` to come): the
/// arguments' spans and the bytes consumed once all of it is there, else where it stopped.
fn multibulk(
    buf: &[u8],
    limits: ParseLimits,
    mut spans: SpanList,
    mut remaining: u64,
    mut at: usize,
    mut total: usize,
) -> Result<Result<Spans, Partial>, ParseError> {
    while remaining > 0 {
        let stop = |spans, at, total| {
            Ok(Err(Partial::Multibulk {
                spans,
                remaining,
                at,
                total,
            }))
        };
        match buf.get(at) {
            None => return stop(spans, at, total),
            Some(b'$') => {}
            Some(&other) => {
                return Err(ParseError::Unexpected {
                    expected: "`$`",
                    got: lossy(&[other]),
                });
            }
        }
        let Some((len, start)) = length_line(buf, at, "bulk")? else {
            return stop(spans, at, total);
        };
        let len = usize::try_from(len).map_err(|_| ParseError::BadLength {
            what: "bulk",
            line: len.to_string(),
        })?;
        let new_total = total.saturating_add(len);
        if new_total > limits.max_request_bytes {
            return Err(ParseError::TooLarge {
                max: limits.max_request_bytes,
            });
        }
        let end = start + len;
        let Some(terminator) = buf.get(end..end + 2) else {
            return stop(spans, at, total);
        };
        if terminator != b"\r\n" {
            return Err(ParseError::Unexpected {
                expected: "`\\r\\n` after a bulk string",
                got: lossy(terminator),
            });
        }
        spans.push((start, end));
        total = new_total;
        at = end + 2;
        remaining -= 1;
    }
    Ok(Ok((spans, at)))
}

/// The signed number of a `*<n>\r\n` or `$<n>\r\n` line starting at `at`, and where the line
/// ends; `None` if the line is not complete yet.
#[inline]
fn length_line(
    buf: &[u8],
    at: usize,
    what: &'static str,
) -> Result<Option<(i64, usize)>, ParseError> {
    // Nearly every line is 1 to 18 digits and `\r\n` (no overflow possible): read in one
    // pass. Anything else (a sign, more digits, a short buffer, a bad byte) takes the
    // checked path below, which answers the same for these lines.
    let mut i = at + 1;
    let mut n: i64 = 0;
    while i - at <= 18 {
        match buf.get(i) {
            Some(&b) if b.is_ascii_digit() => {
                n = n * 10 + i64::from(b - b'0');
                i += 1;
            }
            _ => break,
        }
    }
    if i > at + 1 && buf.get(i..i + 2) == Some(b"\r\n") {
        return Ok(Some((n, i + 2)));
    }
    length_line_checked(buf, at, what)
}

/// [`length_line`] for any line: a sign, overflow, an incomplete line, a bad byte.
#[cold]
fn length_line_checked(
    buf: &[u8],
    at: usize,
    what: &'static str,
) -> Result<Option<(i64, usize)>, ParseError> {
    let rest = &buf[at + 1..];
    let window = &rest[..rest.len().min(MAX_LENGTH_LINE)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        if rest.len() >= MAX_LENGTH_LINE {
            return Err(ParseError::BadLength {
                what,
                line: lossy(window),
            });
        }
        return Ok(None);
    };
    let bad = || ParseError::BadLength {
        what,
        line: lossy(&window[..cr]),
    };
    let Some(&next) = rest.get(cr + 1) else {
        return Ok(None);
    };
    if next != b'\n' {
        return Err(bad());
    }
    let number = decimal(&window[..cr]).ok_or_else(bad)?;
    Ok(Some((number, at + 1 + cr + 2)))
}

/// A signed decimal number without a `+`, leading spaces or overflow.
fn decimal(digits: &[u8]) -> Option<i64> {
    let (negative, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(if negative { -n } else { n })
}

/// A line of words separated by spaces, ended by `\n` (a `\r` before it is dropped), at
/// most [`MAX_INLINE_BYTES`] (and `max_request_bytes`) long; the search for its end resumes
/// at `scanned`.
fn inline(
    buf: &[u8],
    limits: ParseLimits,
    scanned: usize,
) -> Result<Result<Spans, Partial>, ParseError> {
    let max = MAX_INLINE_BYTES.min(limits.max_request_bytes);
    let window = &buf[..buf.len().min(max + 1)];
    let Some(newline) = window[scanned.min(window.len())..]
        .iter()
        .position(|&b| b == b'\n')
        .map(|i| i + scanned)
    else {
        if buf.len() > max {
            return Err(ParseError::TooLarge { max });
        }
        return Ok(Err(Partial::Inline { scanned: buf.len() }));
    };
    let mut spans = SpanList::new();
    let mut start = None;
    for (i, &b) in buf[..newline].iter().enumerate() {
        match (start, b.is_ascii_whitespace()) {
            (None, false) => start = Some(i),
            (Some(s), true) => {
                spans.push((s, i));
                start = None;
            }
            _ => continue,
        }
        if spans.len() > limits.max_args {
            return Err(ParseError::TooManyArgs {
                args: spans.len() as u64,
                max: limits.max_args,
            });
        }
    }
    if let Some(s) = start {
        spans.push((s, newline));
    }
    if spans.len() > limits.max_args {
        return Err(ParseError::TooManyArgs {
            args: spans.len() as u64,
            max: limits.max_args,
        });
    }
    Ok(Ok((spans, newline + 1)))
}

/// Bytes shown in an error: lossily decoded, at most 32 of them.
fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(32)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ParseLimits = ParseLimits {
        max_args: 8,
        max_request_bytes: 64,
    };

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ParseError> {
        let mut buf = BytesMut::from(input);
        let mut commands = Vec::new();
        let mut parser = Parser::default();
        while let Some(c) = parser.next_command(&mut buf, LIMITS)? {
            commands.push(c.from(0).map(<[u8]>::to_vec).collect());
        }
        assert!(buf.is_empty(), "left over: {buf:?}");
        Ok(commands)
    }

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn pipelined_multibulk_and_inline_commands_come_out_in_order() {
        let input = b"*3\r\n$6\r\nBF.ADD\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n\
                      PING\r\n*0\r\n  BF.EXISTS  k   x \n*1\r\n$0\r\n\r\n";
        assert_eq!(
            parse_all(input).unwrap(),
            vec![
                args(&["BF.ADD", "k", "a\r\nb"]),
                args(&["PING"]),
                vec![],
                args(&["BF.EXISTS", "k", "x"]),
                vec![vec![]],
            ]
        );
    }

    #[test]
    fn every_split_of_a_command_waits_then_parses_the_same() {
        let input = b"*3\r\n$6\r\nBF.ADD\r\n$1\r\nk\r\n$5\r\nhello\r\nPING\r\n";
        for cut in 0..input.len() {
            let mut buf = BytesMut::from(&input[..cut]);
            let mut got = Vec::new();
            let mut parser = Parser::default();
            while let Some(c) = parser.next_command(&mut buf, LIMITS).unwrap() {
                got.push(c);
            }
            buf.extend_from_slice(&input[cut..]);
            while let Some(c) = parser.next_command(&mut buf, LIMITS).unwrap() {
                got.push(c);
            }
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(got[0].arg(2), b"hello");
            assert_eq!(got[0].bytes(2), Bytes::from_static(b"hello"));
            assert_eq!(got[1].arg(0), b"PING");
        }
    }

    #[test]
    fn malformed_requests_are_errors_not_waits() {
        for bad in [
            &b"*x\r\n"[..],
            b"*1\r\n:5\r\n",
            b"*1\r\n$3\r\nabcd\r\n",
            b"*1\r\n$-5\r\n",
            b"*1\r\n$99999999999999999999999\r\n",
            b"*1\r\n$+5\r\n",
            b"*1\r\n$ 5\r\n",
            b"*-\r\n",
            b"*1\r\n$1\r\r",
            b"*123456789012345678901234567890",
        ] {
            assert!(
                matches!(
                    parse_all(bad),
                    Err(ParseError::BadLength { .. } | ParseError::Unexpected { .. })
                ),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn limits_are_checked_before_the_bytes_arrive() {
        // Announced, not sent: refused at once rather than buffered.
        assert!(matches!(
            parse_all(b"*9\r\n"),
            Err(ParseError::TooManyArgs { args: 9, max: 8 })
        ));
        assert!(matches!(
            parse_all(b"*2\r\n$40\r\n0123456789012345678901234567890123456789\r\n$30\r\n"),
            Err(ParseError::TooLarge { max: 64 })
        ));
        assert!(matches!(
            parse_all(&[b'x'; 100]),
            Err(ParseError::TooLarge { max: 64 })
        ));
    }

    #[test]
    fn a_request_dripping_in_byte_by_byte_parses_once_complete() {
        let input = b"*3\r\n$6\r\nBF.ADD\r\n$1\r\nk\r\n$5\r\nhello\r\nECHO hi\r\n";
        let mut buf = BytesMut::new();
        let mut parser = Parser::default();
        let mut got = Vec::new();
        for &b in input {
            buf.extend_from_slice(&[b]);
            while let Some(c) = parser.next_command(&mut buf, LIMITS).unwrap() {
                got.push(c.from(0).map(<[u8]>::to_vec).collect::<Vec<_>>());
            }
        }
        assert_eq!(
            got,
            vec![args(&["BF.ADD", "k", "hello"]), args(&["ECHO", "hi"])]
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn inline_lines_are_bounded_in_bytes_and_words() {
        let limits = ParseLimits {
            max_args: 3,
            max_request_bytes: 1 << 20,
        };
        let mut parser = Parser::default();
        let mut long = BytesMut::from(&vec![b'a'; MAX_INLINE_BYTES + 1][..]);
        assert!(matches!(
            parser.next_command(&mut long, limits),
            Err(ParseError::TooLarge {
                max: MAX_INLINE_BYTES
            })
        ));
        let mut parser = Parser::default();
        let mut words = BytesMut::from(&b"a b c d e f g h\n"[..]);
        assert!(matches!(
            parser.next_command(&mut words, limits),
            Err(ParseError::TooManyArgs { max: 3, .. })
        ));
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let nested = b"*1\r\n".repeat(1_000_000);
        assert!(matches!(
            parse_all(&nested),
            Err(ParseError::Unexpected { .. })
        ));
    }
}
