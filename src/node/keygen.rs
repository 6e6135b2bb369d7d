//! `crpf keygen`: writes a new cluster key (`node.auth_key_file`) from the operating system's
//! random source.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use thiserror::Error;

/// Random bytes in a key: 256 bits, the strength of HMAC-SHA256.
const KEY_BYTES: usize = 32;

/// `crpf keygen`: writes a new cluster key.
#[derive(Debug, Clone, Args)]
pub struct KeygenArgs {
    /// The key file to write, readable by its owner only (mode 0600). `-` prints the key.
    #[arg(long, short)]
    pub out: PathBuf,
    /// Replace an existing key file (every node then needs the new key: see README, "Key
    /// rotation", to change keys without an outage).
    #[arg(long)]
    pub force: bool,
    /// Succeed without writing when the file exists already (start-up scripts that create a
    /// cluster's key once).
    #[arg(long, conflicts_with = "force")]
    pub if_missing: bool,
}

/// Why no key was written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum KeygenError {
    /// The file exists and neither `--force` nor `--if-missing` was given.
    #[error(
        "{0} exists: it may be the key of a running cluster; pass --force to replace it or \
         --if-missing to keep it"
    )]
    Exists(PathBuf),
    /// The operating system gave no random bytes.
    #[error("no random bytes from the operating system: {0}")]
    Random(String),
    /// The file could not be written.
    #[error("cannot write key file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A new key as the text a key file holds: 32 random bytes in hex, and a newline.
pub fn new_key_text() -> Result<String, KeygenError> {
    let mut bytes = [0u8; KEY_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| KeygenError::Random(e.to_string()))?;
    let mut text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    text.push('\n');
    Ok(text)
}

/// Runs `crpf keygen`.
pub fn run_keygen(args: &KeygenArgs) -> Result<(), KeygenError> {
    let key = new_key_text()?;
    if args.out == Path::new("-") {
        print!("{key}");
        return Ok(());
    }
    if args.out.exists() {
        if args.if_missing {
            eprintln!("{} exists; left as it is", args.out.display());
            return Ok(());
        }
        if !args.force {
            return Err(KeygenError::Exists(args.out.clone()));
        }
    }
    write_private(&args.out, key.as_bytes(), args.force).map_err(|source| KeygenError::Write {
        path: args.out.clone(),
        source,
    })?;
    eprintln!(
        "wrote a new cluster key to {}: give every node the same file as node.auth_key_file",
        args.out.display()
    );
    Ok(())
}

/// Writes `bytes` to a file only its owner can read; the key is never readable by others,
/// not even for a moment (the mode is set at creation).
fn write_private(path: &Path, bytes: &[u8], replace: bool) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if replace {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(0o600);
        let mut file = options.open(path)?;
        // A replaced file keeps its old mode: tighten it too.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(bytes)?;
        file.sync_all()
    }
    #[cfg(not(unix))]
    {
        let mut file = options.open(path)?;
        file.write_all(bytes)?;
        file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::AuthKeys;

    #[test]
    fn keys_are_new_private_and_usable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let args = |force, if_missing| KeygenArgs {
            out: path.clone(),
            force,
            if_missing,
        };
        run_keygen(&args(false, false)).unwrap();
        let first = std::fs::read_to_string(&path).unwrap();
        assert_eq!(first.trim().len(), 2 * KEY_BYTES);
        AuthKeys::new([AuthKeys::read_key_file(&path).unwrap()]).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // An existing key is never replaced by accident.
        assert!(matches!(
            run_keygen(&args(false, false)),
            Err(KeygenError::Exists(_))
        ));
        run_keygen(&args(false, true)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
        run_keygen(&args(true, false)).unwrap();
        assert_ne!(std::fs::read_to_string(&path).unwrap(), first);
    }
}
