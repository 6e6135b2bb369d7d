//! Cluster keys of authenticated envelopes: HMAC-SHA256 over the frame.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of the MAC a signed frame carries.
pub const MAC_LEN: usize = 32;

/// Shortest key accepted: the output size of SHA-256, so that the key is not the weak part.
pub const MIN_KEY_LEN: usize = 32;

/// Why a key cannot be used. The messages never contain key material.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key file cannot be read.
    #[error("cannot read key file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The key (file) holds nothing but whitespace.
    #[error("the key is empty")]
    Empty,
    /// The key is shorter than [`MIN_KEY_LEN`].
    #[error("the key has {len} bytes, at least {MIN_KEY_LEN} are required")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// No key at all.
    #[error("no key given")]
    NoKeys,
}

/// The cluster keys of a replica: the first signs every frame it sends, and a frame is
/// accepted if any of them verifies it, so that keys can be rotated without a flag day (add the
/// new key as accepted everywhere, then make it the signing key, then drop the old one).
///
/// Cheap to clone (shared). `Debug` shows the number of keys, never their bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthKeys {
    keys: Arc<[Box<[u8]>]>,
}

impl std::fmt::Debug for AuthKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthKeys")
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl AuthKeys {
    /// Keys from their bytes, the signing key first. Each must have at least [`MIN_KEY_LEN`]
    /// bytes.
    pub fn new<K: Into<Vec<u8>>>(keys: impl IntoIterator<Item = K>) -> Result<Self, KeyError> {
        let keys = keys
            .into_iter()
            .map(|k| {
                let k: Vec<u8> = k.into();
                check(&k)?;
                Ok(k.into_boxed_slice())
            })
            .collect::<Result<Vec<_>, KeyError>>()?;
        if keys.is_empty() {
            return Err(KeyError::NoKeys);
        }
        Ok(AuthKeys { keys: keys.into() })
    }

    /// Reads one key file: its bytes with leading and trailing ASCII whitespace removed (so a
    /// text key ending in a newline works, e.g. from `openssl rand -base64 48`).
    pub fn read_key_file(path: &Path) -> Result<Vec<u8>, KeyError> {
        let bytes = std::fs::read(path).map_err(|source| KeyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let key = bytes.trim_ascii().to_vec();
        check(&key)?;
        Ok(key)
    }

    /// Number of keys (signing key included).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Always false: there is at least the signing key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The MAC of `data` under the signing key.
    pub fn sign(&self, data: &[u8]) -> [u8; MAC_LEN] {
        let mut mac = keyed(&self.keys[0]);
        mac.update(data);
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is the MAC of `data` under one of the keys; compared in constant time.
    pub fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        self.keys.iter().any(|k| {
            let mut mac = keyed(k);
            mac.update(data);
            mac.verify_slice(tag).is_ok()
        })
    }
}

fn check(key: &[u8]) -> Result<(), KeyError> {
    match key.len() {
        0 => Err(KeyError::Empty),
        len if len < MIN_KEY_LEN => Err(KeyError::TooShort { len }),
        _ => Ok(()),
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answer() {
        // RFC 4231, test case 6: the wrapper is plain HMAC-SHA256 (other implementations of
        // the format can interoperate).
        let key = vec![0xaa; 131];
        let keys = AuthKeys::new([key.clone()]).unwrap();
        let data = b"Test Using Larger Than Block-Size Key - Hash Key First";
        let hex: String = keys.sign(data).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn first_signs_all_verify() {
        let old = AuthKeys::new([[1u8; 32]]).unwrap();
        let both = AuthKeys::new([[2u8; 32], [1u8; 32]]).unwrap();
        let new = AuthKeys::new([[2u8; 32]]).unwrap();
        let m = b"frame";
        assert!(both.verify(m, &old.sign(m)));
        assert!(both.verify(m, &new.sign(m)));
        assert!(new.verify(m, &both.sign(m)));
        assert!(!old.verify(m, &both.sign(m)));
        assert!(!both.verify(m, &[0; MAC_LEN]));
        assert!(!both.verify(m, &old.sign(m)[..31]));
    }

    #[test]
    fn short_empty_and_missing_keys_are_refused() {
        assert!(matches!(
            AuthKeys::new([vec![7u8; 31]]),
            Err(KeyError::TooShort { len: 31 })
        ));
        assert!(matches!(
            AuthKeys::new(Vec::<Vec<u8>>::new()),
            Err(KeyError::NoKeys)
        ));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, " \n").unwrap();
        assert!(matches!(AuthKeys::read_key_file(&p), Err(KeyError::Empty)));
        std::fs::write(&p, "short\n").unwrap();
        assert!(matches!(
            AuthKeys::read_key_file(&p),
            Err(KeyError::TooShort { len: 5 })
        ));
        let text = "0123456789abcdef0123456789abcdef";
        std::fs::write(&p, format!("{text}\n")).unwrap();
        assert_eq!(AuthKeys::read_key_file(&p).unwrap(), text.as_bytes());
        assert!(matches!(
            AuthKeys::read_key_file(&dir.path().join("missing")),
            Err(KeyError::Read { .. })
        ));
    }

    #[test]
    fn debug_hides_the_keys() {
        let keys = AuthKeys::new([[0x41u8; 40]]).unwrap();
        let shown = format!("{keys:?}");
        assert!(!shown.contains("AAAA") && !shown.contains("65"), "{shown}");
    }
}
