//! Event types and ids reach the operator's terminal (`einmal listen`, `events list`),
//! so ingest refuses one holding a control or format character (issue 23, item 9):
//! a correctly signed event whose type carries ESC, BEL or a bidi override, or whose id
//! carries a zero-width space, is answered 400 `malformed_request` and nothing is
//! stored or enqueued, on both backends, through the real `Ingestor`.

use einmal_tests::on_both_backends;
use einmal_tests::scenario::{stripe_event, Backend, Kind, TENANT};
use serde_json::json;

async fn fresh(kind: Kind) -> Backend {
    kind.backend(10).await
}

async fn a_signed_event_type_with_esc_is_refused_and_nothing_stored(kind: Kind) {
    let b = fresh(kind).await;
    let ingest = b.ingestor();
    let config = ingest.config();
    let object = json!({"id": "pi_1", "object": "payment_intent", "amount_received": 100,
                        "currency": "eur", "metadata": {"order_id": "1001"}});
    let cases = [
        // Clear the screen, then set the window title and ring the bell.
        (
            "ESC in the type",
            stripe_event(
                "payment_intent.succeeded\u{1b}[2J\u{1b}]0;pwned\u{7}",
                "evt_esc",
                1_764_400_000,
                object.clone(),
            ),
            "U+001B",
        ),
        (
            "a bidi override in the type",
            stripe_event(
                "payment_intent.\u{202e}deliaf_tnemyap",
                "evt_bidi",
                1_764_400_000,
                object.clone(),
            ),
            "U+202E",
        ),
        (
            "a zero-width space in the id",
            stripe_event(
                "payment_intent.succeeded",
                "evt_\u{200b}zw",
                1_764_400_000,
                object.clone(),
            ),
            "control or format characters",
        ),
        (
            "DEL in the id",
            stripe_event(
                "payment_intent.succeeded",
                "evt_\u{7f}del",
                1_764_400_000,
                object.clone(),
            ),
            "control or format characters",
        ),
    ];
    for (what, event, why) in &cases {
        // serde_json writes ESC and BEL as `\u001b` / `\u0007` escapes (valid JSON);
        // U+202E, U+200B and DEL go raw.
        let request = event.request(&config);
        let response = ingest.ingest("stripe", TENANT, &request).await;
        assert_eq!(response.status, 400, "{} {what}: {}", b.name, response.body);
        assert_eq!(response.body["error"], "malformed_request", "{what}");
        let message = response.body["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{what}: {message}");
        // The answer itself names the character by code point, never carries it.
        assert!(
            !message.chars().any(einmal::text::is_unsafe),
            "{what}: {message:?}"
        );
    }
    assert!(
        b.items().await.is_empty(),
        "{}: a refused event was stored",
        b.name
    );
    assert!(b
        .receive_all(std::time::Duration::from_secs(30))
        .await
        .is_empty());

    // The same event with a clean type is accepted: the check is about the characters.
    let clean = stripe_event(
        "payment_intent.succeeded",
        "evt_clean",
        1_764_400_000,
        object,
    );
    let response = ingest
        .ingest("stripe", TENANT, &clean.request(&config))
        .await;
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(b.items().await.len(), 1);
}

on_both_backends!(a_signed_event_type_with_esc_is_refused_and_nothing_stored);
