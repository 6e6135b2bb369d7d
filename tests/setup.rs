//! The README's set-up as a newcomer meets it: its two commands (`cargo run --release -- demo`,
//! then `scripts/test.sh`) build one set of dependencies, and the example configurations keep
//! their data out of git.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// Every package of `cargo tree -e <edges>` with the features it is built with (a package
/// built for the host and the target with different features has two entries).
fn features(edges: &str) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(MANIFEST_DIR)
        .args(["tree", "--offline", "--locked", "-e", edges])
        .args(["--prefix", "none", "--format", "{p} [{f}]"])
        .output()
        .unwrap_or_else(|e| panic!("{cargo} tree: {e}"));
    assert!(
        out.status.success(),
        "cargo tree -e {edges} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let line = line.trim().trim_end_matches(" (*)");
        if line.is_empty() {
            continue;
        }
        let (package, features) = line
            .rsplit_once(" [")
            .unwrap_or_else(|| panic!("unexpected cargo tree line {line:?}"));
        map.entry(package.to_string())
            .or_default()
            .insert(features.trim_end_matches(']').to_string());
    }
    map
}

/// `cargo build` resolves features without the dev-dependencies, `cargo test` with them
/// (resolver 2): a feature only a dev-dependency turns on in a shared crate makes the test
/// build compile that crate, and everything above it, a second time.
#[test]
fn cargo_build_and_cargo_test_build_one_set_of_dependencies() {
    let build = features("normal,build");
    let test = features("normal,build,dev");
    assert!(build.len() > 50, "too few packages: {build:?}");
    let differ: Vec<String> = build
        .iter()
        .filter(|(package, f)| test.get(*package) != Some(f))
        .map(|(package, f)| {
            format!(
                "{package}: built with {f:?}, tested with {:?}",
                test.get(package)
            )
        })
        .collect();
    assert!(
        differ.is_empty(),
        "the dev-dependencies turn on features `cargo build` does not: name them in \
         Cargo.toml's [dependencies] (beside bitflags, percent-encoding, ...):\n{}",
        differ.join("\n")
    );
}

/// Relative `data_dir`s of the example configurations (run from the checkout) must be
/// ignored by git, so that trying the Quick start leaves `git status` clean.
#[test]
fn example_configs_keep_their_data_out_of_git() {
    let ignore = std::fs::read_to_string(Path::new(MANIFEST_DIR).join(".gitignore")).unwrap();
    let ignored: BTreeSet<&str> = ignore
        .lines()
        .map(|l| l.trim().trim_start_matches('/').trim_end_matches('/'))
        .collect();
    let mut dirs = Vec::new();
    let mut stack = vec![Path::new(MANIFEST_DIR).join("configs")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "toml") {
                for line in std::fs::read_to_string(&path).unwrap().lines() {
                    let Some(value) = line
                        .trim()
                        .strip_prefix("data_dir")
                        .and_then(|r| r.trim_start().strip_prefix('='))
                    else {
                        continue;
                    };
                    let value = value.trim().trim_matches('"').to_string();
                    dirs.push((path.clone(), value));
                }
            }
        }
    }
    assert!(
        dirs.iter().any(|(p, _)| p.ends_with("configs/node.toml")),
        "configs/node.toml has no data_dir any more: {dirs:?}"
    );
    for (config, dir) in dirs {
        if Path::new(&dir).is_absolute() {
            continue;
        }
        let first = Path::new(&dir)
            .components()
            .find_map(|c| match c {
                std::path::Component::Normal(s) => s.to_str(),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{}: data_dir {dir:?}", config.display()));
        assert!(
            ignored.contains(first),
            "{}: data_dir {dir:?} is not ignored by .gitignore (add `/{first}/`)",
            config.display()
        );
    }
}

/// `scripts/test.sh` on a machine without what its installs need names each missing tool and
/// installs nothing. (Here: a PATH holding only the shell and `dirname`.)
#[cfg(unix)]
#[test]
fn test_script_names_what_it_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(dir.path().join("scripts")).unwrap();
    std::fs::copy(
        Path::new(MANIFEST_DIR).join("scripts/test.sh"),
        dir.path().join("scripts/test.sh"),
    )
    .unwrap();
    let which = |tool: &str| {
        ["/usr/bin", "/bin", "/usr/local/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("no {tool} in /usr/bin, /bin or /usr/local/bin"))
    };
    for tool in ["bash", "dirname"] {
        std::os::unix::fs::symlink(which(tool), bin.join(tool)).unwrap();
    }
    let out = Command::new(bin.join("bash"))
        .arg(dir.path().join("scripts/test.sh"))
        .env_clear()
        .env("PATH", &bin)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for tool in ["cargo", "python3", "apt-get", "dpkg-deb"] {
        assert!(
            stderr.contains(&format!("- {tool}")),
            "{tool} not named:\n{stderr}"
        );
    }
    assert!(
        !dir.path().join(".tools").exists(),
        "installed something:\n{stderr}"
    );
}
