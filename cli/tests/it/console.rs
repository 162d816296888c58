//! `einmal console` and `einmal serve`'s /console through the real binary: the token
//! rule and bad input over plain HTTP, then the whole operator flow in a real headless
//! Chromium driven through WebDriver (chromedriver): search finds an event, a dead
//! letter is replayed from the page with a reason and its effect is applied once, the
//! audit log shows it. Screenshots go to `target/console-screenshots/`.
//!
//! Without chromium/chromedriver the browser test says so and passes, unless
//! `EINMAL_REQUIRE_CHROMIUM=1` (as `tests/run.sh` sets), where it fails.

use crate::common;

use common::{einmal, http, http_host, repo, Reply};

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(addr: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed (by its own handle) when the test ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_einmal(args: &[&str]) -> Proc {
    spawn_einmal_with(args, &[])
}

fn spawn_einmal_with(args: &[&str], env: &[(&str, &str)]) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_einmal"))
            .args(args)
            .envs(env.iter().copied())
            .current_dir(repo())
            .env("RUST_LOG", "warn")
            .env_remove("EINMAL_CONSOLE_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("einmal starts"),
    )
}

/// A response header's value (the first of that name).
fn header(r: &Reply, name: &str) -> Option<String> {
    r.head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// `einmal_console=<id>` from a login's `Set-Cookie`.
fn session_cookie(login: &Reply) -> String {
    header(login, "set-cookie")
        .expect("a cookie is set")
        .split(';')
        .next()
        .unwrap()
        .trim()
        .to_owned()
}

fn json(r: &Reply) -> serde_json::Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body))
}

const TOKEN: &str = "console-test-token-0123456789";

#[test]
fn a_non_loopback_console_needs_a_token_and_bad_input_is_a_4xx_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();

    // Reachable from elsewhere without a token: refused before anything is served.
    let open = Command::new(env!("CARGO_BIN_EXE_einmal"))
        .args(["console", "--addr", "0.0.0.0:0", "--data-dir", data_dir])
        .env_remove("EINMAL_CONSOLE_TOKEN")
        .output()
        .unwrap();
    assert_eq!(open.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&open.stderr).contains("give a token"));
    let short = einmal(&[
        "console",
        "--addr",
        "0.0.0.0:0",
        "--token",
        "short",
        "--data-dir",
        data_dir,
    ]);
    assert_eq!(short.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&short.stderr).contains("too short"));

    // With a token (here on loopback, so the test can reach it): every page asks for it.
    let addr = format!("127.0.0.1:{}", free_port());
    let _console = spawn_einmal(&[
        "console",
        "--addr",
        &addr,
        "--token",
        TOKEN,
        "--data-dir",
        data_dir,
    ]);
    wait_for_port(&addr, "einmal console");
    let bearer = format!("Bearer {TOKEN}");
    let with_token = [("Authorization", bearer.as_str())];

    let none = http("GET", &addr, "/console/events", &[], "");
    assert_eq!(none.status, 401);
    assert_eq!(json(&none)["error"], "unauthorized");
    let wrong = http(
        "GET",
        &addr,
        "/console/events",
        &[("Authorization", "Bearer console-test-token-0123456788")],
        "",
    );
    assert_eq!(wrong.status, 401);
    assert_eq!(json(&wrong)["message"], "wrong console token");
    let html = http(
        "GET",
        &addr,
        "/console/audit",
        &[("Accept", "text/html")],
        "",
    );
    assert_eq!(html.status, 401);
    assert!(
        html.body.contains("name=\"token\""),
        "a browser gets the login form"
    );
    assert_eq!(
        http("GET", &addr, "/console/events", &with_token, "").status,
        200
    );

    // The login form sets the cookie; the cookie then opens the pages.
    let bad_login = http("POST", &addr, "/console/login", &[], "token=nope");
    assert_eq!(bad_login.status, 401);
    let login = http(
        "POST",
        &addr,
        "/console/login",
        &[],
        &format!("token={TOKEN}"),
    );
    assert_eq!(login.status, 303, "{}", login.head);
    let cookie_line = header(&login, "set-cookie").expect("a cookie is set");
    assert!(cookie_line.contains("HttpOnly") && cookie_line.contains("SameSite=Strict"));
    let cookie = session_cookie(&login);
    assert_eq!(
        http("GET", &addr, "/console", &[("Cookie", &cookie)], "").status,
        200
    );

    // Bad input: a 4xx naming the problem, as JSON for a non-browser client.
    for (path, status, needle) in [
        ("/console/events?state=bogus", 400, "unknown state"),
        ("/console/events?cursor=zzz", 400, "invalid cursor"),
        ("/console/events?since=yesterday", 400, "RFC 3339"),
        ("/console/events?limit=0", 400, "limit"),
        ("/console/events?typo=1", 400, "unknown parameter"),
        ("/console/events?state=queued&state=completed", 400, "twice"),
        ("/console/event", 400, "required"),
        ("/console/event?id=stripe%23t1%23evt_nope", 404, "no event"),
        ("/console/nope", 404, "no such console page"),
    ] {
        let r = http("GET", &addr, path, &with_token, "");
        assert_eq!(r.status, status, "{path}: {}", r.body);
        let message = json(&r)["message"].as_str().unwrap_or_default().to_owned();
        assert!(message.contains(needle), "{path}: {message}");
    }
    // A POST without the page's CSRF token is refused; with it, reason and operator
    // are still required.
    let forged = http(
        "POST",
        &addr,
        "/console/replay",
        &with_token,
        "id=a%23b%23c&reason=r&operator=o&csrf=x",
    );
    assert_eq!(forged.status, 403);
    let page = http("GET", &addr, "/console/dead-letters", &with_token, "");
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the form carries the CSRF token")
        .to_owned();
    for (form, needle) in [
        (format!("id=a%23b%23c&operator=o&csrf={csrf}"), "reason"),
        (format!("id=a%23b%23c&reason=r&csrf={csrf}"), "operator"),
        (
            format!("reason=r&operator=o&csrf={csrf}&action=later"),
            "action",
        ),
    ] {
        let path = if form.contains("action") {
            "/console/replay-bulk"
        } else {
            "/console/replay"
        };
        let r = http("POST", &addr, path, &with_token, &form);
        assert_eq!(r.status, 400, "{form}: {}", r.body);
        assert!(
            json(&r)["message"].as_str().unwrap().contains(needle),
            "{}",
            r.body
        );
    }
    // Nothing was replayed or audited by any of it.
    let audit = einmal(&["audit", "list", "--json", "--data-dir", data_dir]);
    assert_eq!(String::from_utf8_lossy(&audit.stdout).trim(), "[]");
}

fn chromium_tools() -> Option<(PathBuf, PathBuf)> {
    let driver = PathBuf::from("/usr/bin/chromedriver");
    let browser = PathBuf::from("/usr/bin/chromium");
    (driver.exists() && browser.exists()).then_some((driver, browser))
}

fn screenshots_dir() -> PathBuf {
    let dir = repo().join("target").join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn events_in(state: &str, data_dir: &str) -> Vec<serde_json::Value> {
    let out = einmal(&[
        "events",
        "list",
        "--state",
        state,
        "--json",
        "--data-dir",
        data_dir,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn on_hand(data_dir: &str, sku: &str) -> i64 {
    let out = einmal(&[
        "inventory",
        "show",
        "--tenant",
        "demo",
        sku,
        "--json",
        "--data-dir",
        data_dir,
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    v["on_hand"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_search_finds_the_event_and_a_dead_letter_is_replayed_once_and_audited() {
    use fantoccini::{ClientBuilder, Locator};

    let Some((driver, browser)) = chromium_tools() else {
        assert!(
            std::env::var("EINMAL_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "EINMAL_REQUIRE_CHROMIUM=1 but /usr/bin/chromium or /usr/bin/chromedriver is missing"
        );
        eprintln!(
            "skipped: install chromium and chromium-driver to run the console's browser test"
        );
        return;
    };

    // `einmal serve` with its console; an order for SKUs without stock records is a
    // permanent failure: a dead letter.
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap().to_owned();
    let addr = format!("127.0.0.1:{}", free_port());
    let _serve = spawn_einmal(&["serve", "--addr", &addr, "--data-dir", &data_dir]);
    wait_for_port(&addr, "einmal serve");
    let sent = einmal(&[
        "send",
        "--provider",
        "shopify",
        "--tenant",
        "demo",
        "--topic",
        "orders/create",
        "--event",
        "events/samples/domain/shopify-orders-create.json",
        "--event-id",
        "ev-console-1",
        "--url",
        &format!("http://{addr}"),
    ]);
    assert!(stdout(&sent).starts_with("200 "), "{}", stdout(&sent));
    let key = "shopify#demo#demo.myshopify.com:orders/create:ev-console-1";
    wait_until("the order to be dead-lettered", || {
        events_in("dead_letter", &data_dir)
            .iter()
            .any(|e| e["key"] == key)
    });
    // The stock arrives; the operator replays from the console.
    for (sku, qty) in [("SKU-RED-M", "10"), ("SKU-BLUE-L", "5")] {
        let out = einmal(&[
            "inventory",
            "set",
            "--tenant",
            "demo",
            sku,
            "--on-hand",
            qty,
            "--data-dir",
            &data_dir,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let driver_port = free_port();
    let mut chromedriver = Proc(
        Command::new(&driver)
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts"),
    );
    wait_for_port(&format!("127.0.0.1:{driver_port}"), "chromedriver");
    let capabilities: serde_json::Map<String, serde_json::Value> = serde_json::from_value(serde_json::json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": browser,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000"]
        }
    }))
    .unwrap();
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a WebDriver session in chromium");
    let shots = screenshots_dir();
    let shoot = |name: &'static str| {
        let client = client.clone();
        let path = shots.join(name);
        async move {
            let png = client.screenshot().await.expect("screenshot");
            std::fs::write(&path, png).expect("screenshot saved");
        }
    };
    let base = format!("http://{addr}/console");

    // Overview, then a search by object id finds the event.
    client.goto(&base).await.unwrap();
    assert!(client.source().await.unwrap().contains("Events by state"));
    // The CSP lets the inline style sheet apply (by its hash): the header is dark.
    let header_color = client
        .execute(
            "return getComputedStyle(document.querySelector('header')).backgroundColor",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(header_color, serde_json::json!("rgb(31, 41, 55)"));
    shoot("overview.png").await;
    client.goto(&format!("{base}/events")).await.unwrap();
    client
        .find(Locator::Css("input[name=object]"))
        .await
        .unwrap()
        .send_keys("1001")
        .await
        .unwrap();
    client
        .find(Locator::Css("input[name=type]"))
        .await
        .unwrap()
        .send_keys("orders/create")
        .await
        .unwrap();
    client
        .find(Locator::Id("search-button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The results page shows the search it ran in its form.
    client
        .wait()
        .for_element(Locator::Css("input[name=object][value='1001']"))
        .await
        .unwrap();
    let found = client.find(Locator::Css("a.event")).await.unwrap();
    assert_eq!(found.text().await.unwrap(), key);
    assert!(client
        .current_url()
        .await
        .unwrap()
        .as_str()
        .contains("object=1001"));
    shoot("events-search.png").await;

    // The dead letters page: replay it with a reason and the operator's name.
    client.goto(&format!("{base}/dead-letters")).await.unwrap();
    shoot("dead-letters.png").await;
    let form = client.find(Locator::Css("form.replay")).await.unwrap();
    form.find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys("stock records seeded")
        .await
        .unwrap();
    form.find(Locator::Css("input[name=operator]"))
        .await
        .unwrap()
        .send_keys("ops-ana")
        .await
        .unwrap();
    form.find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let summary = client
        .wait()
        .for_element(Locator::Id("replay-summary"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(summary.contains("Replayed 1 of 1"), "{summary}");
    shoot("replayed.png").await;

    // The effect is applied, once: the order exists, the stock went down by the
    // order's quantities exactly once.
    wait_until("the replayed order to complete", || {
        events_in("completed", &data_dir)
            .iter()
            .any(|e| e["key"] == key)
    });
    assert_eq!(on_hand(&data_dir, "SKU-BLUE-L"), 3, "2 of 5 reserved, once");
    assert_eq!(on_hand(&data_dir, "SKU-RED-M"), 9, "1 of 10 reserved, once");
    let order = einmal(&[
        "orders",
        "show",
        "--tenant",
        "demo",
        "1001",
        "--json",
        "--data-dir",
        &data_dir,
    ]);
    assert!(
        order.status.success(),
        "{}",
        String::from_utf8_lossy(&order.stderr)
    );
    assert!(events_in("dead_letter", &data_dir).is_empty());

    // The audit log page shows the replay with its reason and operator.
    client.goto(&format!("{base}/audit")).await.unwrap();
    let reason = client
        .find(Locator::Css("table.audit td.reason"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let actor = client
        .find(Locator::Css("table.audit td.actor"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        (reason.as_str(), actor.as_str()),
        ("stock records seeded", "ops-ana")
    );
    assert!(client.source().await.unwrap().contains(key));
    shoot("audit.png").await;

    // The event's page: completed, its timeline and its body.
    client
        .find(Locator::LinkText("Events"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    client
        .wait()
        .for_element(Locator::Css("a.event"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let state = client
        .wait()
        .for_element(Locator::Id("event-state"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(state, "completed");
    let body = client
        .find(Locator::Id("body"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("SKU-BLUE-L"), "{body}");
    shoot("event.png").await;

    client.close().await.unwrap();
    let _ = chromedriver.0.kill();
}

/// `einmal serve`'s overview shows the intake counters and `PaymentWithinSlo` from
/// the same drain as `/metrics`: reading the console takes nothing from a scrape.
#[test]
fn serve_overview_shows_intake_and_payment_within_slo_and_metrics_keep_every_count() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap().to_owned();
    let addr = format!("127.0.0.1:{}", free_port());
    // `einmal send` stamps the sample's event time (Stripe `created`, days old in the
    // file) with now: within an SLI threshold of an hour however slow this machine is,
    // and outside it if it were sent as it is.
    let _serve = spawn_einmal_with(
        &["serve", "--addr", &addr, "--data-dir", &data_dir],
        &[("EINMAL_SLI_THRESHOLD_MS", "3600000")],
    );
    wait_for_port(&addr, "einmal serve");
    // The standalone note is for `einmal console`; here the figures are in the page.
    let before = http("GET", &addr, "/console", &[], "");
    assert_eq!(before.status, 200);
    assert!(before.body.contains("- (no payment event processed yet)"));
    for duplicate in ["false", "true"] {
        let sent = einmal(&[
            "send",
            "--provider",
            "stripe",
            "--tenant",
            "demo",
            "--event",
            "events/samples/domain/stripe-payment_intent.succeeded.json",
            "--event-id",
            "evt_console_slo",
            "--url",
            &format!("http://{addr}"),
        ]);
        assert!(
            stdout(&sent).contains(&format!("\"duplicate\":{duplicate}")),
            "{}",
            stdout(&sent)
        );
    }
    wait_until("the payment to be completed", || {
        events_in("completed", &data_dir)
            .iter()
            .any(|e| e["key"] == "stripe#demo#evt_console_slo")
    });
    // The processor's tally is drained when the effect is counted: read until it is in.
    let mut page = String::new();
    wait_until("the overview to count the payment", || {
        page = http("GET", &addr, "/console", &[], "").body;
        page.contains("of 1 payment events within the SLI threshold")
    });
    // The demo event counts as a live one: within the SLI threshold.
    assert!(page.contains("100.0% (1 of 1 payment events"), "{page}");
    let row = |name: &str| {
        page.split("<tr>")
            .find(|r| r.contains(name))
            .unwrap_or_else(|| panic!("{name} row: {page}"))
            .to_owned()
    };
    assert!(row("Completed since start").contains("<td>1</td>"));
    assert!(row("Dead-lettered since start").contains("<td>0</td>"));
    let bar = |label: &str| {
        page.split(&format!(">{label}</text>"))
            .nth(1)
            .and_then(|rest| rest.split("</text>").next())
            .and_then(|t| t.rsplit('>').next())
            .unwrap_or_else(|| panic!("{label} bar: {page}"))
            .to_owned()
    };
    assert_eq!(bar("accepted"), "1");
    assert_eq!(bar("duplicates"), "1");
    assert_eq!(bar("signature failures"), "0");

    // `/metrics` after the console's reads: every count is still there.
    let metrics = http("GET", &addr, "/metrics", &[], "").body;
    for line in [
        "einmal_webhooks_accepted_total 1",
        "einmal_webhooks_duplicate_total 1",
        "einmal_events_completed_total 1",
        "einmal_payment_within_slo_count 1",
        "einmal_payment_within_slo_sum 1.0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}: {metrics}");
    }
    // And the console again: since start, not since the last read.
    let again = http("GET", &addr, "/console", &[], "").body;
    assert!(again.contains("100.0% (1 of 1 payment events"), "{again}");
}

/// The CSRF token a console page's form carries.
fn csrf_of(page: &Reply) -> String {
    page.body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF token in the page: {}", page.body))
        .to_owned()
}

fn audit_records(data_dir: &str) -> Vec<serde_json::Value> {
    let out = einmal(&["audit", "list", "--json", "--data-dir", data_dir]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// A page rebound to 127.0.0.1 (Host: attacker.example) reads and changes nothing;
/// a cross-site form post changes nothing; the console's own form still replays.
#[test]
fn a_foreign_host_or_a_cross_site_post_is_refused_and_nothing_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap().to_owned();
    let addr = format!("127.0.0.1:{}", free_port());
    let _serve = spawn_einmal(&["serve", "--addr", &addr, "--data-dir", &data_dir]);
    wait_for_port(&addr, "einmal serve");
    // A dead letter to replay: an order for SKUs without stock records.
    let sent = einmal(&[
        "send",
        "--provider",
        "shopify",
        "--tenant",
        "demo",
        "--topic",
        "orders/create",
        "--event",
        "events/samples/domain/shopify-orders-create.json",
        "--event-id",
        "ev-console-host",
        "--url",
        &format!("http://{addr}"),
    ]);
    assert!(stdout(&sent).starts_with("200 "), "{}", stdout(&sent));
    let key = "shopify#demo#demo.myshopify.com:orders/create:ev-console-host";
    wait_until("the order to be dead-lettered", || {
        events_in("dead_letter", &data_dir)
            .iter()
            .any(|e| e["key"] == key)
    });
    let port = addr.rsplit(':').next().unwrap().to_owned();
    let rebound = format!("attacker.example:{port}");

    // Reading through a foreign name: refused, nothing of the store in the answer.
    for path in [
        "/console",
        "/console/dead-letters",
        "/console/login",
        "/console/",
    ] {
        let r = http_host("GET", &addr, &rebound, path, &[], "");
        assert_eq!(r.status, 421, "{path}: {}", r.head);
        assert_eq!(json(&r)["error"], "unknown_host");
        assert!(!r.body.contains("ev-console-host") && !r.body.contains("csrf"));
        assert_eq!(header(&r, "cache-control").as_deref(), Some("no-store"));
    }
    let page = http("GET", &addr, "/console/dead-letters", &[], "");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("ev-console-host"), "{}", page.body);
    let csrf = csrf_of(&page);
    let form = format!(
        "id={}&reason=attack&operator=mallory&csrf={csrf}",
        key.replace('#', "%23")
            .replace(':', "%3A")
            .replace('/', "%2F")
    );
    let bulk = format!("reason=attack&operator=mallory&csrf={csrf}&action=replay");
    // Even with the right CSRF token: a foreign Host, a foreign Origin, a cross-site
    // or same-site fetch, an opaque origin without same-origin fetch metadata.
    let same_origin = format!("http://{addr}");
    for (host, headers, status) in [
        (rebound.as_str(), vec![], 421),
        (
            rebound.as_str(),
            vec![("Origin", same_origin.as_str())],
            421,
        ),
        (
            addr.as_str(),
            vec![("Origin", "http://attacker.example")],
            403,
        ),
        (addr.as_str(), vec![("Sec-Fetch-Site", "cross-site")], 403),
        (addr.as_str(), vec![("Sec-Fetch-Site", "same-site")], 403),
        (addr.as_str(), vec![("Origin", "null")], 403),
        (
            addr.as_str(),
            vec![
                ("Origin", same_origin.as_str()),
                ("Sec-Fetch-Site", "cross-site"),
            ],
            403,
        ),
    ] {
        for (path, body) in [("/console/replay", &form), ("/console/replay-bulk", &bulk)] {
            let r = http_host("POST", &addr, host, path, &headers, body);
            assert_eq!(r.status, status, "{host} {headers:?} {path}: {}", r.body);
            assert!(!r.body.contains("Replayed"), "{}", r.body);
        }
    }
    assert!(audit_records(&data_dir).is_empty(), "nothing audited");
    assert!(
        events_in("dead_letter", &data_dir)
            .iter()
            .any(|e| e["key"] == key),
        "still a dead letter"
    );

    // The console's own form (what a browser sends for it): replayed, audited once.
    let mine = http(
        "POST",
        &addr,
        "/console/replay",
        &[
            ("Origin", "null"),
            ("Sec-Fetch-Site", "same-origin"),
            ("Accept", "text/html"),
        ],
        &form,
    );
    assert_eq!(mine.status, 200, "{}", mine.body);
    assert!(mine.body.contains("Replayed 1 of 1"), "{}", mine.body);
    let records = audit_records(&data_dir);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["actor"], "mallory");
    // A same-origin `Origin` passes too (a preview: nothing changes).
    let origin = http(
        "POST",
        &addr,
        "/console/replay-bulk",
        &[
            ("Origin", same_origin.as_str()),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        &bulk.replace("action=replay", "action=preview"),
    );
    assert_eq!(origin.status, 200, "{}", origin.body);
    assert!(origin.body.contains("replay-summary"), "{}", origin.body);

    // `/console/` is the console too.
    let slash = http("GET", &addr, "/console/", &[], "");
    assert_eq!(slash.status, 303, "{}", slash.head);
    assert_eq!(header(&slash, "location").as_deref(), Some("/console"));
}

/// Every console answer carries the CSP (the inline style sheet by its hash), no
/// framing, nosniff, no referrer and no caching, also refusals and the login form.
#[test]
fn every_console_answer_carries_the_security_headers() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _console = spawn_einmal(&[
        "console",
        "--addr",
        &addr,
        "--token",
        TOKEN,
        "--data-dir",
        data_dir,
    ]);
    wait_for_port(&addr, "einmal console");
    let bearer = format!("Bearer {TOKEN}");
    for r in [
        http("GET", &addr, "/console", &[("Authorization", &bearer)], ""),
        http("GET", &addr, "/console/events", &[], ""),
        http("GET", &addr, "/console/login", &[], ""),
        http("GET", &addr, "/console/nope", &[], ""),
        http_host("GET", &addr, "evil.example", "/console", &[], ""),
    ] {
        let csp =
            header(&r, "content-security-policy").unwrap_or_else(|| panic!("no CSP: {}", r.head));
        for part in [
            "default-src 'none'",
            "style-src 'sha256-",
            "form-action 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
        ] {
            assert!(csp.contains(part), "{part}: {csp}");
        }
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(header(&r, "x-frame-options").as_deref(), Some("DENY"));
        assert_eq!(
            header(&r, "x-content-type-options").as_deref(),
            Some("nosniff")
        );
        assert_eq!(
            header(&r, "referrer-policy").as_deref(),
            Some("no-referrer")
        );
        assert_eq!(header(&r, "cache-control").as_deref(), Some("no-store"));
    }
    // A form declared beyond 64 KiB is refused before a byte of it is read.
    let big = {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(
            format!(
                "POST /console/login HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 70000\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
        let mut line = [0u8; 12];
        s.read_exact(&mut line).unwrap();
        String::from_utf8_lossy(&line).into_owned()
    };
    assert_eq!(big, "HTTP/1.1 413");
}

/// `--host NAME` (a reverse proxy's name) is answered; an invalid one is a usage
/// error; other names stay refused.
#[test]
fn a_configured_host_name_is_answered_and_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let bad = einmal(&[
        "console",
        "--addr",
        "127.0.0.1:0",
        "--host",
        "https://console.example.com/",
        "--data-dir",
        data_dir,
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--console-host"));
    let addr = format!("127.0.0.1:{}", free_port());
    let _console = spawn_einmal(&[
        "console",
        "--addr",
        &addr,
        "--host",
        "console.example.com",
        "--console-host",
        "proxy.internal:8443",
        "--body-timeout-ms",
        "300",
        "--data-dir",
        data_dir,
    ]);
    wait_for_port(&addr, "einmal console");
    // A form that never arrives whole: 408, and the connection is given back.
    let stalled = {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(
            format!(
                "POST /console/login HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 40\r\n\r\ntoken="
            )
            .as_bytes(),
        )
        .unwrap();
        let mut line = [0u8; 12];
        s.read_exact(&mut line).unwrap();
        String::from_utf8_lossy(&line).into_owned()
    };
    assert_eq!(stalled, "HTTP/1.1 408");
    for (host, status) in [
        ("console.example.com", 200),
        ("Console.Example.com:443", 200),
        ("proxy.internal:8443", 200),
        ("proxy.internal:9000", 421),
        ("localhost", 421),
        ("example.com", 421),
    ] {
        let r = http_host("GET", &addr, host, "/console/events", &[], "");
        assert_eq!(r.status, status, "{host}: {}", r.body);
    }
    // Behind the proxy on https: the proxy's origin is this console's.
    let form = "reason=r&operator=o&csrf=stale&action=preview";
    let through_proxy = http_host(
        "POST",
        &addr,
        "console.example.com",
        "/console/replay-bulk",
        &[("Origin", "https://console.example.com")],
        form,
    );
    assert_eq!(
        through_proxy.status, 403,
        "the stale CSRF token, not the origin"
    );
    assert_eq!(json(&through_proxy)["error"], "csrf");
}

/// The cookie holds a session id, not the token; a forged or logged-out session is
/// refused; the store's detail shows only after the login; wrong tokens are
/// throttled per peer.
#[test]
fn the_session_is_not_the_token_the_login_page_hides_the_store_and_is_throttled() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _console = spawn_einmal(&[
        "console",
        "--addr",
        &addr,
        "--token",
        TOKEN,
        "--data-dir",
        data_dir,
    ]);
    wait_for_port(&addr, "einmal console");
    let html = [("Accept", "text/html")];

    // Before the login: nothing about the store.
    for path in [
        "/console/login",
        "/console",
        "/console/events",
        "/console/nope",
    ] {
        let r = http("GET", &addr, path, &html, "");
        assert!(!r.body.contains(data_dir), "{path}: {}", r.body);
        assert!(!r.body.contains("embedded"), "{path}: {}", r.body);
    }
    let login = http(
        "POST",
        &addr,
        "/console/login",
        &[],
        &format!("token={TOKEN}"),
    );
    assert_eq!(login.status, 303, "{}", login.head);
    let set = header(&login, "set-cookie").unwrap();
    let cookie = session_cookie(&login);
    let id = cookie.strip_prefix("einmal_console=").expect("the cookie");
    assert_ne!(id, TOKEN);
    assert!(!set.contains(TOKEN), "{set}");
    assert_eq!(id.len(), 64, "32 random bytes, hex: {id}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(set.contains(attribute), "{attribute}: {set}");
    }
    assert!(!set.contains("Secure"), "plain http on loopback: {set}");
    let overview = http(
        "GET",
        &addr,
        "/console",
        &[("Cookie", &cookie), html[0]],
        "",
    );
    assert_eq!(overview.status, 200);
    assert!(
        overview.body.contains(data_dir),
        "after the login: the store"
    );
    // A second login gets another session.
    let again = http(
        "POST",
        &addr,
        "/console/login",
        &[],
        &format!("token={TOKEN}"),
    );
    assert_ne!(session_cookie(&again), cookie);
    // The token itself as a cookie, or a made-up id: no session.
    for forged in [
        format!("einmal_console={TOKEN}"),
        format!("einmal_console={}", "ab".repeat(32)),
    ] {
        let r = http("GET", &addr, "/console", &[("Cookie", &forged)], "");
        assert_eq!(r.status, 401, "{forged}");
    }
    // `/console/` with the session.
    let slash = http("GET", &addr, "/console/", &[("Cookie", &cookie)], "");
    assert_eq!(slash.status, 303, "{}", slash.head);
    assert_eq!(header(&slash, "location").as_deref(), Some("/console"));

    // Logout ends the session: the same cookie is refused after it.
    let logout = http("POST", &addr, "/console/logout", &[("Cookie", &cookie)], "");
    assert_eq!(logout.status, 303, "{}", logout.head);
    assert!(header(&logout, "set-cookie").unwrap().contains("Max-Age=0"));
    let after = http("GET", &addr, "/console", &[("Cookie", &cookie)], "");
    assert_eq!(after.status, 401);
    assert_eq!(
        json(&after)["message"],
        "the session expired or is unknown: log in"
    );

    // A login from an https origin (a TLS proxy in front) gets a Secure cookie.
    let over_tls = http(
        "POST",
        &addr,
        "/console/login",
        &[("Origin", &format!("https://{addr}"))],
        &format!("token={TOKEN}"),
    );
    assert_eq!(over_tls.status, 303, "{}", over_tls.body);
    assert!(header(&over_tls, "set-cookie")
        .unwrap()
        .contains("; Secure"));

    // Five wrong tokens from this peer, then even the right one waits.
    for _ in 0..5 {
        let r = http(
            "POST",
            &addr,
            "/console/login",
            &[],
            "token=wrong-token-0123456789",
        );
        assert_eq!(r.status, 401);
    }
    let throttled = http(
        "POST",
        &addr,
        "/console/login",
        &[],
        &format!("token={TOKEN}"),
    );
    assert_eq!(throttled.status, 429, "{}", throttled.body);
    assert_eq!(json(&throttled)["error"], "throttled");
    let wait: u64 = header(&throttled, "retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert!(header(&throttled, "set-cookie").is_none(), "no session");
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        http("GET", &addr, "/console", &[("Authorization", &bearer)], "").status,
        429,
        "the bearer header is throttled too"
    );
}

fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(exit) = child.try_wait().unwrap() {
            return exit;
        }
        assert!(
            Instant::now() < deadline,
            "the process did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Standalone `einmal console`: `--config`'s secrets are masked in a shown body; a
/// peer beyond its connections is refused; SIGTERM ends it with idle connections
/// open (their idle timeout here is ten minutes).
#[test]
fn standalone_console_masks_configured_secrets_bounds_connections_and_stops_on_sigterm() {
    use std::io::{Read, Write};

    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let data_dir = data_dir.to_str().unwrap().to_owned();
    let secret = "whsec_console_mask_0123456789abcdef";
    let config = dir.path().join("tenants.toml");
    std::fs::write(
        &config,
        format!("[[tenant]]\nprovider = \"stripe\"\ntenant = \"demo\"\nsecrets = [\"{secret}\"]\n"),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    // An event whose body carries the secret in a field of no credential-like name.
    let sample = std::fs::read_to_string(repo().join("events/samples/stripe.json")).unwrap();
    assert!(sample.contains("Order order-1001"));
    let event = dir.path().join("event.json");
    std::fs::write(&event, sample.replace("Order order-1001", secret)).unwrap();
    {
        let addr = format!("127.0.0.1:{}", free_port());
        let _serve = spawn_einmal(&[
            "serve",
            "--addr",
            &addr,
            "--data-dir",
            &data_dir,
            "--config",
            &config,
        ]);
        wait_for_port(&addr, "einmal serve");
        let sent = einmal(&[
            "send",
            "--provider",
            "stripe",
            "--tenant",
            "demo",
            "--config",
            &config,
            "--event",
            event.to_str().unwrap(),
            "--event-id",
            "evt_console_mask",
            "--url",
            &format!("http://{addr}"),
        ]);
        assert!(stdout(&sent).starts_with("200 "), "{}", stdout(&sent));
    }

    let addr = format!("127.0.0.1:{}", free_port());
    let mut console = spawn_einmal(&[
        "console",
        "--addr",
        &addr,
        "--data-dir",
        &data_dir,
        "--config",
        &config,
        "--max-connections-per-peer",
        "3",
        "--header-read-timeout-ms",
        "600000",
    ]);
    wait_for_port(&addr, "einmal console");
    let shown = http(
        "GET",
        &addr,
        "/console/event?id=stripe%23demo%23evt_console_mask",
        &[],
        "",
    );
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert!(
        shown.body.contains("pi_demo_1"),
        "the body is shown: {}",
        shown.body
    );
    assert!(!shown.body.contains(secret), "{}", shown.body);
    assert!(shown.body.contains("[REDACTED]") || shown.body.contains("[redacted]"));
    let slash = http("GET", &addr, "/console/", &[], "");
    assert_eq!(slash.status, 303, "{}", slash.head);
    assert_eq!(header(&slash, "location").as_deref(), Some("/console"));

    // Three connections held open after a request each (keep-alive, idle); the
    // readiness probe's and the finished ones may count until the server sees them
    // close: take a place until one is granted.
    let deadline = Instant::now() + Duration::from_secs(30);
    let held: Vec<TcpStream> = (0..3)
        .map(|_| loop {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(format!("GET /console/login HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
                .unwrap();
            let mut line = [0u8; 17];
            s.read_exact(&mut line).unwrap();
            if &line == b"HTTP/1.1 200 OK\r\n" {
                // The rest of the answer, so the connection is idle again.
                s.set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                let mut rest = [0u8; 65536];
                let _ = s.read(&mut rest);
                break s;
            }
            assert!(Instant::now() < deadline, "no place: {line:?}");
            drop(s);
            std::thread::sleep(Duration::from_millis(20));
        })
        .collect();
    let over = http("GET", &addr, "/console/login", &[], "");
    assert_eq!(over.status, 503, "{}", over.head);
    assert_eq!(json(&over)["error"], "too_many_connections");

    // SIGTERM with the idle connections open: the console exits, and closes them.
    let exit = sigterm(&mut console.0);
    assert!(exit.success(), "{exit:?}");
    for mut s in held {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 1024];
        let closed = match s.read(&mut buf) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        };
        assert!(closed, "a held connection is closed");
    }
}

/// The demo configuration plus an HTTP destination `shop` for the demo Stripe
/// tenant's customer events, in `dir/einmal.toml`.
fn config_with_shop(dir: &std::path::Path, url: &str) -> PathBuf {
    let mut toml = std::fs::read_to_string(repo().join("einmal.toml")).unwrap();
    toml.push_str(&format!(
        "\n[[destination]]\nname = \"shop\"\ntenant = \"demo\"\nprovider = \"stripe\"\nkind = \"http\"\n\
         events = [\"customer.*\"]\nurl = \"{url}\"\nsecrets = [\"{}\"]\ntimeout_ms = 5000\n",
        einmal_tests::destination_server::SECRET
    ));
    let path = dir.join("einmal.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// A completed event whose delivery the destination refused for good (410): the
/// console's Overview counts it, the Deliveries page (linked in the navigation) lists
/// it per destination with its status and error, and, the destination fixed, the
/// operator replays it from the page (audited): delivered once, listed no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_dead_lettered_delivery_is_counted_listed_and_replayed_from_the_console() {
    use einmal_tests::destination_server::{Answer, DestinationServer};
    use fantoccini::{ClientBuilder, Locator};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let Some((driver, browser)) = chromium_tools() else {
        assert!(
            std::env::var("EINMAL_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "EINMAL_REQUIRE_CHROMIUM=1 but /usr/bin/chromium or /usr/bin/chromedriver is missing"
        );
        eprintln!(
            "skipped: install chromium and chromium-driver to run the console's browser test"
        );
        return;
    };
    let fixed = Arc::new(AtomicBool::new(false));
    let destination = DestinationServer::start({
        let fixed = fixed.clone();
        move |_, _| match fixed.load(Ordering::SeqCst) {
            true => Answer::Ok,
            false => Answer::Status(410, "<b>gone</b> for good"),
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let config = config_with_shop(files.path(), &destination.url);
    let config = config.to_str().unwrap().to_owned();
    let data_dir = dir.path().to_str().unwrap().to_owned();
    let addr = format!("127.0.0.1:{}", free_port());
    let _serve = spawn_einmal(&[
        "serve",
        "--addr",
        &addr,
        "--data-dir",
        &data_dir,
        "--config",
        &config,
    ]);
    wait_for_port(&addr, "einmal serve");
    let event = files.path().join("customer.json");
    let body = serde_json::json!({
        "id": "evt_console_dlv", "object": "event", "type": "customer.updated",
        "created": 1_764_400_000,
        "data": {"object": {"id": "cus_console", "object": "customer"}}
    });
    std::fs::write(&event, body.to_string()).unwrap();
    let sent = einmal(&[
        "send",
        "--provider",
        "stripe",
        "--tenant",
        "demo",
        "--event",
        event.to_str().unwrap(),
        "--config",
        &config,
        "--url",
        &format!("http://{addr}"),
    ]);
    assert!(stdout(&sent).starts_with("200 "), "{}", stdout(&sent));
    let key = "stripe#demo#evt_console_dlv";
    let dead = || {
        let out = einmal(&[
            "events",
            "list",
            "--delivery-state",
            "dead_letter",
            "--json",
            "--data-dir",
            &data_dir,
        ]);
        serde_json::from_str::<Vec<serde_json::Value>>(&stdout(&out)).unwrap()
    };
    wait_until("the delivery to be dead-lettered", || {
        dead().iter().any(|e| e["key"] == key)
    });

    let driver_port = free_port();
    let mut chromedriver = Proc(
        Command::new(&driver)
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts"),
    );
    wait_for_port(&format!("127.0.0.1:{driver_port}"), "chromedriver");
    let capabilities: serde_json::Map<String, serde_json::Value> = serde_json::from_value(serde_json::json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": browser,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000"]
        }
    }))
    .unwrap();
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a WebDriver session in chromium");
    let shots = screenshots_dir();
    let shoot = |name: &'static str| {
        let client = client.clone();
        let path = shots.join(name);
        async move {
            let png = client.screenshot().await.expect("screenshot");
            std::fs::write(&path, png).expect("screenshot saved");
        }
    };
    let base = format!("http://{addr}/console");
    let text = |css: &'static str| {
        let client = client.clone();
        async move {
            client
                .find(Locator::Css(css))
                .await
                .unwrap_or_else(|e| panic!("{css}: {e}"))
                .text()
                .await
                .unwrap()
        }
    };

    // The Overview counts it (the event itself is completed: no dead letter).
    client.goto(&base).await.unwrap();
    assert_eq!(text("#dead-deliveries").await, "1");
    shoot("overview-dead-delivery.png").await;
    // The navigation leads to the Deliveries page: per destination, then the row.
    client
        .find(Locator::LinkText("Deliveries"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    client
        .wait()
        .for_element(Locator::Css("tr.delivery"))
        .await
        .unwrap();
    assert_eq!(text("#per-destination td.destination").await, "shop");
    assert_eq!(text("tr.delivery td.destination").await, "shop");
    assert_eq!(text("tr.delivery td.state").await, "dead_letter");
    assert_eq!(text("tr.delivery td.status").await, "410");
    assert_eq!(text("tr.delivery td.attempts").await, "1");
    assert_eq!(text("tr.delivery a.event").await, key);
    let detail = text("tr.delivery td.detail").await;
    assert!(
        detail.contains("<b>gone</b>"),
        "shown as text, not markup: {detail}"
    );
    assert!(
        !client.source().await.unwrap().contains("<b>gone</b>"),
        "the destination's answer is escaped"
    );
    shoot("deliveries.png").await;

    // Fixed; replayed from the page with a reason and the operator's name.
    fixed.store(true, Ordering::SeqCst);
    client
        .find(Locator::Css("tr.delivery input[type=checkbox]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let form = client.find(Locator::Id("replay-deliveries")).await.unwrap();
    form.find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys("shop endpoint restored")
        .await
        .unwrap();
    form.find(Locator::Css("input[name=operator]"))
        .await
        .unwrap()
        .send_keys("ops-ana")
        .await
        .unwrap();
    form.find(Locator::Id("replay-selected"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let summary = client
        .wait()
        .for_element(Locator::Id("replay-summary"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(summary.contains("redelivered 1"), "{summary}");
    assert_eq!(text("td.outcome").await, "redelivered");
    shoot("deliveries-replayed.png").await;

    // Delivered once; listed and counted no more; audited with reason and operator.
    wait_until("the replayed delivery to arrive", || {
        !destination.effects().is_empty()
    });
    wait_until("the delivery to leave the dead letters", || {
        dead().is_empty()
    });
    let effects = destination.effects();
    assert_eq!(effects.len(), 1);
    assert!(effects.contains_key(&einmal::destinations::delivery_key(
        "shop",
        "stripe",
        "demo",
        "evt_console_dlv"
    )));
    client.goto(&format!("{base}/deliveries")).await.unwrap();
    assert!(client.find(Locator::Id("no-deliveries")).await.is_ok());
    client.goto(&base).await.unwrap();
    assert_eq!(text("#dead-deliveries").await, "0");
    client.goto(&format!("{base}/audit")).await.unwrap();
    assert_eq!(
        text("table.audit td.reason").await,
        "shop endpoint restored"
    );
    assert_eq!(text("table.audit td.actor").await, "ops-ana");
    assert!(client.source().await.unwrap().contains(key));

    client.close().await.unwrap();
    let _ = chromedriver.0.kill();
}
