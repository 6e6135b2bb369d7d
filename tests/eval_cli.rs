//! `crpf eval fpr --quick` and `crpf eval size --quick` run as a user would run them; their
//! outputs are checked for shape and sanity.
#![cfg(feature = "eval")]

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

type Row = HashMap<String, String>;

fn crpf(args: &[&str], out: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_crpf"))
        .args(args)
        .arg("--out")
        .arg(out)
        .arg("--no-progress")
        .output()
        .expect("the crpf binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "crpf {args:?} failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn read_csv(path: &Path) -> (Vec<String>, Vec<Row>) {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
    let rows = r
        .records()
        .map(|rec| {
            let rec = rec.unwrap();
            header
                .iter()
                .cloned()
                .zip(rec.iter().map(String::from))
                .collect()
        })
        .collect();
    (header, rows)
}

fn f(row: &Row, col: &str) -> f64 {
    row[col]
        .parse()
        .unwrap_or_else(|e| panic!("column {col} = {:?}: {e}", row[col]))
}

/// Three binomial standard errors of the mean FPR of a row.
fn noise(row: &Row, p: f64) -> f64 {
    3.0 * (p * (1.0 - p) / (f(row, "probes") * f(row, "reps"))).sqrt()
}

#[test]
fn eval_fpr_quick_outputs_are_sane() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = crpf(&["eval", "fpr", "--quick"], dir.path());
    assert!(
        stdout.contains("wrote"),
        "prints where outputs go: {stdout}"
    );
    let fpr_dir = dir.path().join("fpr");

    let (header, points) = read_csv(&fpr_dir.join("fpr.csv"));
    for col in [
        "kind",
        "design",
        "split",
        "interval",
        "reps",
        "adds",
        "probes",
        "fpr",
        "fpr_sd",
        "estimated_fpr",
        "theory",
        "load_factor",
        "failed_adds",
        "overflow",
        "sub_filters",
        "syncs",
    ] {
        assert!(
            header.iter().any(|h| h == col),
            "fpr.csv lacks {col}: {header:?}"
        );
    }
    // 6 kinds, 3 of them with two designs; 3 splits x 3 intervals + 2 references each.
    assert_eq!(points.len(), 9 * 11);
    let (_, runs) = read_csv(&fpr_dir.join("fpr-runs.csv"));
    assert_eq!(runs.len(), 9 * 11 * 2, "two repetitions per point");
    let (_, checks) = read_csv(&fpr_dir.join("checks.csv"));
    assert_eq!(checks.len(), points.len());

    let by = |kind: &str, design: &str, split: &str, interval: &str| -> &Row {
        points
            .iter()
            .find(|r| {
                r["kind"] == kind
                    && r["design"] == design
                    && r["split"] == split
                    && r["interval"] == interval
            })
            .unwrap_or_else(|| panic!("no point {kind} {design} {split} {interval}"))
    };

    for r in &points {
        let (fpr, est, theory) = (f(r, "fpr"), f(r, "estimated_fpr"), f(r, "theory"));
        let what = format!(
            "{} {} {} {}",
            r["kind"], r["design"], r["split"], r["interval"]
        );
        assert!(fpr > 0.0 && fpr < 0.5, "{what}: fpr {fpr}");
        assert_eq!(f(r, "adds"), 65536.0, "{what}");
        match (r["kind"].as_str(), r["design"].as_str()) {
            // Eq. 3.1 within 10%, at every point.
            ("gbf", _) => assert!(
                (fpr - theory).abs() <= 0.1 * theory,
                "{what}: {fpr} vs {theory}"
            ),
            // Eq. 3.7 at the measured load, up to sampling noise; the load stays under 100%
            // for adds, and the thesis configuration's 2c/2^l bounds it.
            ("gcf" | "orcf", _) => {
                assert!(
                    fpr <= est + noise(r, est),
                    "{what}: {fpr} over estimate {est}"
                );
                assert!(est <= theory * 1.01, "{what}: estimate {est} over 2c/2^l");
                assert!(
                    f(r, "load_factor") > 0.9,
                    "{what}: load {}",
                    r["load_factor"]
                );
            }
            // The redesign keeps its bound at every point.
            (_, "per-writer") => {
                assert!(
                    fpr <= theory + noise(r, theory),
                    "{what}: {fpr} over bound {theory}"
                )
            }
            _ => {}
        }
    }
    // GBF does not depend on split or interval (the merged state is the same bit set).
    let gbf: Vec<f64> = points
        .iter()
        .filter(|r| r["kind"] == "gbf")
        .map(|r| f(r, "fpr"))
        .collect();
    assert!(gbf.windows(2).all(|w| w[0] == w[1]), "{gbf:?}");
    // A full cuckoo filter rejects adds (the thesis's load factor under 100%).
    assert!(f(by("gcf", "thesis", "all-local", ""), "failed_adds") > 0.0);
    // The references are the same state built two ways.
    for kind in ["gcf", "orcf", "scgbf"] {
        assert_eq!(
            by(kind, "thesis", "synced", "")["fpr"],
            by(kind, "thesis", "all-local", "")["fpr"]
        );
    }
    // The thesis's scalable design breaks its bound when replicas sync rarely (Figure 6.1d),
    // and the per-writer redesign does not.
    let thesis = by("scgbf", "thesis", "50-50", "10000");
    assert!(f(thesis, "fpr") > 1.5 * f(thesis, "theory"), "{thesis:?}");
    let redesign = by("scgbf", "per-writer", "50-50", "10000");
    assert!(f(redesign, "fpr") < f(redesign, "theory"), "{redesign:?}");

    for (panel, kind) in [
        ('a', "gbf"),
        ('b', "gcf"),
        ('c', "orcf"),
        ('d', "scgbf"),
        ('e', "scgcf"),
        ('f', "scorcf"),
    ] {
        let png = std::fs::read(fpr_dir.join(format!("fig-6.1{panel}-{kind}.png"))).unwrap();
        assert!(png.len() > 10_000, "{kind}: PNG of {} bytes", png.len());
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{kind}: not a PNG");
        let svg =
            std::fs::read_to_string(fpr_dir.join(format!("fig-6.1{panel}-{kind}.svg"))).unwrap();
        assert!(
            svg.contains("<svg") && svg.contains("<polyline"),
            "{kind}: SVG without lines"
        );
        assert!(svg.contains("50-50 split"), "{kind}: SVG without legend");
    }

    // The figures can be redrawn from the CSV alone.
    let replot = dir.path().join("replot");
    let status = Command::new(env!("CARGO_BIN_EXE_crpf"))
        .args(["eval", "plot", "--data"])
        .arg(fpr_dir.join("fpr.csv"))
        .arg("--out")
        .arg(&replot)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::read(replot.join("checks.csv")).unwrap(),
        std::fs::read(fpr_dir.join("checks.csv")).unwrap()
    );
    assert!(
        std::fs::metadata(replot.join("fig-6.1f-scorcf.png"))
            .unwrap()
            .len()
            > 10_000
    );
}

#[test]
fn eval_size_quick_outputs_are_sane() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = crpf(&["eval", "size", "--quick"], dir.path());
    assert!(
        stdout.contains("Table 6.1") && stdout.contains("Table 6.2"),
        "{stdout}"
    );
    let size_dir = dir.path().join("size");
    let (header, rows) = read_csv(&size_dir.join("size.csv"));
    for col in [
        "table",
        "workload",
        "crdt",
        "load_factor",
        "serialized_mb",
        "serialized_bpe",
        "compressed_mb",
        "compressed_bpe",
        "thesis_serialized_bpe",
    ] {
        assert!(
            header.iter().any(|h| h == col),
            "size.csv lacks {col}: {header:?}"
        );
    }
    // Table 6.1: 2 workloads x 3 structures; Table 6.2: 6 workloads x 2 structures; the
    // scalable filters: 2 workloads x 3 kinds x 2 designs.
    assert_eq!(rows.len(), 6 + 12 + 12);
    let md = std::fs::read_to_string(size_dir.join("size.md")).unwrap();
    assert_eq!(
        md.lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| Workload"))
            .count(),
        30
    );

    let row = |workload: &str, crdt: &str| -> &Row {
        rows.iter()
            .find(|r| r["workload"] == workload && r["crdt"] == crdt)
            .unwrap_or_else(|| panic!("no row {workload} {crdt}"))
    };
    for r in &rows {
        let bpe = f(r, "serialized_bpe");
        assert!(bpe > 0.0 && bpe.is_finite(), "{r:?}");
        assert!(
            f(r, "compressed_bpe") <= bpe * 1.01,
            "gzip does not inflate: {r:?}"
        );
    }
    for split in ["all local", "50-50 split"] {
        let w = format!("100% add, {split}");
        let gset = f(row(&w, "GSet"), "serialized_bpe");
        // A 16-byte key is at least 16 bytes in any set encoding.
        assert!(gset >= 16.0, "{gset}");
        for filter in ["GBF 5", "GCF 4"] {
            let bpe = f(row(&w, filter), "serialized_bpe");
            assert!(bpe < 1.3, "{filter} {split}: {bpe} bytes per element");
        }
        let orcf = f(row(&w, "ORCF 4"), "serialized_bpe");
        assert!(orcf < f(row(&w, "ORSet"), "serialized_bpe"), "{orcf}");
        // Load factors: the sets hold every element, the cuckoo filters nearly all.
        assert_eq!(f(row(&w, "GSet"), "load_factor"), 1.0);
        assert!(f(row(&w, "GCF 4"), "load_factor") > 0.9);
    }
    // Scalable filters: every element accepted, in a few sub-filters.
    for crdt in ["ScGBF 5", "ScGCF 4", "ScORCF 4"] {
        for design in ["thesis", "per-writer"] {
            let r = row("100% add, 50-50 split", &format!("{crdt} ({design})"));
            assert_eq!(f(r, "failed_adds"), 0.0, "{r:?}");
            assert!(f(r, "serialized_bpe") < 4.0, "{r:?}");
        }
    }
    // The 80% and 51% add workloads leave 60% and 2% of the operations as elements.
    let lf = f(row("80% add, all local", "ORSet"), "load_factor");
    assert!((lf - 0.6).abs() < 0.02, "{lf}");
    let lf = f(row("51% add, 50-50 split", "ORCF 4"), "load_factor");
    assert!((lf - 0.02).abs() < 0.01, "{lf}");
}
