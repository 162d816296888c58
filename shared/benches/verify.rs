//! verify_and_extract per provider next to a bare HMAC-SHA256 of the same ~3 KB body.
//! Target: verify + extract ≤ 1.5× the bare HMAC.
//!
//! cargo bench -p einmal-shared --bench verify -- --warm-up-time 1 --measurement-time 3

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use einmal::config::{Secret, TenantConfig};
use einmal::providers::{self, sig};
use einmal::request::WebhookRequest;

const NOW: i64 = 1_700_000_000;

const STRIPE: &str = r##"{
  "id": "evt_3OEdX2LkdIwHu7ix1bVqO8Gk",
  "object": "event",
  "api_version": "2023-10-16",
  "created": 1699999990,
  "data": {
    "object": {
      "id": "pi_3OEdX2LkdIwHu7ix1cRzJ5Tq",
      "object": "payment_intent",
      "amount": 2000,
      "amount_capturable": 0,
      "amount_details": {"tip": {}},
      "amount_received": 2000,
      "application": null,
      "application_fee_amount": null,
      "automatic_payment_methods": {"allow_redirects": "always", "enabled": true},
      "canceled_at": null,
      "cancellation_reason": null,
      "capture_method": "automatic",
      "client_secret": "pi_3OEdX2LkdIwHu7ix1cRzJ5Tq_secret_9mJ2ZxWq0nQpPp4vW8sQe1R3t",
      "confirmation_method": "automatic",
      "created": 1699999988,
      "currency": "eur",
      "customer": "cus_P2iRvXcZbQw8Ya",
      "description": "Order #100234 \u2014 2 items",
      "invoice": null,
      "last_payment_error": null,
      "latest_charge": "ch_3OEdX2LkdIwHu7ix1aQq9XyZ",
      "livemode": false,
      "metadata": {
        "order_id": "100234",
        "cart_id": "c_8f2e1a",
        "id": "not-the-object-id",
        "customer_segment": "returning",
        "campaign": "winter-sale-2023",
        "fulfillment_center": "BER-2",
        "gift_message": "Alles Gute zum Geburtstag! \u2764 \"Viel Spa\u00df\"",
        "items": "[{\"sku\":\"TSHIRT-BLK-M\",\"qty\":1},{\"sku\":\"MUG-WHT\",\"qty\":1}]"
      },
      "next_action": null,
      "on_behalf_of": null,
      "payment_method": "pm_1OEdX1LkdIwHu7ixQw3ErTyU",
      "payment_method_configuration_details": {"id": "pmc_1NvGqkLkdIwHu7ixA2b3C4d5", "parent": null},
      "payment_method_options": {
        "card": {"installments": null, "mandate_options": null, "network": null, "request_three_d_secure": "automatic"},
        "link": {"persistent_token": null},
        "sepa_debit": {}
      },
      "payment_method_types": ["card", "link", "sepa_debit"],
      "processing": null,
      "receipt_email": "jenny.rosen@example.com",
      "review": null,
      "setup_future_usage": null,
      "shipping": {
        "address": {"city": "Berlin", "country": "DE", "line1": "Unter den Linden 1", "line2": null, "postal_code": "10117", "state": null},
        "carrier": "DHL",
        "name": "Jenny Rosen",
        "phone": "+4930123456",
        "tracking_number": "00340434161094042557"
      },
      "source": null,
      "statement_descriptor": null,
      "statement_descriptor_suffix": null,
      "status": "succeeded",
      "transfer_data": null,
      "transfer_group": null
    }
  },
  "livemode": false,
  "pending_webhooks": 2,
  "request": {"id": "req_Xk3bQ9vW2mPz7L", "idempotency_key": "a1c3e5f7-0b2d-4f6a-8c9e-1d3f5a7b9c0e"},
  "type": "payment_intent.succeeded"
}"##;

const SHOPIFY: &str = r##"{"id":820982911946154508,"admin_graphql_api_id":"gid:\/\/shopify\/Order\/820982911946154508","app_id":null,"browser_ip":"216.191.105.146","buyer_accepts_marketing":true,"cancel_reason":"customer","cancelled_at":null,"cart_token":"68778783ad298f1c80c3bafcddeea02f","checkout_id":901414060,"checkout_token":"bd5a8aa1ecd019dd3520ff791ee3a24c","confirmation_number":"W8JK3ZQ2","confirmed":false,"contact_email":"jon@example.com","created_at":"2024-01-01T10:00:00-05:00","currency":"USD","current_subtotal_price":"398.00","current_total_discounts":"0.00","current_total_price":"398.00","current_total_tax":"0.00","customer_locale":"en","email":"jon@example.com","estimated_taxes":false,"financial_status":"voided","fulfillment_status":"pending","landing_site":null,"name":"#9999","note":null,"note_attributes":[],"number":234,"order_number":1234,"order_status_url":"https:\/\/jsmith.myshopify.com\/548380009\/orders\/123456abcd\/authenticate?key=abcdefg","payment_gateway_names":["visa","bogus"],"phone":null,"presentment_currency":"USD","processed_at":"2024-01-01T10:00:00-05:00","reference":null,"source_name":"web","subtotal_price":"388.00","tags":"tag1, tag2","tax_lines":[],"taxes_included":false,"test":true,"token":"123456abcd","total_discounts":"20.00","total_line_items_price":"398.00","total_price":"388.00","total_tax":"0.00","total_weight":0,"updated_at":"2024-01-01T10:00:00-05:00","user_id":null,"billing_address":{"first_name":"Steve","address1":"123 Shipping Street","phone":"555-555-SHIP","city":"Shippington","zip":"40003","province":"Kentucky","country":"United States","last_name":"Shipper","address2":null,"company":"Shipping Company","latitude":null,"longitude":null,"name":"Steve Shipper","country_code":"US","province_code":"KY"},"customer":{"id":115310627314723954,"email":"john@example.com","created_at":null,"updated_at":null,"first_name":"John","last_name":"Smith","state":"disabled","note":null,"verified_email":true,"multipass_identifier":null,"tax_exempt":false,"phone":null,"currency":"USD","tax_exemptions":[],"admin_graphql_api_id":"gid:\/\/shopify\/Customer\/115310627314723954"},"discount_applications":[],"fulfillments":[],"line_items":[{"id":866550311766439020,"admin_graphql_api_id":"gid:\/\/shopify\/LineItem\/866550311766439020","fulfillable_quantity":1,"fulfillment_service":"manual","gift_card":false,"grams":567,"name":"IPod Nano - 8GB","price":"199.00","product_exists":true,"product_id":632910392,"properties":[],"quantity":1,"requires_shipping":true,"sku":"IPOD2008PINK","taxable":true,"title":"IPod Nano - 8GB","total_discount":"0.00","variant_id":808950810,"variant_title":null,"vendor":null,"tax_lines":[],"duties":[],"discount_allocations":[]},{"id":141249953214522974,"admin_graphql_api_id":"gid:\/\/shopify\/LineItem\/141249953214522974","fulfillable_quantity":1,"fulfillment_service":"manual","gift_card":false,"grams":567,"name":"IPod Nano - 8GB","price":"199.00","product_exists":true,"product_id":632910392,"properties":[],"quantity":1,"requires_shipping":true,"sku":"IPOD2008PINK","taxable":true,"title":"IPod Nano - 8GB","total_discount":"0.00","variant_id":808950810,"variant_title":null,"vendor":null,"tax_lines":[],"duties":[],"discount_allocations":[]}],"payment_terms":null,"refunds":[],"shipping_address":{"first_name":"Steve","address1":"123 Shipping Street","phone":"555-555-SHIP","city":"Shippington","zip":"40003","province":"Kentucky","country":"United States","last_name":"Shipper","address2":null,"company":"Shipping Company","latitude":null,"longitude":null,"name":"Steve Shipper","country_code":"US","province_code":"KY"},"shipping_lines":[{"id":271878346596884015,"carrier_identifier":null,"code":null,"discounted_price":"10.00","price":"10.00","source":"shopify","title":"Generic Shipping","tax_lines":[],"discount_allocations":[]}]}"##;

const GITHUB: &str = r##"{"ref":"refs/heads/main","before":"6113728f27ae82c7b1a177c8d03f9e96e0adf246","after":"0000000000000000000000000000000000000000","repository":{"id":186853002,"node_id":"MDEwOlJlcG9zaXRvcnkxODY4NTMwMDI=","name":"Hello-World","full_name":"Codertocat/Hello-World","private":false,"owner":{"name":"Codertocat","email":"21031067+Codertocat@users.noreply.github.com","login":"Codertocat","id":21031067,"node_id":"MDQ6VXNlcjIxMDMxMDY3","avatar_url":"https://avatars1.githubusercontent.com/u/21031067?v=4","gravatar_id":"","url":"https://api.github.com/users/Codertocat","html_url":"https://github.com/Codertocat","type":"User","site_admin":false},"html_url":"https://github.com/Codertocat/Hello-World","description":null,"fork":false,"url":"https://github.com/Codertocat/Hello-World","created_at":1557933565,"updated_at":"2019-05-15T15:20:41Z","pushed_at":1557933657,"git_url":"git://github.com/Codertocat/Hello-World.git","ssh_url":"git@github.com:Codertocat/Hello-World.git","clone_url":"https://github.com/Codertocat/Hello-World.git","homepage":null,"size":0,"stargazers_count":0,"watchers_count":0,"language":"Ruby","has_issues":true,"has_projects":true,"has_downloads":true,"has_wiki":true,"has_pages":true,"forks_count":1,"open_issues_count":2,"forks":1,"open_issues":2,"watchers":0,"default_branch":"main","stargazers":0,"master_branch":"main"},"pusher":{"name":"Codertocat","email":"21031067+Codertocat@users.noreply.github.com"},"sender":{"login":"Codertocat","id":21031067,"node_id":"MDQ6VXNlcjIxMDMxMDY3","avatar_url":"https://avatars1.githubusercontent.com/u/21031067?v=4","gravatar_id":"","url":"https://api.github.com/users/Codertocat","html_url":"https://github.com/Codertocat","type":"User","site_admin":false},"created":false,"deleted":true,"forced":false,"base_ref":null,"compare":"https://github.com/Codertocat/Hello-World/compare/6113728f27ae...000000000000","commits":[{"id":"6113728f27ae82c7b1a177c8d03f9e96e0adf246","tree_id":"f9f5e2d0b0d1a4c7e9a3b8c6d5e4f3a2b1c0d9e8","distinct":true,"message":"Update README.md\n\nLonger description with \"quotes\" and a tab\there.","timestamp":"2019-05-15T15:20:30Z","url":"https://github.com/Codertocat/Hello-World/commit/6113728f27ae82c7b1a177c8d03f9e96e0adf246","author":{"name":"Codertocat","email":"21031067+Codertocat@users.noreply.github.com","username":"Codertocat"},"committer":{"name":"GitHub","email":"noreply@github.com","username":"web-flow"},"added":[],"removed":[],"modified":["README.md","docs/index.md","src/main.rb"]}],"head_commit":{"id":"6113728f27ae82c7b1a177c8d03f9e96e0adf246","tree_id":"f9f5e2d0b0d1a4c7e9a3b8c6d5e4f3a2b1c0d9e8","distinct":true,"message":"Update README.md","timestamp":"2019-05-15T15:20:30Z","url":"https://github.com/Codertocat/Hello-World/commit/6113728f27ae82c7b1a177c8d03f9e96e0adf246","author":{"name":"Codertocat","email":"21031067+Codertocat@users.noreply.github.com","username":"Codertocat"},"committer":{"name":"GitHub","email":"noreply@github.com","username":"web-flow"},"added":[],"removed":[],"modified":["README.md"]},"installation":{"id":2311213,"node_id":"MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uMjMxMTIxMw=="}}"##;

const STANDARD: &str = r##"{"type":"invoice.paid","timestamp":"2024-11-14T22:13:15.123456Z","data":{"id":"inv_2NmQ7Zt4Kx9","object":"invoice","status":"paid","currency":"eur","amount_due":12900,"amount_paid":12900,"amount_remaining":0,"attempt_count":1,"billing_reason":"subscription_cycle","collection_method":"charge_automatically","customer":{"id":"cus_8ZrT2wQx","email":"billing@example.org","name":"Example GmbH","address":{"line1":"Friedrichstra\u00dfe 68","city":"Berlin","postal_code":"10117","country":"DE"},"tax_ids":[{"type":"eu_vat","value":"DE123456789"}]},"period":{"start":"2024-10-14T22:13:15Z","end":"2024-11-14T22:13:15Z"},"lines":[{"id":"il_1","description":"Pro plan (monthly)","quantity":3,"unit_amount":3900,"amount":11700,"tax_rates":[{"id":"txr_19","percentage":19.0,"inclusive":false}],"metadata":{"seat_ids":"s1,s2,s3"}},{"id":"il_2","description":"Usage: API calls (120,000)","quantity":120000,"unit_amount_decimal":"0.01","amount":1200,"tax_rates":[],"metadata":{}}],"discounts":[],"payment":{"id":"pay_5Yt2Lm8Qw","method":"sepa_debit","mandate":"mdt_7Qw2Er9Ty","last4":"3000","bank":"Sparkasse","settled_at":"2024-11-14T22:13:14Z","fees":[{"type":"processing","amount":35,"currency":"eur"}]},"subscription":{"id":"sub_3Kx8Lp2Nv","plan":"pro","interval":"month","seats":3,"trial_end":null,"cancel_at_period_end":false,"items":[{"id":"si_1","price":"price_pro_monthly","quantity":3},{"id":"si_2","price":"price_api_metered","quantity":null}]},"hosted_invoice_url":"https://pay.example.org/invoices/inv_2NmQ7Zt4Kx9?token=eyJhbGciOiJIUzI1NiJ9.eyJpbnYiOiJpbnZfMk5tUTdadDRLeDkifQ.c2lnbmF0dXJlLW5vdC1yZWFs","invoice_pdf":"https://pay.example.org/invoices/inv_2NmQ7Zt4Kx9.pdf","notes":"Thank you for your business. Payment terms: net 14 days. Questions? Reply to this e-mail or call +49 30 1234567.","custom_fields":[{"name":"PO number","value":"PO-2024-0815"},{"name":"Cost center","value":"CC-42"}],"footer":"Example GmbH \u00b7 Friedrichstra\u00dfe 68 \u00b7 10117 Berlin \u00b7 HRB 123456 B \u00b7 USt-IdNr. DE123456789","dunning":{"attempts":[{"at":"2024-11-14T22:13:12Z","result":"succeeded","network_status":"approved_by_network","risk":{"level":"normal","score":12}}],"next_attempt":null},"tax":{"breakdown":[{"rate":"19%","jurisdiction":"DE","taxable_amount":11700,"amount":2223},{"rate":"0%","jurisdiction":"DE","taxable_amount":1200,"amount":0,"reason":"reverse_charge"}]},"links":{"self":"https://api.example.org/v1/invoices/inv_2NmQ7Zt4Kx9","customer":"https://api.example.org/v1/customers/cus_8ZrT2wQx","subscription":"https://api.example.org/v1/subscriptions/sub_3Kx8Lp2Nv"},"audit":[{"at":"2024-11-14T22:13:10Z","actor":"system","action":"finalized"},{"at":"2024-11-14T22:13:14Z","actor":"system","action":"payment_succeeded"},{"at":"2024-11-14T22:13:15Z","actor":"system","action":"paid"}]}}"##;

fn tenant(provider: &str, secret: &str) -> TenantConfig {
    TenantConfig {
        provider: provider.into(),
        tenant: "bench".into(),
        secrets: vec![Secret::new(secret)],
        tolerance_secs: 300,
        options: Default::default(),
    }
}

fn bench(c: &mut Criterion) {
    let cases = [
        ("stripe", "whsec_bench_secret", STRIPE),
        ("shopify", "shpss_bench_secret", SHOPIFY),
        ("github", "bench secret", GITHUB),
        (
            "standard-webhooks",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            STANDARD,
        ),
    ];
    for (name, secret, body) in cases {
        let provider = providers::lookup(name).expect("known provider");
        let mut t = tenant(name, secret);
        t.options.insert("event".into(), "push".into());
        // The sample order's signed shop (its `order_status_url`) is this tenant's.
        t.options
            .insert("shop_domain".into(), "jsmith.myshopify.com".into());
        let headers = provider
            .sign(
                body.as_bytes(),
                &t,
                "0b7a1f3e-9c2d-4e5f-8a6b-7c8d9e0f1a2b",
                NOW,
            )
            .expect("sign");
        let request = WebhookRequest::post(headers, body.to_owned());
        // Fail loudly rather than benchmark an error path.
        provider
            .verify_and_extract(&request, &t, NOW)
            .expect("benchmark request must verify");
        let mut group = c.benchmark_group(format!("{name} ({} B)", body.len()));
        group.bench_function("bare hmac-sha256", |b| {
            b.iter(|| sig::hmac_sha256(black_box(secret.as_bytes()), &[black_box(body.as_bytes())]))
        });
        group.bench_function("verify_and_extract", |b| {
            b.iter(|| provider.verify_and_extract(black_box(&request), &t, NOW))
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
