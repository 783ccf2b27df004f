//! A short run of `zipcache bench hostile` (the long form is `scripts/hostile.sh`): a few
//! well-behaved clients beside every kind of hostile one, scaled down to seconds; the
//! driver must produce its RSS series, plot and summary, and see no wrong value.

use std::process::Command;

#[test]
fn a_short_hostile_run_reports() {
    let out = std::env::temp_dir().join(format!("zipcache-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_zipcache"))
        .args(["bench", "hostile", "--duration", "4", "--clients", "8"])
        .args(["--keys", "2000", "--amplify", "3", "--mget-keys", "1000"])
        .args(["--hostile", "1", "--ssd-size", "128MiB", "--think-ms", "5"])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("zipcache bench hostile");
    let said =
        String::from_utf8_lossy(&run.stdout).to_string() + &String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{}: {said}", run.status);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).expect("summary.json"))
            .expect("summary is JSON");
    assert_eq!(summary["wrong_values"], 0, "{said}");
    assert_eq!(summary["server_alive"], true, "{said}");
    assert_eq!(summary["stop"], "exit status: 0", "{said}");
    assert!(summary["ops"].as_u64().unwrap() > 0, "{said}");
    assert!(summary["hostile_requests"].as_u64().unwrap() > 0, "{said}");
    let csv = std::fs::read_to_string(out.join("rss.csv")).expect("rss.csv");
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert!(rows.len() >= 4, "one sample a second: {csv}");
    assert!(rows.iter().all(|r| {
        r.split(',')
            .nth(1)
            .is_some_and(|v| v.parse::<u64>().is_ok())
    }));
    let png = std::fs::read(out.join("rss.png")).expect("rss.png");
    assert_eq!(&png[1..4], b"PNG");
    let _ = std::fs::remove_dir_all(&out);
}
