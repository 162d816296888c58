//! PayPal, Adyen, Paddle, Square and the thin providers (Mollie, GoPay, Klarna push)
//! mapped onto the same effects as Stripe and Shopify.

use super::*;

fn ev(provider: &str, ty: &str, event_id: &str, occurred_at: Option<i64>, body: Value) -> Ev {
    Ev {
        env: Envelope {
            provider: provider.into(),
            tenant: T.into(),
            event_id: event_id.into(),
            event_type: ty.into(),
            object_id: None,
            object_version: None,
            occurred_at,
            delivery_id: None,
        },
        body: serde_json::to_vec(&body).unwrap(),
    }
}

fn paypal(ty: &str, id: &str, order: &str, value: &str, status: &str, at: &str) -> Ev {
    let body = json!({
        "id": format!("WH-{ty}-{id}"), "event_version": "1.0", "create_time": at,
        "resource_type": if ty.ends_with("REFUNDED") { "refund" } else { "capture" },
        "event_type": ty,
        "resource": {"id": id, "status": status, "custom_id": order,
                     "amount": {"currency_code": "EUR", "value": value}}
    });
    ev("paypal", ty, &format!("WH-{ty}-{id}"), None, body)
}

fn adyen(
    code: &str,
    success: bool,
    psp: &str,
    original: Option<&str>,
    order: &str,
    value: i64,
) -> Ev {
    let mut item = json!({
        "eventCode": code, "success": success.to_string(), "pspReference": psp,
        "merchantAccountCode": "ShopEU", "merchantReference": order,
        "amount": {"value": value, "currency": "EUR"},
        "eventDate": "2025-12-01T10:00:00+01:00"
    });
    if let Some(o) = original {
        item["originalReference"] = json!(o);
    }
    ev(
        "adyen",
        code,
        &format!("ShopEU:{psp}:{code}:{success}"),
        None,
        item,
    )
}

fn paddle(ty: &str, event_id: &str, at: &str, data: Value) -> Ev {
    let body = json!({"event_id": event_id, "event_type": ty, "occurred_at": at,
                      "notification_id": "ntf_1", "data": data});
    ev("paddle", ty, event_id, None, body)
}

fn paddle_txn(ty: &str, txn: &str, order: &str, total: &str, at: &str) -> Ev {
    paddle(
        ty,
        &format!("evt_{txn}_{ty}_{at}"),
        at,
        json!({"id": txn, "status": "completed", "currency_code": "EUR",
               "custom_data": {"order_id": order},
               "details": {"totals": {"grand_total": total, "total": total}}}),
    )
}

fn square(ty: &str, event_id: &str, object: Value) -> Ev {
    let kind = if ty.starts_with("refund.") {
        "refund"
    } else {
        "payment"
    };
    let body = json!({"merchant_id": "M1", "type": ty, "event_id": event_id,
                      "created_at": "2025-12-01T10:00:00Z",
                      "data": {"type": kind, "id": object["id"], "object": {kind: object}}});
    ev("square", ty, event_id, None, body)
}

fn square_payment(id: &str, order: Option<&str>, status: &str, amount: i64, at: &str) -> Ev {
    let mut p = json!({"id": id, "status": status, "order_id": "sq-order-1",
                       "amount_money": {"amount": amount, "currency": "EUR"},
                       "updated_at": at});
    if let Some(o) = order {
        p["reference_id"] = json!(o);
    }
    square("payment.updated", &format!("sq-{id}-{status}-{at}"), p)
}

fn mollie(id: &str, order: &str, status: &str, value: &str) -> Ev {
    let body = json!({"resource": "payment", "id": id, "mode": "test", "status": status,
                      "amount": {"value": value, "currency": "EUR"},
                      "metadata": {"order_id": order},
                      "createdAt": "2025-12-01T10:00:00+00:00"});
    ev("mollie", "payment", &format!("{id}:{status}"), None, body)
}

fn gopay(id: u64, order: &str, state: &str, amount: i64) -> Ev {
    let body = json!({"id": id, "order_number": order, "state": state, "amount": amount,
                      "currency": "CZK"});
    ev("gopay", "payment", &format!("{id}:{state}"), None, body)
}

fn klarna(id: &str, order: &str, status: &str, amount: i64) -> Ev {
    let body = json!({"order_id": id, "status": status, "merchant_reference1": order,
                      "order_amount": amount, "purchase_currency": "EUR"});
    ev(
        "klarna-push",
        "order",
        &format!("{id}:{status}"),
        None,
        body,
    )
}

fn invoices(w: &World, id: &str) -> usize {
    w.order(id).invoices.len()
}

#[test]
fn new_types_are_supported_and_others_ignored() {
    for (p, t) in [
        ("paypal", "PAYMENT.CAPTURE.PENDING"),
        ("adyen", "REPORT_AVAILABLE"),
        ("paddle", "subscription.created"),
        ("square", "order.updated"),
        ("mollie", "payment.paid"),
        ("gopay", "refund"),
        ("klarna", "order"),
    ] {
        let d = World::new().deliver(&ev(p, t, "e1", None, json!("not even an object")));
        assert_eq!(
            ignored(&d.unwrap()),
            format!("unsupported event type {p} {t}")
        );
    }
}

#[test]
fn paypal_capture_refund_and_denial() {
    let mut w = World::new();
    let denied = paypal(
        "PAYMENT.CAPTURE.DENIED",
        "CAP1",
        "1001",
        "49.90",
        "DECLINED",
        "2025-12-01T10:00:00Z",
    );
    let d = w.ok(&denied);
    assert_eq!(
        effect_keys(&d),
        ["t1#order-1001#payment_failed#CAP1#1764583200"]
    );
    assert_eq!(w.order("1001").payment_status, PaymentStatus::Failed);
    let paid = paypal(
        "PAYMENT.CAPTURE.COMPLETED",
        "CAP2",
        "1001",
        "49.90",
        "COMPLETED",
        "2025-12-01T10:05:00Z",
    );
    assert_eq!(
        effect_keys(&w.ok(&paid)),
        ["t1#order-1001#paid", "t1#order-1001#payment#paypal#CAP2"]
    );
    let o = w.order("1001");
    assert_eq!(
        (o.payment_status, o.paid_minor(), o.currency.as_deref()),
        (PaymentStatus::Paid, 4990, Some("EUR"))
    );
    assert_idempotent(&mut w, &paid);
    // A late denial (newer timestamp) after the payment: superseded, stays paid.
    let late = paypal(
        "PAYMENT.CAPTURE.DENIED",
        "CAP3",
        "1001",
        "49.90",
        "DECLINED",
        "2025-12-02T10:00:00Z",
    );
    assert_eq!(ignored(&w.ok(&late)), "superseded: order 1001 already paid");
    let refund = paypal(
        "PAYMENT.CAPTURE.REFUNDED",
        "RF1",
        "1001",
        "10.00",
        "COMPLETED",
        "2025-12-03T10:00:00Z",
    );
    assert_eq!(effect_keys(&w.ok(&refund)), ["t1#order-1001#refund#RF1"]);
    assert_eq!(
        w.order("1001").payment_status,
        PaymentStatus::PartiallyRefunded
    );
    assert_idempotent(&mut w, &refund);
    let failed = paypal(
        "PAYMENT.CAPTURE.REFUNDED",
        "RF2",
        "1001",
        "10.00",
        "FAILED",
        "2025-12-03T11:00:00Z",
    );
    assert!(ignored(&w.ok(&failed)).contains("moves no money"));
    // invoice_id when there is no custom_id; neither is permanent.
    let mut body: Value = serde_json::from_slice(&refund.body).unwrap();
    body["resource"]
        .as_object_mut()
        .unwrap()
        .remove("custom_id");
    let none = ev(
        "paypal",
        "PAYMENT.CAPTURE.REFUNDED",
        "WH-x",
        None,
        body.clone(),
    );
    assert!(permanent(w.deliver(&none)).contains("no resource.custom_id"));
    body["resource"]["invoice_id"] = json!("1001");
    let by_invoice = ev("paypal", "PAYMENT.CAPTURE.REFUNDED", "WH-y", None, body);
    assert_eq!(
        ReferenceDomain.targets(&by_invoice.view()).unwrap(),
        [order_key(T, "1001")]
    );
}

#[test]
fn adyen_authorisation_and_capture_are_one_payment() {
    let mut w = World::new();
    let auth = adyen("AUTHORISATION", true, "PSP1", None, "1001", 12_970);
    assert_eq!(
        effect_keys(&w.ok(&auth)),
        ["t1#order-1001#paid", "t1#order-1001#payment#adyen#PSP1"]
    );
    // The capture names its authorisation: the same payment.
    let cap = adyen("CAPTURE", true, "PSP2", Some("PSP1"), "1001", 12_970);
    assert_eq!(
        result(&w.ok(&cap)),
        "already applied: t1#order-1001#paid, t1#order-1001#payment#adyen#PSP1"
    );
    assert_eq!(invoices(&w, "1001"), 1);
    let refund = adyen("REFUND", true, "PSP3", Some("PSP1"), "1001", 2_970);
    assert_eq!(effect_keys(&w.ok(&refund)), ["t1#order-1001#refund#PSP3"]);
    assert_eq!(w.order("1001").refunded_minor, 2_970);
    assert_idempotent(&mut w, &refund);
    // Unsuccessful modifications are ignored; a late failed authorisation too.
    let no = adyen("REFUND", false, "PSP4", Some("PSP1"), "1001", 100);
    assert_eq!(
        ignored(&w.ok(&no)),
        "adyen REFUND PSP4 of order 1001 was not successful"
    );
    let failed = adyen("AUTHORISATION", false, "PSP5", None, "1001", 12_970);
    assert_eq!(
        ignored(&w.ok(&failed)),
        "superseded: order 1001 already paid"
    );
    assert_eq!(
        w.order("1001").payment_status,
        PaymentStatus::PartiallyRefunded
    );
}

#[test]
fn adyen_failed_authorisation_then_success() {
    let mut w = World::new();
    let failed = adyen("AUTHORISATION", false, "PSP1", None, "1002", 500);
    assert_eq!(
        effect_keys(&w.ok(&failed)),
        ["t1#order-1002#payment_failed#PSP1#1764579600"]
    );
    assert_eq!(w.order("1002").payment_status, PaymentStatus::Failed);
    w.ok(&adyen("AUTHORISATION", true, "PSP2", None, "1002", 500));
    let o = w.order("1002");
    assert_eq!(o.payment_status, PaymentStatus::Paid);
    assert_eq!(
        o.notifications.iter().map(|n| n.kind).collect::<Vec<_>>(),
        [NotificationKind::PaymentReceived]
    );
}

#[test]
fn two_providers_report_the_same_payment_one_invoice() {
    let (mut a, mut b) = (World::new(), World::new());
    let stripe = pi_succeeded("1001", "pi_1", 12_970, 100);
    let adyen = adyen("CAPTURE", true, "PSP2", Some("PSP1"), "1001", 12_970);
    let paypal = paypal(
        "PAYMENT.CAPTURE.COMPLETED",
        "CAP1",
        "1001",
        "129.70",
        "COMPLETED",
        "2025-12-01T10:00:00Z",
    );
    for e in [&stripe, &adyen, &paypal] {
        a.ok(e);
    }
    for e in [&paypal, &adyen, &stripe] {
        b.ok(e);
    }
    assert_eq!(a.data(), b.data());
    let o = a.order("1001");
    assert_eq!(
        (o.invoices.len(), o.paid_minor(), o.loyalty_points),
        (1, 12_970, 129)
    );
    assert_eq!(o.notifications.len(), 1);
    // Each provider's payment is recorded; providers' totals are not added up.
    assert_eq!(
        a.applied(&order_key(T, "1001")),
        [
            "t1#order-1001#paid",
            "t1#order-1001#payment#adyen#PSP1",
            "t1#order-1001#payment#paypal#CAP1",
            "t1#order-1001#payment#stripe#pi_1"
        ]
    );
}

#[test]
fn adyen_cancellation_cancels_and_shopify_cancel_still_restocks_once() {
    let items = [(RED, 1), (BLUE, 2)];
    let create = orders_create(
        1001,
        "2025-11-29T02:00:05-05:00",
        &items,
        "129.70",
        "pending",
    );
    let adyen_cancel = adyen("CANCELLATION", true, "PSP9", Some("PSP1"), "1001", 12_970);
    let shop_cancel = orders_cancelled(1001, "2025-11-29T05:00:00-05:00", &items, "129.70");
    let mut first = World::new();
    first.ok(&create);
    let d = first.ok(&adyen_cancel);
    assert_eq!(effect_keys(&d), ["t1#order-1001#payment_cancelled#PSP1"]);
    // A payment cancellation never moves stock.
    assert_eq!((first.on_hand(RED), first.on_hand(BLUE)), (9, 3));
    first.ok(&shop_cancel);
    assert_eq!((first.on_hand(RED), first.on_hand(BLUE)), (10, 5));
    assert_idempotent(&mut first, &shop_cancel);
    let mut second = World::new();
    second.ok(&create);
    second.ok(&shop_cancel);
    assert!(ignored(&second.ok(&adyen_cancel)).contains("already cancelled"));
    assert_eq!(first.data(), second.data());
    let o = first.order("1001");
    assert_eq!(o.status, OrderStatus::Cancelled);
    assert_eq!(
        o.notifications
            .iter()
            .map(|n| n.dedup_key.as_str())
            .collect::<Vec<_>>(),
        ["t1#order-1001#cancelled"]
    );
    // An unknown order: a minimal cancelled order.
    let mut w = World::new();
    w.ok(&adyen(
        "CANCELLATION",
        true,
        "PSP8",
        Some("PSP7"),
        "1009",
        500,
    ));
    assert_eq!(w.order("1009").status, OrderStatus::Cancelled);
}

#[test]
fn adyen_malformed_items_are_permanent() {
    let mut w = World::new();
    let mut bad = adyen("CAPTURE", true, "PSP2", Some("PSP1"), "1001", 1);
    let mut body: Value = serde_json::from_slice(&bad.body).unwrap();
    body.as_object_mut().unwrap().remove("merchantReference");
    bad.body = serde_json::to_vec(&body).unwrap();
    assert!(permanent(w.deliver(&bad)).contains("no merchantReference"));
    body["merchantReference"] = json!("1001");
    body["success"] = json!("maybe");
    bad.body = serde_json::to_vec(&body).unwrap();
    assert!(permanent(w.deliver(&bad)).contains("`success`"));
}

#[test]
fn paddle_transactions_and_refund_adjustments() {
    let mut w = World::new();
    let failed = paddle_txn(
        "transaction.payment_failed",
        "txn_1",
        "1003",
        "4990",
        "2025-12-01T10:00:00Z",
    );
    assert_eq!(
        effect_keys(&w.ok(&failed)),
        ["t1#order-1003#payment_failed#txn_1#1764583200"]
    );
    let paid = paddle_txn(
        "transaction.paid",
        "txn_1",
        "1003",
        "4990",
        "2025-12-01T10:01:00Z",
    );
    let completed = paddle_txn(
        "transaction.completed",
        "txn_1",
        "1003",
        "4990",
        "2025-12-01T10:02:00Z",
    );
    assert_eq!(
        effect_keys(&w.ok(&paid)),
        ["t1#order-1003#paid", "t1#order-1003#payment#paddle#txn_1"]
    );
    assert_eq!(
        result(&w.ok(&completed)),
        "already applied: t1#order-1003#paid, t1#order-1003#payment#paddle#txn_1"
    );
    assert_eq!(
        (invoices(&w, "1003"), w.order("1003").paid_minor()),
        (1, 4990)
    );
    let late = paddle_txn(
        "transaction.payment_failed",
        "txn_1",
        "1003",
        "4990",
        "2025-12-02T10:00:00Z",
    );
    assert_eq!(ignored(&w.ok(&late)), "superseded: order 1003 already paid");
    let adj = |id: &str, status: &str, custom: Option<&str>| {
        let mut data = json!({"id": id, "action": "refund", "status": status,
                              "transaction_id": "txn_1", "currency_code": "EUR",
                              "totals": {"total": "990", "currency_code": "EUR"}});
        if let Some(o) = custom {
            data["custom_data"] = json!({"order_id": o});
        }
        paddle(
            "adjustment.updated",
            &format!("evt_{id}_{status}"),
            "2025-12-03T10:00:00Z",
            data,
        )
    };
    assert!(
        ignored(&w.ok(&adj("adj_1", "pending_approval", Some("1003")))).contains("not approved")
    );
    assert!(ignored(&w.ok(&adj("adj_1", "approved", None))).contains("names no order"));
    let d = w.ok(&adj("adj_1", "approved", Some("1003")));
    assert_eq!(effect_keys(&d), ["t1#order-1003#refund#adj_1"]);
    assert_eq!(w.order("1003").refunded_minor, 990);
    let no_order = paddle(
        "transaction.paid",
        "evt_x",
        "2025-12-01T10:00:00Z",
        json!({"id": "txn_2"}),
    );
    assert!(permanent(w.deliver(&no_order)).contains("no data.custom_data.order_id"));
}

#[test]
fn square_payments_and_refunds() {
    let mut w = World::new();
    let approved = square_payment(
        "sq_p1",
        Some("1004"),
        "APPROVED",
        2500,
        "2025-12-01T10:00:00Z",
    );
    assert_eq!(
        ignored(&w.ok(&approved)),
        "square payment sq_p1 not final: APPROVED"
    );
    let failed = square_payment(
        "sq_p0",
        Some("1004"),
        "FAILED",
        2500,
        "2025-12-01T09:00:00Z",
    );
    assert_eq!(
        effect_keys(&w.ok(&failed)),
        ["t1#order-1004#payment_failed#sq_p0#1764579600"]
    );
    let done = square_payment(
        "sq_p1",
        Some("1004"),
        "COMPLETED",
        2500,
        "2025-12-01T10:01:00Z",
    );
    assert_eq!(
        effect_keys(&w.ok(&done)),
        ["t1#order-1004#paid", "t1#order-1004#payment#square#sq_p1"]
    );
    let canceled = square_payment(
        "sq_p2",
        Some("1004"),
        "CANCELED",
        2500,
        "2025-12-02T10:00:00Z",
    );
    assert_eq!(
        ignored(&w.ok(&canceled)),
        "superseded: order 1004 already paid"
    );
    let pos = square_payment("sq_p3", None, "COMPLETED", 700, "2025-12-01T10:00:00Z");
    assert_eq!(
        ignored(&w.ok(&pos)),
        "square payment sq_p3 names no order (no reference_id)"
    );
    let refund = |status: &str, reference: Option<&str>| {
        let mut r = json!({"id": "sq_r1", "status": status, "payment_id": "sq_p1",
                           "amount_money": {"amount": 500, "currency": "EUR"}});
        if let Some(o) = reference {
            r["reference_id"] = json!(o);
        }
        square("refund.updated", &format!("sq-r1-{status}"), r)
    };
    assert!(ignored(&w.ok(&refund("COMPLETED", None))).contains("names no order"));
    assert!(ignored(&w.ok(&refund("PENDING", Some("1004")))).contains("not final: PENDING"));
    assert!(ignored(&w.ok(&refund("REJECTED", Some("1004")))).contains("moves no money"));
    assert_eq!(
        effect_keys(&w.ok(&refund("COMPLETED", Some("1004")))),
        ["t1#order-1004#refund#sq_r1"]
    );
    assert_eq!(
        w.order("1004").payment_status,
        PaymentStatus::PartiallyRefunded
    );
}

#[test]
fn thin_providers_map_the_fetched_state() {
    let mut w = World::new();
    assert_eq!(
        ignored(&w.ok(&mollie("tr_1", "1005", "open", "10.00"))),
        "mollie payment tr_1 not final or not mapped: open"
    );
    let mut expired: Value =
        serde_json::from_slice(&mollie("tr_0", "1005", "expired", "10.00").body).unwrap();
    expired["expiredAt"] = json!("2025-12-01T10:15:00+00:00");
    let expired = ev("mollie", "payment", "tr_0:expired", None, expired);
    assert_eq!(
        effect_keys(&w.ok(&expired)),
        ["t1#order-1005#payment_failed#tr_0#1764584100"]
    );
    assert_eq!(
        effect_keys(&w.ok(&mollie("tr_1", "1005", "paid", "10.00"))),
        ["t1#order-1005#paid", "t1#order-1005#payment#mollie#tr_1"]
    );
    assert_eq!(w.order("1005").paid_minor(), 1000);
    assert!(ignored(&w.ok(&mollie("tr_2", "1005", "failed", "10.00"))).starts_with("superseded:"));
    // A signed next-gen event under the same provider and type is not a payment object.
    let next_gen = ev(
        "mollie",
        "payment",
        "event_1",
        None,
        json!({"resource": "event", "id": "event_1", "type": "payment", "entityId": "tr_1"}),
    );
    assert_eq!(
        ignored(&w.ok(&next_gen)),
        "mollie payment: body is not a fetched payment object"
    );

    assert!(ignored(&w.ok(&gopay(3001, "1006", "CREATED", 10_000))).contains("not final"));
    assert_eq!(
        effect_keys(&w.ok(&gopay(3000, "1006", "TIMEOUTED", 10_000))),
        ["t1#order-1006#payment_failed#3000#0"]
    );
    assert_eq!(
        effect_keys(&w.ok(&gopay(3001, "1006", "PAID", 10_000))),
        ["t1#order-1006#paid", "t1#order-1006#payment#gopay#3001"]
    );
    assert_eq!(w.order("1006").currency.as_deref(), Some("CZK"));
    assert!(ignored(&w.ok(&gopay(3002, "1006", "CANCELED", 10_000))).starts_with("superseded:"));

    assert_eq!(
        effect_keys(&w.ok(&klarna("k-1", "1007", "AUTHORIZED", 3_000))),
        ["t1#order-1007#paid", "t1#order-1007#payment#klarna#k-1"]
    );
    assert_eq!(
        result(&w.ok(&klarna("k-1", "1007", "CAPTURED", 3_000))),
        "already applied: t1#order-1007#paid, t1#order-1007#payment#klarna#k-1"
    );
    assert!(ignored(&w.ok(&klarna("k-1", "1007", "CANCELLED", 3_000))).starts_with("superseded:"));
    assert!(
        ignored(&w.ok(&klarna("k-1", "1007", "EXPIRED", 3_000))).contains("not mapped: EXPIRED")
    );
    let mut w2 = World::new();
    assert_eq!(
        effect_keys(&w2.ok(&klarna("k-2", "1008", "CANCELLED", 3_000))),
        ["t1#order-1008#payment_failed#k-2#0"]
    );
    assert_eq!(w2.order("1008").payment_status, PaymentStatus::Failed);
}

/// Several providers' events for five orders, some overlapping.
fn mixed_story() -> Vec<Ev> {
    let items = [(RED, 1), (BLUE, 2)];
    vec![
        // 2001: Shopify order paid through Adyen (authorised, captured), refunded
        // once, cancelled by Adyen and by Shopify.
        orders_create(2001, "2025-12-01T10:00:00Z", &items, "129.70", "pending"),
        adyen("AUTHORISATION", false, "A0", None, "2001", 12_970),
        adyen("AUTHORISATION", true, "A1", None, "2001", 12_970),
        adyen("CAPTURE", true, "A2", Some("A1"), "2001", 12_970),
        orders_paid(2001, "2025-12-01T10:05:00Z", &items, "129.70"),
        adyen("REFUND", true, "A3", Some("A1"), "2001", 2_970),
        adyen("REFUND", false, "A4", Some("A1"), "2001", 100),
        adyen("CANCELLATION", true, "A5", Some("A1"), "2001", 12_970),
        orders_cancelled(2001, "2025-12-02T10:00:00Z", &items, "129.70"),
        orders_updated(2001, "2025-12-01T11:00:00Z", &items, "129.70"),
        // 2002: PayPal denial, capture, a late denial, refund; Stripe reports the payment too.
        paypal(
            "PAYMENT.CAPTURE.DENIED",
            "C0",
            "2002",
            "49.90",
            "DECLINED",
            "2025-12-01T10:00:00Z",
        ),
        paypal(
            "PAYMENT.CAPTURE.COMPLETED",
            "C1",
            "2002",
            "49.90",
            "COMPLETED",
            "2025-12-01T10:01:00Z",
        ),
        pi_succeeded("2002", "pi_2002", 4990, 1_764_583_300),
        paypal(
            "PAYMENT.CAPTURE.DENIED",
            "C2",
            "2002",
            "49.90",
            "DECLINED",
            "2025-12-01T12:00:00Z",
        ),
        paypal(
            "PAYMENT.CAPTURE.REFUNDED",
            "R1",
            "2002",
            "9.90",
            "COMPLETED",
            "2025-12-02T10:00:00Z",
        ),
        // 2003: Paddle.
        paddle_txn(
            "transaction.payment_failed",
            "txn_3",
            "2003",
            "1500",
            "2025-12-01T10:00:00Z",
        ),
        paddle_txn(
            "transaction.paid",
            "txn_3",
            "2003",
            "1500",
            "2025-12-01T10:01:00Z",
        ),
        paddle_txn(
            "transaction.completed",
            "txn_3",
            "2003",
            "1500",
            "2025-12-01T10:02:00Z",
        ),
        paddle_txn(
            "transaction.payment_failed",
            "txn_3",
            "2003",
            "1500",
            "2025-12-01T11:00:00Z",
        ),
        // 2004: Square.
        square_payment("sq_4a", Some("2004"), "FAILED", 800, "2025-12-01T10:00:00Z"),
        square_payment(
            "sq_4b",
            Some("2004"),
            "APPROVED",
            800,
            "2025-12-01T10:01:00Z",
        ),
        square_payment(
            "sq_4b",
            Some("2004"),
            "COMPLETED",
            800,
            "2025-12-01T10:02:00Z",
        ),
        square_payment(
            "sq_4c",
            Some("2004"),
            "CANCELED",
            800,
            "2025-12-01T10:03:00Z",
        ),
        // 2005-2007: thin providers, failures around the payment.
        mollie("tr_5a", "2005", "failed", "12.00"),
        mollie("tr_5b", "2005", "paid", "12.00"),
        mollie("tr_5c", "2005", "canceled", "12.00"),
        gopay(6001, "2006", "TIMEOUTED", 9_900),
        gopay(6002, "2006", "PAID", 9_900),
        klarna("k7", "2007", "AUTHORIZED", 5_000),
        klarna("k7", "2007", "CAPTURED", 5_000),
        klarna("k7", "2007", "CANCELLED", 5_000),
        // 2008: a Shopify order paid through Adyen in two payments (deposit captured,
        // then the balance), the balance refunded.
        orders_create(2008, "2025-12-08T10:00:00Z", &[], "99.80", "pending"),
        adyen("AUTHORISATION", true, "B1", None, "2008", 2_000),
        adyen("CAPTURE", true, "B2", Some("B1"), "2008", 2_000),
        adyen("AUTHORISATION", true, "B3", None, "2008", 7_980),
        orders_paid(2008, "2025-12-08T10:30:00Z", &[], "99.80"),
        adyen("REFUND", true, "B4", Some("B3"), "2008", 7_980),
    ]
}

#[test]
fn every_arrival_order_of_mixed_providers_converges() {
    let events = mixed_story();
    let n = events.len();
    let clean = run(&events, &(0..n).collect::<Vec<_>>(), 1);
    let o1 = clean.order("2001");
    assert_eq!(
        (
            o1.status,
            o1.payment_status,
            o1.invoices.len(),
            o1.refunded_minor,
            o1.loyalty_points
        ),
        (
            OrderStatus::Cancelled,
            PaymentStatus::PartiallyRefunded,
            1,
            2_970,
            100
        )
    );
    assert_eq!((clean.on_hand(RED), clean.on_hand(BLUE)), (10, 5));
    let o2 = clean.order("2002");
    assert_eq!(
        (o2.invoices.len(), o2.payment_status, o2.refunded_minor),
        (1, PaymentStatus::PartiallyRefunded, 990)
    );
    let o8 = clean.order("2008");
    assert_eq!(
        (
            o8.invoices.len(),
            o8.paid_minor(),
            o8.refunded_minor,
            o8.payment_status
        ),
        (1, 9_980, 7_980, PaymentStatus::PartiallyRefunded)
    );
    for id in ["2003", "2004", "2005", "2006", "2007"] {
        let o = clean.order(id);
        assert_eq!(
            (o.payment_status, o.invoices.len()),
            (PaymentStatus::Paid, 1),
            "{id}"
        );
        assert!(
            o.notifications
                .iter()
                .all(|n| n.kind == NotificationKind::PaymentReceived),
            "{id}"
        );
    }
    let mut orders = vec![(0..n).rev().collect::<Vec<_>>()];
    orders.extend((100..260).map(|seed| permutation(n, seed)));
    for (i, order) in orders.iter().enumerate() {
        let got = run(&events, order, if i % 2 == 0 { 2 } else { 1 });
        assert_eq!(
            got.data(),
            clean.data(),
            "permutation #{i} {order:?} diverged"
        );
    }
}

#[test]
fn every_mixed_event_is_idempotent() {
    let mut w = World::new();
    for ev in mixed_story() {
        w.ok(&ev);
        assert_idempotent(&mut w, &ev);
    }
}

// ---- Samples ------------------------------------------------------------------------

fn provider_sample(name: &str) -> Ev {
    let path = format!(
        "{}/../events/samples/domain/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let body: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let (provider, ty) = if let Some(code) = name.strip_prefix("adyen-item-") {
        assert_eq!(body["eventCode"], code, "{name}");
        ("adyen", code.to_owned())
    } else if let Some((p, t)) = name
        .rsplit_once('-')
        .filter(|(p, _)| ["mollie", "gopay", "klarna-push"].contains(p))
    {
        (p, t.to_owned())
    } else {
        let (p, t) = name.split_once('-').unwrap();
        let field = if p == "square" { "type" } else { "event_type" };
        assert_eq!(body[field], t, "{name}");
        (p, t.to_owned())
    };
    ev(provider, &ty, name, None, body)
}

#[test]
fn provider_samples_map_and_converge() {
    let names = [
        ("paypal-PAYMENT.CAPTURE.DENIED", "2001"),
        ("paypal-PAYMENT.CAPTURE.COMPLETED", "2001"),
        ("paypal-PAYMENT.CAPTURE.REFUNDED", "2001"),
        ("adyen-item-AUTHORISATION", "2002"),
        ("adyen-item-CAPTURE", "2002"),
        ("adyen-item-REFUND", "2002"),
        ("adyen-item-CANCELLATION", "2012"),
        ("paddle-transaction.payment_failed", "2003"),
        ("paddle-transaction.paid", "2003"),
        ("paddle-transaction.completed", "2003"),
        ("paddle-adjustment.created", ""),
        ("paddle-adjustment.updated", "2003"),
        ("square-payment.created", ""),
        ("square-payment.updated", "2004"),
        ("square-refund.created", ""),
        ("square-refund.updated", "2004"),
        ("mollie-payment", "2005"),
        ("gopay-payment", "2006"),
        ("klarna-push-order", "2007"),
    ];
    let events: Vec<Ev> = names.iter().map(|(n, _)| provider_sample(n)).collect();
    for ((name, order), ev) in names.iter().zip(&events) {
        assert!(
            ReferenceDomain::supports(&ev.env.provider, &ev.env.event_type),
            "{name}"
        );
        let targets = ReferenceDomain.targets(&ev.view()).unwrap();
        if order.is_empty() {
            // Ignored with a reason: not final yet.
            assert!(targets.is_empty(), "{name}");
            assert!(ignored(&World::new().ok(ev)).contains("not"), "{name}");
        } else {
            assert_eq!(targets, [order_key(T, order)], "{name}");
        }
    }
    let in_order: Vec<usize> = (0..events.len()).collect();
    let w = run(&events, &in_order, 1);
    assert_eq!(
        (
            w.order("2001").payment_status,
            w.order("2001").refunded_minor
        ),
        (PaymentStatus::PartiallyRefunded, 1000)
    );
    assert_eq!(
        (
            w.order("2002").invoices.len(),
            w.order("2002").refunded_minor
        ),
        (1, 2_970)
    );
    assert_eq!(w.order("2012").status, OrderStatus::Cancelled);
    assert_eq!(
        (w.order("2003").paid_minor(), w.order("2003").refunded_minor),
        (4990, 990)
    );
    assert_eq!(
        (w.order("2004").paid_minor(), w.order("2004").refunded_minor),
        (2500, 500)
    );
    for id in ["2005", "2006", "2007"] {
        assert_eq!(w.order(id).payment_status, PaymentStatus::Paid, "{id}");
    }
    for seed in 0..20 {
        let got = run(&events, &permutation(events.len(), seed), 2);
        assert_eq!(got.data(), w.data(), "seed {seed}");
    }
}

// ---- Issue 28 payment providers: Razorpay, Worldline, Paystack ---------------------

fn razorpay_payment(ty: &str, pay: &str, order: &str, amount: i64, at: i64) -> Ev {
    let body = json!({
        "entity": "event", "account_id": "acc_1", "event": ty, "contains": ["payment"],
        "payload": {"payment": {"entity": {"id": pay, "amount": amount, "currency": "eur",
                                           "notes": {"order_id": order}}}},
        "created_at": at
    });
    ev("razorpay", ty, &format!("evt_{ty}_{pay}"), Some(at), body)
}

fn razorpay_refund(refund: &str, pay: &str, order: Option<&str>, amount: i64) -> Ev {
    // Razorpay sends `notes` as `[]` when the shop set none.
    let notes = order.map_or(json!([]), |o| json!({"order_id": o}));
    let body = json!({
        "entity": "event", "event": "refund.processed", "contains": ["refund", "payment"],
        "payload": {
            "refund": {"entity": {"id": refund, "amount": amount, "payment_id": pay, "notes": []}},
            "payment": {"entity": {"id": pay, "amount": 4990, "notes": notes}}
        },
        "created_at": 1_764_590_000
    });
    ev(
        "razorpay",
        "refund.processed",
        &format!("evt_{refund}"),
        None,
        body,
    )
}

fn worldline(ty: &str, event_id: &str, created: &str, object: Value) -> Ev {
    let mut body = json!({"apiVersion": "v1", "id": event_id, "created": created,
                          "merchantId": "M1", "type": ty});
    let key = if ty.starts_with("refund.") {
        "refund"
    } else {
        "payment"
    };
    body[key] = object;
    ev("worldline", ty, event_id, None, body)
}

fn worldline_payment(ty: &str, id: &str, order: &str, amount: i64, created: &str) -> Ev {
    let payment = json!({"id": id, "status": "CAPTURED", "paymentOutput": {
        "amountOfMoney": {"amount": amount, "currencyCode": "EUR"},
        "references": {"merchantReference": order}}});
    worldline(ty, &format!("wl-{ty}-{id}"), created, payment)
}

fn paystack_charge(id: u64, order: &str, amount: i64) -> Ev {
    let body = json!({"event": "charge.success", "data": {
        "id": id, "domain": "live", "status": "success", "reference": format!("ref{id}"),
        "amount": amount, "currency": "EUR", "metadata": {"order_id": order}}});
    ev(
        "paystack",
        "charge.success",
        &format!("charge.success:{id}"),
        None,
        body,
    )
}

#[test]
fn razorpay_payment_failure_and_refunds() {
    let mut w = World::new();
    let failed = razorpay_payment("payment.failed", "pay_0", "1101", 4990, 1_764_583_200);
    assert_eq!(
        effect_keys(&w.ok(&failed)),
        ["t1#order-1101#payment_failed#pay_0#1764583200"]
    );
    let captured = razorpay_payment("payment.captured", "pay_1", "1101", 4990, 1_764_583_300);
    assert_eq!(
        effect_keys(&w.ok(&captured)),
        ["t1#order-1101#paid", "t1#order-1101#payment#razorpay#pay_1"]
    );
    assert_eq!(w.order("1101").currency.as_deref(), Some("EUR"));
    assert_eq!(invoices(&w, "1101"), 1);
    // One refund per refund id: the refund's own notes are empty, the payment's name
    // the order; a second report of the same refund changes nothing.
    let refund = razorpay_refund("rfnd_1", "pay_1", Some("1101"), 990);
    assert_eq!(effect_keys(&w.ok(&refund)), ["t1#order-1101#refund#rfnd_1"]);
    assert_eq!(
        result(&w.ok(&refund)),
        "already applied: t1#order-1101#refund#rfnd_1"
    );
    assert_eq!(w.order("1101").refunded_minor, 990);
    assert!(
        ignored(&w.ok(&razorpay_refund("rfnd_2", "pay_x", None, 10))).contains("names no order")
    );
    let no_order = ev(
        "razorpay",
        "payment.captured",
        "e",
        None,
        json!({"payload": {"payment": {"entity": {"id": "pay_9", "amount": 1, "notes": []}}}}),
    );
    assert!(permanent(w.deliver(&no_order)).contains("no notes.order_id"));
}

#[test]
fn worldline_capture_rejection_and_refund() {
    let mut w = World::new();
    let rejected = worldline_payment(
        "payment.rejected",
        "300_0",
        "1102",
        2500,
        "2025-12-01T10:00:00.000+0100",
    );
    // Worldline's colon-less offset is read: 09:00 UTC.
    assert_eq!(
        effect_keys(&w.ok(&rejected)),
        ["t1#order-1102#payment_failed#300_0#1764579600"]
    );
    let captured = worldline_payment(
        "payment.captured",
        "300_1",
        "1102",
        2500,
        "2025-12-01T10:05:00.000+0100",
    );
    assert_eq!(
        effect_keys(&w.ok(&captured)),
        [
            "t1#order-1102#paid",
            "t1#order-1102#payment#worldline#300_1"
        ]
    );
    let refund = |order: Option<&str>| {
        let mut output = json!({"amountOfMoney": {"amount": 500, "currencyCode": "EUR"}});
        if let Some(o) = order {
            output["references"] = json!({"merchantReference": o});
        }
        worldline(
            "refund.refunded",
            "wl-r1",
            "2025-12-02T10:00:00.000+0100",
            json!({"id": "r_1", "paymentId": "300_1", "refundOutput": output}),
        )
    };
    assert!(ignored(&w.ok(&refund(None))).contains("names no order"));
    assert_eq!(
        effect_keys(&w.ok(&refund(Some("1102")))),
        ["t1#order-1102#refund#r_1"]
    );
    let o = w.order("1102");
    assert_eq!((o.invoices.len(), o.refunded_minor), (1, 500));
}

#[test]
fn stripe_razorpay_worldline_and_paystack_report_one_payment_one_invoice() {
    let events = [
        pi_succeeded("1103", "pi_1", 4990, 100),
        razorpay_payment("payment.captured", "pay_3", "1103", 4990, 1_764_583_300),
        worldline_payment(
            "payment.captured",
            "300_3",
            "1103",
            4990,
            "2025-12-01T10:05:00.000+0000",
        ),
        paystack_charge(77, "1103", 4990),
    ];
    let clean = run(&events, &[0, 1, 2, 3], 1);
    for order in [[3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1]] {
        assert_eq!(run(&events, &order, 2).data(), clean.data(), "{order:?}");
    }
    let o = clean.order("1103");
    assert_eq!(
        (o.invoices.len(), o.paid_minor(), o.notifications.len()),
        (1, 4990, 1)
    );
    assert_eq!(
        clean.applied(&order_key(T, "1103")),
        [
            "t1#order-1103#paid",
            "t1#order-1103#payment#paystack#77",
            "t1#order-1103#payment#razorpay#pay_3",
            "t1#order-1103#payment#stripe#pi_1",
            "t1#order-1103#payment#worldline#300_3"
        ]
    );
    let mut w = World::new();
    for e in &events {
        w.ok(e);
        assert_idempotent(&mut w, e);
    }
}
