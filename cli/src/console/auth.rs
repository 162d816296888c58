//! The console's access rule and CSRF token.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use subtle::ConstantTimeEq;

use super::{view, Console, BASE};

/// The cookie the login form sets (HttpOnly, SameSite=Strict, Path=/console).
pub(super) const COOKIE: &str = "einmal_console";
/// Shortest token accepted: a guessable token is no protection.
pub(super) const MIN_TOKEN_LEN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(
        "the console on {0} is reachable from other machines: give a token \
         (--token or EINMAL_CONSOLE_TOKEN, at least 16 characters), or bind to 127.0.0.1"
    )]
    Required(SocketAddr),
    #[error("the console token is empty")]
    Empty,
    #[error("the console token is too short (at least 16 characters)")]
    TooShort,
}

/// 32 random bytes, hex.
pub(super) fn random_token() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// Equal in constant time (the length is not secret).
pub(super) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The token a request presents: the bearer header, else the cookie.
fn presented(headers: &HeaderMap) -> Option<String> {
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(bearer.trim().to_owned());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// Every page but the login: with a token configured, the request must present it.
pub(super) async fn require_token(
    State(console): State<Arc<Console>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &console.token else {
        return next.run(request).await;
    };
    match presented(request.headers()) {
        Some(given) if same(&given, token) => next.run(request).await,
        given => {
            let status = StatusCode::UNAUTHORIZED;
            let message = if given.is_some() {
                "wrong console token"
            } else {
                "this console needs its token: log in"
            };
            if view::wants_html(request.headers()) {
                (
                    status,
                    view::page(&console, "Log in", login_markup(Some(message))),
                )
                    .into_response()
            } else {
                view::json_error(status, "unauthorized", message)
            }
        }
    }
}

fn login_markup(message: Option<&str>) -> maud::Markup {
    html! {
        @if let Some(m) = message { p.error { (m) } }
        form method="post" action={ (BASE) "/login" } {
            label { "Token " input type="password" name="token" autocomplete="current-password"; }
            " " button type="submit" { "Log in" }
        }
    }
}

pub(super) async fn login_form(State(console): State<Arc<Console>>) -> Response {
    view::page(&console, "Log in", login_markup(None)).into_response()
}

/// POST /console/login: a right token sets the cookie and goes to the overview.
pub(super) async fn login(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let token = form_urlencoded::parse(body.as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned());
    let Some(expected) = &console.token else {
        return Redirect::to(BASE).into_response();
    };
    match token {
        Some(given) if same(&given, expected) => {
            let cookie = format!("{COOKIE}={given}; HttpOnly; SameSite=Strict; Path={BASE}");
            ([(header::SET_COOKIE, cookie)], Redirect::to(BASE)).into_response()
        }
        _ => {
            let status = StatusCode::UNAUTHORIZED;
            if view::wants_html(&headers) {
                (
                    status,
                    view::page(
                        &console,
                        "Log in",
                        login_markup(Some("wrong console token")),
                    ),
                )
                    .into_response()
            } else {
                view::json_error(status, "unauthorized", "wrong console token")
            }
        }
    }
}
