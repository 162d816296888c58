//! The receiver Lambda links only what it runs: the core and the AWS adapter. The
//! library's other technologies (the embedded store on SQLite, the PostgreSQL
//! destination, the EventBridge and Lambda destinations) sit behind features the
//! receiver does not enable, so the compiler holds the seam: code of the core that
//! reached into one of them would not build for the receiver.

use std::process::Command;

use crate::layout::workspace;

/// Packages the receiver must not depend on, each with the technology it stands for.
const NOT_IN_THE_RECEIVER: &[(&str, &str)] = &[
    ("rusqlite", "the embedded store"),
    ("tokio-postgres", "the PostgreSQL destination"),
    ("deadpool-postgres", "the PostgreSQL destination"),
    ("aws-sdk-eventbridge", "the EventBridge destination"),
    ("aws-sdk-lambda", "the Lambda destination"),
];

/// The package names in `cargo tree -p <package> -e normal` (resolved as a build of
/// that package alone resolves its features).
fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace())
        .args(["tree", "--offline", "-p", package, "-e", "normal"])
        .args(["--prefix", "none", "--format", "{p}"])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_receiver_links_no_sqlite_postgres_eventbridge_or_lambda_sdk() {
    let receiver = normal_dependencies("receiver");
    // The scan sees what it looks for: the receiver does link the core and the AWS
    // adapter's SDKs, and the processor every technology.
    for present in [
        "einmal-shared",
        "aws-sdk-dynamodb",
        "aws-sdk-sqs",
        "aws-sdk-ssm",
    ] {
        assert!(
            receiver.iter().any(|p| p == present),
            "receiver lacks {present}"
        );
    }
    let processor = normal_dependencies("processor");
    for (package, _) in NOT_IN_THE_RECEIVER {
        assert!(
            processor.iter().any(|p| p == package),
            "processor lacks {package}"
        );
    }
    let linked: Vec<String> = NOT_IN_THE_RECEIVER
        .iter()
        .filter(|(package, _)| receiver.iter().any(|p| p == package))
        .map(|(package, what)| format!("{package} ({what})"))
        .collect();
    assert!(
        linked.is_empty(),
        "the receiver links {}",
        linked.join(", ")
    );
}
