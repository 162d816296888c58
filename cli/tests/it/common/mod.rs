//! Helpers the CLI scenario families share (one test binary, `cli/tests/it/main.rs`).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod stack;

/// The repository root: `einmal.toml` and `events/` are read from there.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Run the built `einmal` in the repository root and wait for it.
pub fn einmal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_einmal"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("einmal runs")
}

pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// One HTTP/1.1 request over a plain socket (no client crate needed for this).
pub fn http(method: &str, addr: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    http_host(method, addr, addr, path, headers, body)
}

/// [`http`] with the `Host` header given (a rebinding page's name, a proxy's).
pub fn http_host(
    method: &str,
    addr: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut s = TcpStream::connect(addr).expect("the server answers");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok());
    Reply {
        status: status.unwrap_or_else(|| panic!("not HTTP: {head}")),
        head: head.to_owned(),
        body: body.to_owned(),
    }
}
