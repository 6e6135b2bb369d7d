//! Filter names: any key, as in Redis, carried where only a subject token fits.
//!
//! A key (a filter's name as RESP and the catalog API take it) is any 0 to [`MAX_KEY_BYTES`]
//! bytes. NATS subjects (`<prefix>.<name>.api...`), JetStream KV keys, metrics labels and
//! data directories carry its **subject name** ([`subject_name`]):
//!
//! - a *plain* key, one subject token of `[A-Za-z0-9_-]`, 1 to 64 bytes, not starting with
//!   `_` (every name crpf took before keys were free), is its own subject name: nothing
//!   about such filters changed;
//! - any other key is `_k` followed by its bytes, each of `[A-Za-z0-9-]` as itself and every
//!   other byte as `_` and two upper-case hex digits (`bf:users:1` is `_kbf_3Ausers_3A1`).
//!
//! The mapping is one to one: plain names never start with `_`, and only the canonical
//! spelling of an encoded name is a name ([`is_subject_name`]), so every key has exactly one
//! subject name and every subject name one key ([`key_of`]). In another language: keep a
//! plain key as it is, else write `_k` then each byte `b` as `chr(b)` if it is an ASCII letter,
//! digit or `-`, else `"_%02X" % b`.

use std::borrow::Cow;

/// The longest key, in bytes (its subject name is at most `2 + 3 * MAX_KEY_BYTES`).
pub const MAX_KEY_BYTES: usize = 1024;

/// The prefix of an encoded subject name.
const ENCODED: &str = "_k";

/// Whether `key` is its own subject name: one token of `[A-Za-z0-9_-]`, 1 to 64 bytes, not
/// starting with `_`.
pub fn is_plain(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= 64 && key[0] != b'_' && key.iter().all(|&b| PLAIN[b as usize])
}

/// The bytes of a plain key, `[A-Za-z0-9_-]`: one table lookup per byte instead of three
/// range tests, since every RESP command's key is checked byte by byte.
const PLAIN: [bool; 256] = {
    let mut plain = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        plain[b] = c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
        b += 1;
    }
    plain
};

/// The subject name of `key` (see the module's documentation). Any length: whether the
/// key may name a filter is [`is_subject_name`]'s answer on the result.
pub fn subject_name(key: &[u8]) -> Cow<'_, str> {
    if is_plain(key) {
        // Borrowed, with no copy and no second pass on the hot path (every RESP command
        // looks its key up by it).
        // SAFETY: `is_plain` admits ASCII bytes only, and ASCII is UTF-8.
        return Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(key) });
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(ENCODED.len() + key.len() * 3);
    out.push_str(ENCODED);
    for &b in key {
        if b.is_ascii_alphanumeric() || b == b'-' {
            out.push(b as char);
        } else {
            out.push('_');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
    Cow::Owned(out)
}

/// The key a subject name stands for; `None` if `name` is no subject name (not plain, not
/// a canonical encoding, or a key over [`MAX_KEY_BYTES`]).
pub fn key_of(name: &str) -> Option<Vec<u8>> {
    decode(name).filter(|key| key.len() <= MAX_KEY_BYTES)
}

/// [`key_of`] for a key of any length.
fn decode(name: &str) -> Option<Vec<u8>> {
    if is_plain(name.as_bytes()) {
        return Some(name.as_bytes().to_vec());
    }
    let rest = name.strip_prefix(ENCODED)?.as_bytes();
    let mut key = Vec::with_capacity(rest.len());
    let mut i = 0;
    while i < rest.len() {
        let b = rest[i];
        if b == b'_' {
            let hex = rest.get(i + 1..i + 3)?;
            let digit = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'A'..=b'F' => Some(c - b'A' + 10),
                _ => None,
            };
            let byte = digit(hex[0])? << 4 | digit(hex[1])?;
            // Canonical only: a byte that is written as itself is never escaped.
            if byte.is_ascii_alphanumeric() || byte == b'-' {
                return None;
            }
            key.push(byte);
            i += 3;
        } else if b.is_ascii_alphanumeric() || b == b'-' {
            key.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    // A plain key is never encoded.
    (!is_plain(&key)).then_some(key)
}

/// Whether `name` is the subject name of a key a filter may have.
pub fn is_subject_name(name: &str) -> bool {
    is_plain(name.as_bytes()) || key_of(name).is_some()
}

/// The key of subject name `name` for people (logs, errors, the catalog API): the key if it
/// is UTF-8 (of any length), else the subject name itself.
pub fn display_key(name: &str) -> String {
    match decode(name).map(String::from_utf8) {
        Some(Ok(key)) => key,
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_unchanged_and_others_round_trip() {
        for plain in ["users", "tenant-7", "a_b", "A9"] {
            assert_eq!(subject_name(plain.as_bytes()), plain);
            assert_eq!(key_of(plain).unwrap(), plain.as_bytes());
        }
        assert_eq!(subject_name(b"bf:users:1"), "_kbf_3Ausers_3A1");
        assert!(matches!(subject_name(b"users"), Cow::Borrowed("users")));
        assert_eq!(subject_name(b"_x"), "_k_5Fx");
        assert_eq!(subject_name(b""), "_k");
        let long = vec![b'a'; 65];
        assert_eq!(subject_name(&long), format!("_k{}", "a".repeat(65)));
        let mut keys: Vec<Vec<u8>> = vec![
            b"a.b".to_vec(),
            b"{tag}x".to_vec(),
            b"user bloom".to_vec(),
            "caf\u{e9}".as_bytes().to_vec(),
            vec![0, 255, b'_', b'.'],
            vec![b'z'; MAX_KEY_BYTES],
            vec![0xAB; MAX_KEY_BYTES],
            Vec::new(),
        ];
        keys.extend((0..=255u8).map(|b| vec![b]));
        for key in keys {
            let name = subject_name(&key).into_owned();
            assert!(is_subject_name(&name), "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
                "{name}"
            );
            assert_eq!(key_of(&name).as_deref(), Some(&key[..]), "{name}");
        }
    }

    #[test]
    fn only_canonical_encodings_of_bounded_keys_are_names() {
        // `a` escaped, a plain key encoded, lower-case hex, a cut escape, too long.
        for bad in [
            "_k_61", "_kusers", "_k_3a", "_k_3", "_", "_catalog", "_node", "a.b",
        ] {
            assert!(!is_subject_name(bad), "{bad}");
        }
        assert!(!is_subject_name(&subject_name(&vec![
            b'z';
            MAX_KEY_BYTES + 1
        ])));
        assert_eq!(display_key("_kbf_3Ax"), "bf:x");
        assert_eq!(display_key("_k_FF"), "_k_FF");
    }
}
