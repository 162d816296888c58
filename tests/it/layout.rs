//! Source scans that keep one home per concern: the reference domain is reached only
//! through the binaries' wiring (a user's own domain crate needs none of it), and no
//! library file mixes two storage technologies.

use std::path::{Path, PathBuf};

/// The workspace root (the tests crate sits one level below it).
pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Every `.rs` file below `dir`, as paths relative to the workspace.
pub(crate) fn rust_files(dir: &str) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("source folder is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = workspace();
    let mut files = Vec::new();
    walk(&root.join(dir), &mut files);
    let mut names: Vec<String> = files
        .iter()
        .map(|p| {
            p.strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no Rust files under {dir}");
    names
}

/// The file's production code: `//` comments removed (doc links may name anything), and
/// its unit tests (from `#[cfg(test)]` on), which wire what they test like a binary does.
fn code(path: &str) -> String {
    let text = std::fs::read_to_string(workspace().join(path)).expect("source is readable");
    text.lines()
        .take_while(|line| line.trim() != "#[cfg(test)]")
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether code names the reference domain by path (`domain::reference`, `reference::X`).
fn names_reference_domain(code: &str) -> bool {
    code.contains("domain::reference") || code.contains("reference::")
}

/// Whether code uses a crate whose name starts with `prefix` by path (`prefix…::`), not
/// merely naming it in a string such as a log filter (`aws_sdk_dynamodb=warn`).
fn uses_crate(code: &str, prefix: &str) -> bool {
    code.match_indices(prefix).any(|(at, _)| {
        let rest = &code[at + prefix.len()..];
        let name_end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        rest[name_end..].starts_with("::")
    })
}

/// The storage technologies a file's code uses.
fn technologies(code: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    if ["aws_sdk_", "aws_config", "aws_smithy_"]
        .iter()
        .any(|p| uses_crate(code, p))
    {
        found.push("aws");
    }
    if uses_crate(code, "rusqlite") {
        found.push("sqlite");
    }
    if ["tokio_postgres", "deadpool_postgres"]
        .iter()
        .any(|p| uses_crate(code, p))
    {
        found.push("postgres");
    }
    found
}

/// Binaries' wiring that may name the reference domain besides the `main.rs` files: the
/// CLI commands that show the reference domain's business tables (orders, stock). The
/// entry points (`processor::run`, `reconciler::run`, `einmal_cli::serve::run`) take
/// the domain as a parameter.
const WIRING: &[&str] = &["cli/src/business.rs"];

#[test]
fn the_scanners_see_what_they_look_for() {
    assert!(names_reference_domain(
        "use crate::domain::reference::Order;"
    ));
    assert!(names_reference_domain(
        "let d = reference::ReferenceDomain::new();"
    ));
    assert!(!names_reference_domain(
        "use crate::domain::state::StateStore;"
    ));
    let both = "use aws_sdk_dynamodb::Client;\nuse rusqlite::Connection;";
    assert_eq!(technologies(both), ["aws", "sqlite"]);
    assert_eq!(
        technologies("use rusqlite::{params, Connection};"),
        ["sqlite"]
    );
    assert!(technologies("const TARGET: &str = \"aws_sdk_dynamodb=warn\";").is_empty());
    assert_eq!(
        technologies("use deadpool_postgres::Pool;\nuse tokio_postgres::NoTls;"),
        ["postgres"]
    );
}

#[test]
fn only_the_reference_domain_and_the_binaries_wiring_name_the_reference_domain() {
    let mut offenders = Vec::new();
    let mut files = rust_files("shared/src");
    for crate_dir in [
        "functions/receiver",
        "functions/processor",
        "functions/sweeper",
        "functions/reconciler",
    ] {
        files.extend(rust_files(&format!("{crate_dir}/src")));
    }
    files.extend(rust_files("cli/src"));
    for file in files {
        let allowed = file.starts_with("shared/src/domain/reference/")
            || file.ends_with("/src/main.rs")
            || WIRING.contains(&file.as_str());
        let mut code = code(&file);
        if file == "shared/src/domain/mod.rs" {
            code = code.replace("pub mod reference;", "");
        }
        if !allowed && names_reference_domain(&code) {
            offenders.push(file);
        }
    }
    assert!(
        offenders.is_empty(),
        "these files reach into domain::reference (ask through a port instead): {offenders:?}"
    );
}

/// A user's domain crate (`examples/`) builds its processor and `serve` from the
/// library's entry points alone: not even its `main.rs` names the reference domain.
#[test]
fn a_users_own_domain_crate_needs_nothing_of_the_reference_domain() {
    let examples = std::fs::read_dir(workspace().join("examples")).expect("examples/");
    let mut scanned = 0;
    for entry in examples {
        let dir = entry.expect("directory entry").path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for file in rust_files(&format!("examples/{name}/src")) {
            assert!(
                !names_reference_domain(&code(&file)),
                "{file} reaches into domain::reference: a user's crate must not need it"
            );
            scanned += 1;
        }
    }
    assert!(scanned > 0, "no example crate scanned");
}

#[test]
fn no_library_file_mixes_aws_and_sqlite_and_each_lives_in_its_folder() {
    for file in rust_files("shared/src") {
        let used = technologies(&code(&file));
        assert!(used.len() < 2, "{file} mixes technologies: {used:?}");
        if used.contains(&"aws") {
            assert!(
                file.starts_with("shared/src/adapters/aws/"),
                "{file} uses the AWS SDK outside adapters/aws/"
            );
        }
        if used.contains(&"sqlite") {
            assert!(
                file.starts_with("shared/src/adapters/embedded/"),
                "{file} uses rusqlite outside adapters/embedded/"
            );
        }
        if used.contains(&"postgres") {
            assert!(
                file.starts_with("shared/src/adapters/postgres/"),
                "{file} uses the PostgreSQL client outside adapters/postgres/"
            );
        }
    }
}

/// What loads an AWS SDK config (the credential and region chains; on Lambda the
/// environment, elsewhere files and IMDS too): cold-start work to do once.
const SDK_CONFIG_LOADS: &[&str] = &["load_defaults(", "aws_config::defaults(", "load_from_env("];

#[test]
fn each_lambda_loads_one_sdk_config_that_every_client_shares() {
    // The library has one loader, `AwsStore::from_env`; every other constructor takes
    // the loaded `SdkConfig`.
    let mut loaders = Vec::new();
    for file in rust_files("shared/src") {
        let code = code(&file);
        for load in SDK_CONFIG_LOADS {
            loaders.extend(code.matches(load).map(|_| file.clone()));
        }
    }
    assert_eq!(
        loaders,
        ["shared/src/adapters/aws/mod.rs"],
        "SDK config loaders"
    );
    let store = code("shared/src/adapters/aws/mod.rs");
    let from_env = store
        .find("pub async fn from_env()")
        .expect("AwsStore::from_env");
    let body = &store[from_env..];
    let body = &body[..body.find("\n    }").expect("end of from_env")];
    assert!(
        body.contains("load_defaults("),
        "the loader is AwsStore::from_env"
    );

    for function in ["receiver", "processor", "sweeper", "reconciler"] {
        let code: String = rust_files(&format!("functions/{function}/src"))
            .iter()
            .map(|file| code(file))
            .collect();
        assert_eq!(
            code.matches("AwsStore::from_env()").count(),
            1,
            "{function} loads its SDK config once"
        );
        for load in SDK_CONFIG_LOADS {
            assert!(!code.contains(load), "{function} calls {load} itself");
        }
        // One outbound HTTPS client, cloned into what needs one (the roots are read
        // once per process anyway: `https::tls_config`).
        assert!(
            code.matches("HttpsClient::new()").count() <= 1,
            "{function} builds more than one HTTPS client"
        );
    }
}
