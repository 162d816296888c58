//! What every console request passes before a page sees it, and what every answer
//! carries:
//!
//! - **Host** ([`Hosts`]): only the names the console is reached by on purpose: the
//!   bound address, `127.0.0.1`, `localhost` and `[::1]` on the bound port (on a bind
//!   to every interface, any IP literal on that port: an IP literal cannot be
//!   rebound), and the names given with `--console-host`. Anything else is a 421 and
//!   nothing runs: a page on attacker.example whose name is rebound to 127.0.0.1
//!   reaches the console with `Host: attacker.example`.
//! - **Cross-site writes**: a request that is not GET/HEAD/OPTIONS whose `Origin` is
//!   not this origin, or whose `Sec-Fetch-Site` is `cross-site` / `same-site`, is a
//!   403 and nothing runs. `Origin: null` (what a browser sends for a form under
//!   `Referrer-Policy: no-referrer`) passes only with `Sec-Fetch-Site: same-origin`.
//!   A client that sends neither (curl, scripts) is no browser to forge for and goes
//!   on to the CSRF token and the access rule.
//! - **Body**: a form body must arrive whole within the body timeout and fit
//!   [`MAX_FORM_BYTES`] (408 / 413).
//! - **Headers** on every answer: `Content-Security-Policy` (nothing but the inline
//!   style sheet, by its hash; forms to this origin only; no framing),
//!   `X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff`,
//!   `Referrer-Policy: no-referrer`, `Cache-Control: no-store` (pages show bodies).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use maud::html;
use sha2::{Digest, Sha256};

use super::view;

/// The largest console form body (a bulk replay's fields are far below it).
pub(super) const MAX_FORM_BYTES: usize = 64 << 10;

/// A `--console-host` value that is not a host name (with an optional port).
#[derive(Debug, thiserror::Error)]
#[error("--console-host {0:?}: give a host name, optionally with :port (e.g. console.example.com or console.example.com:8443)")]
pub struct HostNameError(String);

/// A Host (or Origin authority) split: the name lowercased (an IPv6 literal keeps its
/// brackets) and the port if one was given.
fn split_authority(value: &str) -> Option<(String, Option<u16>)> {
    let value = value.trim();
    let (name, port) = if let Some(rest) = value.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        inside.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?.parse::<u16>().ok()?),
        };
        (format!("[{inside}]"), port)
    } else {
        match value.split_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port.parse::<u16>().ok()?)),
            None => (value.to_owned(), None),
        }
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    let ok = !name.is_empty()
        && (name.starts_with('[') || name.chars().all(plain))
        && !name.starts_with('.');
    ok.then(|| (name.to_ascii_lowercase(), port))
}

/// The name as an IP address, when it is a literal.
fn ip_literal(name: &str) -> Option<IpAddr> {
    name.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// The Host values the console answers to.
#[derive(Debug, Clone)]
pub(super) struct Hosts {
    port: u16,
    /// Names on the bound port.
    local: Vec<String>,
    /// Bound to every interface: any IP literal on the bound port.
    any_ip: bool,
    /// `--console-host`: a name without a port matches on any port.
    configured: Vec<(String, Option<u16>)>,
}

impl Hosts {
    /// The names of a console bound to `bound`; `configured` was checked with
    /// [`check_host_names`] at start (a name that is not one matches nothing).
    pub(super) fn new(bound: SocketAddr, configured: &[String]) -> Hosts {
        let bound_name = match bound.ip() {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let configured = configured
            .iter()
            .filter_map(|c| split_authority(c))
            .collect();
        Hosts {
            port: bound.port(),
            local: vec![
                "127.0.0.1".into(),
                "localhost".into(),
                "[::1]".into(),
                bound_name,
            ],
            any_ip: bound.ip().is_unspecified(),
            configured,
        }
    }

    /// Whether a request's `Host` value is one of ours. Without a port it is port 80
    /// (plain HTTP) for the bound names; a configured name without a port matches any.
    pub(super) fn allows(&self, host: &str) -> bool {
        let Some((name, port)) = split_authority(host) else {
            return false;
        };
        let on_bound_port = port.unwrap_or(80) == self.port;
        (on_bound_port
            && (self.local.contains(&name) || (self.any_ip && ip_literal(&name).is_some())))
            || self
                .configured
                .iter()
                .any(|(n, p)| *n == name && p.is_none_or(|p| Some(p) == port))
    }
}

/// Validate `--console-host` values at start (a usage error).
pub fn check_host_names(names: &[String]) -> Result<(), HostNameError> {
    for name in names {
        split_authority(name).ok_or_else(|| HostNameError(name.clone()))?;
    }
    Ok(())
}

/// What the guard needs: the host names and the form body's deadline.
pub(super) struct Guard {
    pub(super) hosts: Hosts,
    pub(super) body_timeout: Duration,
}

/// `style-src` allows the inline style sheet by its SHA-256, nothing else.
static CSP: LazyLock<HeaderValue> = LazyLock::new(|| {
    let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(view::STYLE));
    HeaderValue::from_str(&format!(
        "default-src 'none'; style-src 'sha256-{hash}'; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'"
    ))
    .expect("a valid header value")
});

fn harden(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, CSP.clone());
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn refuse(headers: &HeaderMap, status: StatusCode, code: &str, message: &str) -> Response {
    if view::wants_html(headers) {
        let body = html! { p.error { (message) } };
        (
            status,
            view::public_page(status.canonical_reason().unwrap_or("Refused"), body),
        )
            .into_response()
    } else {
        view::json_error(status, code, message)
    }
}

/// Whether `origin` (`scheme://host[:port]`) is the origin of a request to `host`.
/// The scheme only sets the default port: behind a TLS proxy the browser's origin is
/// https while the console hears plain HTTP, and no other server can answer on the
/// console's own host and port.
fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return false,
    };
    match (split_authority(authority), split_authority(host)) {
        (Some((o_name, o_port)), Some((h_name, h_port))) => {
            o_name == h_name && o_port.unwrap_or(default) == h_port.unwrap_or(default)
        }
        _ => false,
    }
}

/// Why a state-changing request is refused as cross-site, if it is.
fn cross_site(headers: &HeaderMap, host: &str) -> Option<&'static str> {
    let fetch_site = headers
        .get("sec-fetch-site")
        .map(|v| v.to_str().unwrap_or("?").to_ascii_lowercase());
    if let Some(site) = &fetch_site {
        if site != "same-origin" && site != "none" {
            return Some("a request from another site may not change anything here");
        }
    }
    let origin = headers.get(header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("?").trim();
    if origin == "null" {
        return (fetch_site.as_deref() != Some("same-origin"))
            .then_some("a request of an unknown origin may not change anything here");
    }
    (!same_origin(origin, host))
        .then_some("a request from another origin may not change anything here")
}

/// The console's guard (see the module's description), outermost on its routes.
pub(super) async fn guard(
    State(guard): State<Arc<Guard>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    // An absolute-form target names the host too: both must be ours.
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let target_ok = request
        .uri()
        .authority()
        .is_none_or(|a| guard.hosts.allows(a.as_str()));
    let Some(host) = host.filter(|h| target_ok && guard.hosts.allows(h)) else {
        return harden(refuse(
            headers,
            StatusCode::MISDIRECTED_REQUEST,
            "unknown_host",
            "this console does not answer to that host name; behind a reverse proxy, \
             give its name with --console-host",
        ));
    };
    let method = request.method();
    let writes = !(method == Method::GET || method == Method::HEAD || method == Method::OPTIONS);
    if writes {
        if let Some(why) = cross_site(headers, &host) {
            return harden(refuse(headers, StatusCode::FORBIDDEN, "cross_site", why));
        }
    }
    let too_large = || {
        harden(refuse(
            headers,
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "the form is too large",
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if writes && declared.is_some_and(|n| n > MAX_FORM_BYTES as u64) {
        // Refused before a byte of it is read.
        return too_large();
    }
    let request = if writes {
        let (parts, body) = request.into_parts();
        match tokio::time::timeout(
            guard.body_timeout,
            axum::body::to_bytes(body, MAX_FORM_BYTES),
        )
        .await
        {
            Ok(Ok(bytes)) => Request::from_parts(parts, Body::from(bytes)),
            Ok(Err(_)) => {
                return harden(refuse(
                    &parts.headers,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    "the form is too large",
                ))
            }
            Err(_) => {
                return harden(refuse(
                    &parts.headers,
                    StatusCode::REQUEST_TIMEOUT,
                    "timeout",
                    "the form did not arrive in time",
                ))
            }
        }
    } else {
        request
    };
    harden(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_bound_names_and_the_configured_ones_pass() {
        let hosts = Hosts::new(
            "127.0.0.1:8790".parse().unwrap(),
            &["Console.Example.com".into(), "proxy.internal:8443".into()],
        );
        for ok in [
            "127.0.0.1:8790",
            "localhost:8790",
            "LOCALHOST:8790",
            "[::1]:8790",
            "console.example.com",
            "console.example.com:443",
            "proxy.internal:8443",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for refused in [
            "attacker.example:8790",
            "attacker.example",
            "127.0.0.1:8791",
            "127.0.0.1",
            "10.0.0.5:8790",
            "proxy.internal:8444",
            "proxy.internal",
            "localhost:8790@attacker.example",
            "",
            "[::1",
        ] {
            assert!(!hosts.allows(refused), "{refused}");
        }
        // Every interface: an IP literal cannot be rebound, a name must be configured.
        let any = Hosts::new("0.0.0.0:8790".parse().unwrap(), &[]);
        assert!(any.allows("10.0.0.5:8790") && any.allows("[2001:db8::1]:8790"));
        assert!(!any.allows("intranet-box:8790") && !any.allows("10.0.0.5:80"));
        assert!(check_host_names(&["http://x".into()]).is_err());
        assert!(check_host_names(&["a.example/path".into()]).is_err());
    }

    #[test]
    fn a_cross_site_write_is_named() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_static(v));
            }
            h
        };
        let host = "127.0.0.1:8790";
        assert!(cross_site(&headers(&[]), host).is_none());
        assert!(cross_site(&headers(&[("origin", "http://127.0.0.1:8790")]), host).is_none());
        assert!(cross_site(
            &headers(&[("origin", "null"), ("sec-fetch-site", "same-origin")]),
            host
        )
        .is_none());
        for refused in [
            headers(&[("origin", "http://attacker.example")]),
            headers(&[("origin", "http://127.0.0.1")]),
            headers(&[("origin", "http://127.0.0.1:8791")]),
            headers(&[("origin", "null")]),
            headers(&[("sec-fetch-site", "cross-site")]),
            headers(&[("sec-fetch-site", "same-site")]),
            headers(&[
                ("origin", "http://127.0.0.1:8790"),
                ("sec-fetch-site", "cross-site"),
            ]),
        ] {
            assert!(cross_site(&refused, host).is_some(), "{refused:?}");
        }
        // Behind a TLS proxy: https on the default port.
        assert!(cross_site(
            &headers(&[("origin", "https://console.example.com")]),
            "console.example.com"
        )
        .is_none());
    }

    #[test]
    fn the_style_hash_is_of_the_inline_sheet() {
        let csp = CSP.to_str().unwrap().to_owned();
        let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(view::STYLE));
        assert!(csp.contains(&format!("style-src 'sha256-{hash}'")), "{csp}");
        assert!(csp.starts_with("default-src 'none'"));
    }
}
