//! The demo's HTML report, opened in a real browser: headless Chromium (Debian's `chromium`)
//! parses the page and takes a screenshot. Ignored by default, since a fresh machine has no
//! browser; `.ci/run` installs Chromium and runs it (`cargo test --test demo report:: --
//! --ignored`). `CHROMIUM` names the binary (default `/usr/bin/chromium`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use vmss_capacity_controller::cli::DemoArgs;
use vmss_capacity_controller::demo;

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 1400;

fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/usr/bin/chromium".into())
}

/// Chromium with the flags a closed network and a root user need; `what` is `--dump-dom` or
/// `--screenshot=FILE`.
fn run_chromium(profile: &Path, what: &str, page: &Path) -> String {
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--window-size={WIDTH},{HEIGHT}"),
            what,
            &format!("file://{}", page.display()),
        ])
        .output()
        .unwrap_or_else(|e| panic!("starting {}: {e}", chromium().display()));
    assert!(
        out.status.success(),
        "chromium {what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The PNG's width and height, from its IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

fn screenshot(profile: &Path, page: &Path, png: &Path) -> Vec<u8> {
    run_chromium(profile, &format!("--screenshot={}", png.display()), page);
    std::fs::read(png).expect("chromium wrote the screenshot")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium: .ci/run installs it and runs this"]
async fn the_demo_report_renders_in_headless_chromium_with_its_charts_and_summary() {
    let dir = std::env::temp_dir().join(format!("vmss-demo-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("report.html");
    let args = DemoArgs {
        duration: Duration::from_secs(14),
        no_etag: false,
        scale_sets: 3,
        rival_interval: Duration::from_millis(700),
        seed: 7,
        quiet: true,
        plan: false,
        aks: false,
        kubernetes: false,
        pods: true,
        cost: false,
        stabilization_window: None,
        max_bulk_soft_taint_count: None,
        empty_first: None,
        consolidation_delay_after_add: None,
        disrupt_jobs: false,
        ready_after: None,
        deletion_cost_hints: None,
        report: Some(page.clone()),
        report_defaulted: false,
    };
    let r = demo::pods::run(&args).await.expect("the demo runs");
    assert!(r.rival_writes > 0, "a run worth drawing: {r:?}");

    // What the browser parsed: the chart's elements are in the SVG namespace's DOM.
    let dom = run_chromium(&dir.join("profile"), "--dump-dom", &page);
    assert_eq!(dom.matches("<svg").count(), 1, "one timeline, one chart");
    // A line per group's capacity and Ready nodes (six groups) and the pending pods (13 series),
    // each with a point per sample (14 s at 200 ms: about 70); the legend's samples have 2
    // points each.
    let long_lines = dom
        .split("<polyline")
        .skip(1)
        .filter(|el| {
            el.split_once("points=\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .is_some_and(|(points, _)| points.split_whitespace().count() >= 50)
        })
        .count();
    assert_eq!(long_lines, 13, "13 sampled series drawn");
    // A circle per rival write that landed in its own sample, a triangle per controller write.
    assert!(dom.matches("<circle").count() >= 5, "the rival's marks");
    assert!(
        dom.matches("<polygon").count() >= 1,
        "the controller's marks"
    );
    for label in [
        "general capacity",
        "gpu Ready nodes",
        "zone3 capacity",
        "pending pods",
        "412 answers",
    ] {
        assert!(dom.contains(label), "{label:?} not on the page");
    }
    assert!(
        dom.contains("<td>lost updates</td><td>0</td>"),
        "the summary table"
    );
    // The caption counts the marks drawn: the rival's writes as the demo counted them (the
    // recorder starts just after the rival, so it may miss its first one or two).
    let caption = dom
        .split("rival writes ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse::<u64>().ok())
        .expect("the caption counts the rival's writes");
    assert!(
        caption <= r.rival_writes && caption + 2 >= r.rival_writes,
        "marks {caption} against {} rival writes",
        r.rival_writes
    );

    // What it looks like: a screenshot of the asked size, with far more in it than an empty
    // page of the same size (the same browser, the same run).
    let png = screenshot(&dir.join("profile"), &page, &dir.join("report.png"));
    let blank_page = dir.join("blank.html");
    std::fs::write(&blank_page, "<!doctype html><html><body></body></html>").unwrap();
    let blank = screenshot(&dir.join("profile"), &blank_page, &dir.join("blank.png"));
    assert_eq!(png_size(&png), (WIDTH, HEIGHT));
    assert_eq!(png_size(&blank), (WIDTH, HEIGHT));
    println!(
        "report screenshot {} bytes, an empty page {} bytes ({}x{})",
        png.len(),
        blank.len(),
        WIDTH,
        HEIGHT
    );
    assert!(
        png.len() > 10 * blank.len(),
        "the screenshot is nearly empty: {} bytes against {} for a blank page",
        png.len(),
        blank.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
