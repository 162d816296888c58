//! The PostgreSQL destination against a real server (`einmal_tests::postgres`): one
//! server for the module, a database per test; the restart test has a server of its
//! own. Each delivery puts the key into `einmal_applied` and the event row into the
//! user's table in one transaction, so every event lands exactly once.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use einmal::adapters::postgres::{PostgresError, PostgresSink};
use einmal::config::Secret;
use einmal::destinations::config::{
    PostgresDestination, DEFAULT_MAX_AGE_SECS, DEFAULT_MAX_ATTEMPTS,
};
use einmal::destinations::{
    delivery_key, Delivered, DestinationConfig, DestinationKind, Message, Sink, SinkError,
};
use einmal_tests::postgres::PgServer;

const TABLE: &str = "einmal_events";

fn destination(dsn: &str, table: &str) -> PostgresDestination {
    PostgresDestination {
        dsn: Secret::new(dsn),
        table: table.to_owned(),
        tls: false,
        pool_size: 2,
    }
}

fn message(n: usize, event_type: &str, body: &[u8]) -> Message {
    let event_id = format!("evt_{n}");
    Message {
        key: delivery_key("shop-db", "stripe", "demo", &event_id),
        destination: "shop-db".into(),
        provider: "stripe".into(),
        tenant: "demo".into(),
        event_id,
        event_type: event_type.into(),
        object_id: Some(format!("pi_{n}")),
        object_version: Some(format!("{}", 1_700_000_000 + n)),
        occurred_at: Some(1_700_000_000 + n as i64),
        body: body.to_vec(),
        content_type: "application/json".into(),
    }
}

fn json_message(n: usize) -> Message {
    let body =
        format!(r#"{{"id":"evt_{n}","type":"payment_intent.succeeded","data":{{"amount":{n}}}}}"#);
    message(n, "payment_intent.succeeded", body.as_bytes())
}

/// As the relay builds it: from the destination's configuration.
async fn sink(server: &PgServer, db: &str, table: &str) -> PostgresSink {
    let config = DestinationConfig {
        name: "shop-db".into(),
        tenant: "demo".into(),
        provider: None,
        events: vec!["*".into()],
        outputs: Vec::new(),
        ordered: false,
        max_attempts: DEFAULT_MAX_ATTEMPTS,
        max_age: Duration::from_secs(DEFAULT_MAX_AGE_SECS),
        kind: DestinationKind::Postgres(destination(&server.dsn(db), table)),
    };
    PostgresSink::for_destination(&config)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

fn applied() -> Delivered {
    Delivered::default()
}

fn duplicate() -> Delivered {
    Delivered {
        status: None,
        note: Some("duplicate".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_delivery_is_one_row_with_every_column_and_a_jsonb_body() {
    let Some(server) = PgServer::shared_or_skip() else {
        return;
    };
    let db = server.create_database("one_row").await;
    let sink = sink(server, &db, TABLE).await;
    let first = json_message(7);
    assert_eq!(sink.deliver(&first).await, Ok(applied()));

    let client = server.client(&db).await;
    let row = client
        .query_one(
            "SELECT key, provider, tenant, event_type, event_id, object_id, object_version, \
                    extract(epoch FROM occurred_at)::bigint, body->>'id', \
                    (body->'data'->>'amount')::int, jsonb_typeof(body), \
                    received_at <= now() AND received_at > now() - interval '1 hour' \
             FROM einmal_events",
            &[],
        )
        .await
        .expect("the event row");
    assert_eq!(row.get::<_, String>(0), first.key);
    assert_eq!(row.get::<_, String>(1), "stripe");
    assert_eq!(row.get::<_, String>(2), "demo");
    assert_eq!(row.get::<_, String>(3), "payment_intent.succeeded");
    assert_eq!(row.get::<_, String>(4), "evt_7");
    assert_eq!(row.get::<_, Option<String>>(5).as_deref(), Some("pi_7"));
    assert_eq!(
        row.get::<_, Option<String>>(6).as_deref(),
        Some("1700000007")
    );
    assert_eq!(row.get::<_, Option<i64>>(7), Some(1_700_000_007));
    assert_eq!(row.get::<_, String>(8), "evt_7");
    assert_eq!(row.get::<_, i32>(9), 7);
    assert_eq!(row.get::<_, String>(10), "object");
    assert!(
        row.get::<_, bool>(11),
        "received_at is the time of the write"
    );
    let key = client
        .query_one("SELECT key, destination FROM einmal_applied", &[])
        .await
        .expect("the key row");
    assert_eq!(key.get::<_, String>(0), first.key);
    assert_eq!(key.get::<_, String>(1), "shop-db");

    // The same message again (a retry, a replay): nothing new.
    assert_eq!(sink.deliver(&first).await, Ok(duplicate()));
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_events").await,
        1
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_applied").await,
        1
    );

    // A form post is kept as one JSON string; no object id, version or time: NULLs.
    let mut form = message(8, "charge.refunded", b"a=1&b=two");
    form.object_id = None;
    form.object_version = None;
    form.occurred_at = None;
    assert_eq!(sink.deliver(&form).await, Ok(applied()));
    let row = client
        .query_one(
            "SELECT jsonb_typeof(body), body #>> '{}', object_id, object_version, occurred_at IS NULL \
             FROM einmal_events WHERE event_id = 'evt_8'",
            &[],
        )
        .await
        .expect("the form row");
    assert_eq!(row.get::<_, String>(0), "string");
    assert_eq!(row.get::<_, String>(1), "a=1&b=two");
    assert_eq!(row.get::<_, Option<String>>(2), None);
    assert_eq!(row.get::<_, Option<String>>(3), None);
    assert!(row.get::<_, bool>(4));
}

/// jsonb cannot hold U+0000 (SQLSTATE 22P05): such a body is written anyway, the
/// exact bytes in `body_raw` and `body` with U+FFFD in its place; a replay is a
/// duplicate. A table made before `body_raw` existed gets the column at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_with_u0000_is_written_losslessly() {
    let Some(server) = PgServer::shared_or_skip() else {
        return;
    };
    let db = server.create_database("nul_body").await;
    let client = server.client(&db).await;
    // The table as einmal created it before `body_raw`.
    client
        .batch_execute(
            "CREATE TABLE einmal_events (key text PRIMARY KEY, provider text NOT NULL, \
             tenant text NOT NULL, event_type text NOT NULL, event_id text NOT NULL, \
             object_id text, object_version text, occurred_at timestamptz, \
             body jsonb NOT NULL, received_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .unwrap();
    let sink = sink(server, &db, TABLE).await;
    let body = br#"{"id":"evt_1","note":"gift\u0000wrap"}"#;
    let nul = message(1, "charge.succeeded", body);
    assert_eq!(sink.deliver(&nul).await, Ok(applied()));
    assert_eq!(sink.deliver(&nul).await, Ok(duplicate()));
    assert_eq!(sink.deliver(&json_message(2)).await, Ok(applied()));
    let row = client
        .query_one(
            "SELECT body->>'id', body->>'note', body_raw FROM einmal_events WHERE event_id = 'evt_1'",
            &[],
        )
        .await
        .expect("the row with U+0000 was written");
    assert_eq!(row.get::<_, String>(0), "evt_1");
    assert_eq!(row.get::<_, String>(1), "gift\u{fffd}wrap");
    assert_eq!(row.get::<_, Option<Vec<u8>>>(2).as_deref(), Some(&body[..]));
    let plain = client
        .query_one(
            "SELECT body_raw IS NULL FROM einmal_events WHERE event_id = 'evt_2'",
            &[],
        )
        .await
        .unwrap();
    assert!(
        plain.get::<_, bool>(0),
        "body_raw is only for bodies jsonb cannot hold"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schema_qualified_table_gets_its_key_table_beside_it() {
    let Some(server) = PgServer::shared_or_skip() else {
        return;
    };
    let db = server.create_database("qualified").await;
    let client = server.client(&db).await;
    client.batch_execute("CREATE SCHEMA shop").await.unwrap();
    let sink = sink(server, &db, "shop.events").await;
    assert_eq!(sink.deliver(&json_message(1)).await, Ok(applied()));
    assert_eq!(count(&client, "SELECT count(*) FROM shop.events").await, 1);
    assert_eq!(
        count(&client, "SELECT count(*) FROM shop.einmal_applied").await,
        1
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        )
        .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_dsn_delivers_too() {
    let Some(server) = PgServer::shared_or_skip() else {
        return;
    };
    let db = server.create_database("socket").await;
    let sink = PostgresSink::connect("shop-db", &destination(&server.socket_dsn(&db), TABLE))
        .await
        .unwrap_or_else(|e| panic!("connect over the socket: {e}"));
    assert_eq!(sink.deliver(&json_message(1)).await, Ok(applied()));
    let client = server.client(&db).await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_events").await,
        1
    );
}

/// Eight relays (eight sinks, each with its own pool, started together so that their
/// schema checks race too) deliver the same 200 messages, each in its own order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_relays_delivering_the_same_200_messages_write_200_rows() {
    let Some(server) = PgServer::shared_or_skip() else {
        return;
    };
    let db = server.create_database("eight_relays").await;
    let messages: Arc<Vec<Message>> = Arc::new((0..200).map(json_message).collect());
    let dsn = server.dsn(&db);
    let mut relays = tokio::task::JoinSet::new();
    for relay in 0..8usize {
        let messages = messages.clone();
        let config = destination(&dsn, TABLE);
        relays.spawn(async move {
            let sink = PostgresSink::connect("shop-db", &config)
                .await
                .unwrap_or_else(|e| panic!("relay {relay}: {e}"));
            // Interleaved: each relay starts elsewhere, odd relays walk backwards.
            let mut order: Vec<usize> = (0..200).map(|i| (i + relay * 25) % 200).collect();
            if relay % 2 == 1 {
                order.reverse();
            }
            let mut applied = Vec::new();
            for i in order {
                match sink.deliver(&messages[i]).await {
                    Ok(Delivered { note: None, .. }) => applied.push(i),
                    Ok(Delivered {
                        note: Some(note), ..
                    }) => assert_eq!(note, "duplicate"),
                    Err(e) => panic!("relay {relay}, message {i}: {e}"),
                }
            }
            applied
        });
    }
    let mut applied = Vec::new();
    while let Some(done) = relays.join_next().await {
        applied.extend(done.expect("a relay task"));
    }
    // Exactly one relay applied each message; the other seven saw a duplicate.
    applied.sort_unstable();
    assert_eq!(applied, (0..200).collect::<Vec<_>>());

    let client = server.client(&db).await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_events").await,
        200
    );
    assert_eq!(
        count(&client, "SELECT count(DISTINCT key) FROM einmal_events").await,
        200
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_applied").await,
        200
    );
    let keys: BTreeSet<String> = client
        .query("SELECT key FROM einmal_applied", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let expected: BTreeSet<String> = messages.iter().map(|m| m.key.clone()).collect();
    assert_eq!(keys, expected);
}

/// A transaction that fails after its key insert leaves no key behind, so once the
/// cause is fixed the retry applies, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_after_the_key_insert_leaves_no_key_and_the_retry_applies_once() {
    let Some(server) = PgServer::shared_or_skip() else {
        return;
    };
    let db = server.create_database("rollback").await;
    let sink = sink(server, &db, TABLE).await;
    let client = server.client(&db).await;
    client
        .batch_execute(
            "ALTER TABLE einmal_events ADD CONSTRAINT no_refunds CHECK (event_type <> 'charge.refunded'); \
             CREATE FUNCTION einmal_test_guard() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF NEW.event_type = 'order.locked' THEN \
                 RAISE EXCEPTION 'busy %', NEW.body USING ERRCODE = '55P03'; END IF; \
               IF NEW.event_type = 'order.rejected' THEN RAISE EXCEPTION 'no %', NEW.body; END IF; \
               RETURN NEW; END $$; \
             CREATE TRIGGER guard BEFORE INSERT ON einmal_events \
               FOR EACH ROW EXECUTE FUNCTION einmal_test_guard();",
        )
        .await
        .expect("constraint and trigger");
    let secret_body = br#"{"card":"4242-secret-4242"}"#;

    let refund = message(1, "charge.refunded", secret_body);
    let Err(SinkError::Permanent { detail, .. }) = sink.deliver(&refund).await else {
        panic!("a CHECK violation is permanent");
    };
    assert!(
        detail.contains("23514") && detail.contains("no_refunds"),
        "{detail}"
    );
    assert!(
        !detail.contains("4242"),
        "no row data in the detail: {detail}"
    );

    // A trigger asking for a retry gets one; its plain RAISE is permanent.
    let locked = message(2, "order.locked", secret_body);
    let Err(SinkError::Retry { detail, .. }) = sink.deliver(&locked).await else {
        panic!("SQLSTATE 55P03 is a retry");
    };
    assert!(
        detail.contains("55P03") && !detail.contains("4242"),
        "{detail}"
    );
    let rejected = message(3, "order.rejected", secret_body);
    let Err(SinkError::Permanent { detail, .. }) = sink.deliver(&rejected).await else {
        panic!("a trigger's RAISE (P0001) is permanent");
    };
    assert!(
        detail.contains("P0001") && !detail.contains("4242"),
        "{detail}"
    );

    // Nothing of the three stayed: no key, no row.
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_applied").await,
        0
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_events").await,
        0
    );
    // The sink's pooled connections are fine after the rollbacks.
    assert_eq!(sink.deliver(&json_message(4)).await, Ok(applied()));

    client
        .batch_execute("ALTER TABLE einmal_events DROP CONSTRAINT no_refunds; DROP TRIGGER guard ON einmal_events")
        .await
        .unwrap();
    for failed in [&refund, &locked, &rejected] {
        assert_eq!(sink.deliver(failed).await, Ok(applied()));
        assert_eq!(sink.deliver(failed).await, Ok(duplicate()));
    }
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_events").await,
        4
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_applied").await,
        4
    );
}

/// The guide's grants (docs/destinations-postgres.md, "Privileges") are exactly enough:
/// a role holding only them starts, delivers once, reports a retry as a duplicate, and
/// the guide's trigger (`SECURITY DEFINER`, owned by the shop's role) updates a shop
/// table the sink's role has no right on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_role_with_exactly_the_documented_grants_delivers() {
    let Some(server) = PgServer::shared_or_skip() else {
        return;
    };
    let db = server.create_database("grants").await;
    // The tables as einmal creates them, by the database's owner.
    drop(sink(server, &db, TABLE).await);
    let client = server.client(&db).await;
    let role = format!("sink_{db}");
    client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; \
             GRANT USAGE ON SCHEMA public TO {role}; \
             GRANT SELECT, INSERT ON einmal_applied TO {role}; \
             GRANT INSERT ON einmal_events TO {role}; \
             CREATE TABLE orders (payment_intent text PRIMARY KEY, paid boolean NOT NULL); \
             INSERT INTO orders VALUES ('pi_1', false); \
             CREATE FUNCTION on_einmal_event() RETURNS trigger LANGUAGE plpgsql \
               SECURITY DEFINER SET search_path = public AS $$ \
             BEGIN \
               IF NEW.event_type = 'payment_intent.succeeded' THEN \
                 UPDATE orders SET paid = true WHERE payment_intent = NEW.object_id; \
               END IF; \
               RETURN NEW; \
             END $$; \
             CREATE TRIGGER einmal_event AFTER INSERT ON einmal_events \
               FOR EACH ROW EXECUTE FUNCTION on_einmal_event();"
        ))
        .await
        .unwrap();
    let dsn = format!(
        "host=127.0.0.1 port={} user={role} dbname={db}",
        server.port
    );
    let restricted = PostgresSink::connect("shop-db", &destination(&dsn, TABLE))
        .await
        .expect("the documented grants are enough to start");
    let paid = json_message(1);
    assert_eq!(restricted.deliver(&paid).await, Ok(applied()));
    assert_eq!(restricted.deliver(&paid).await, Ok(duplicate()));
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_events").await,
        1
    );
    let order = client
        .query_one("SELECT paid FROM orders WHERE payment_intent = 'pi_1'", &[])
        .await
        .unwrap();
    assert!(order.get::<_, bool>(0), "the trigger updated the order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_table_and_a_missing_privilege_are_permanent() {
    let Some(server) = PgServer::shared_or_skip() else {
        return;
    };
    let db = server.create_database("permanent").await;
    let owner = sink(server, &db, TABLE).await;
    let client = server.client(&db).await;
    // A role that may connect and read, but not insert.
    let role = format!("reader_{db}");
    client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT ON einmal_events, einmal_applied TO {role}"
        ))
        .await
        .unwrap();
    let reader_dsn = format!(
        "host=127.0.0.1 port={} user={role} dbname={db}",
        server.port
    );
    let reader = PostgresSink::connect("shop-db", &destination(&reader_dsn, TABLE))
        .await
        .expect("the tables exist, so a reader starts");
    let Err(SinkError::Permanent { detail, .. }) = reader.deliver(&json_message(1)).await else {
        panic!("a missing INSERT privilege is permanent");
    };
    assert!(detail.contains("42501"), "{detail}");

    client
        .batch_execute("DROP TABLE einmal_events")
        .await
        .unwrap();
    let Err(SinkError::Permanent { detail, .. }) = owner.deliver(&json_message(2)).await else {
        panic!("a table dropped after the start is permanent");
    };
    assert!(detail.contains("42P01"), "{detail}");
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_applied").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_server_is_a_retry_and_after_the_restart_it_is_delivered_once() {
    let Some(mut server) = PgServer::private_or_skip() else {
        return;
    };
    let db = server.create_database("restart").await;
    let sink = sink(&server, &db, TABLE).await;
    let (before, during) = (json_message(1), json_message(2));
    assert_eq!(sink.deliver(&before).await, Ok(applied()));

    tokio::task::block_in_place(|| server.stop());
    let Err(SinkError::Retry { detail, .. }) = sink.deliver(&during).await else {
        panic!("a stopped server is a retry");
    };
    assert!(!detail.is_empty());

    tokio::task::block_in_place(|| server.restart());
    assert_eq!(sink.deliver(&during).await, Ok(applied()));
    assert_eq!(sink.deliver(&during).await, Ok(duplicate()));
    assert_eq!(sink.deliver(&before).await, Ok(duplicate()));
    let client = server.client(&db).await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_events").await,
        2
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_applied").await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_dsn_fails_at_connect_naming_the_destination_without_the_password() {
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for dsn in [
        format!("postgresql://shop:hunter2-secret@127.0.0.1:{port}/orders"),
        "host=db.invalid user=shop password=hunter2-secret dbname=orders".to_string(),
    ] {
        let error = PostgresSink::connect("shop-db", &destination(&dsn, TABLE))
            .await
            .expect_err("nothing listens there");
        assert!(matches!(error, PostgresError::Connect { .. }), "{error:?}");
        let text = error.to_string();
        assert!(
            text.contains("`shop-db`") && text.contains("/orders as shop"),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "no password in: {text}");
        assert!(!format!("{error:?}").contains("hunter2"), "{error:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_is_refused_naming_the_destination() {
    let dsn = "host=127.0.0.1 port=1 user=shop password=hunter2-secret dbname=orders";
    for table in [
        "Events",
        "events; DROP TABLE x",
        "a.b.c",
        "einmal_applied",
        "",
    ] {
        let error = PostgresSink::connect("shop-db", &destination(dsn, table))
            .await
            .expect_err("a bad table name");
        assert!(
            matches!(error, PostgresError::InvalidTable { .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("`shop-db`"), "{error}");
    }
    let mut zero = destination(dsn, TABLE);
    zero.pool_size = 0;
    let cases = [
        (zero, "pool_size"),
        (
            destination("host=127.0.0.1 port=abc password=hunter2-secret", TABLE),
            "invalid connection string",
        ),
        (
            destination(&format!("{dsn} sslmode=require"), TABLE),
            "sslmode=require but tls = false",
        ),
        (
            destination("user=shop password=hunter2-secret", TABLE),
            "no host",
        ),
    ];
    for (config, expected) in cases {
        let error = PostgresSink::connect("shop-db", &config)
            .await
            .expect_err(expected);
        let text = error.to_string();
        assert!(matches!(error, PostgresError::Config { .. }), "{error:?}");
        assert!(
            text.contains("`shop-db`") && text.contains(expected),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }
}

/// `tls = true` requires TLS: a server without it is refused at start, not used in
/// plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_required_when_configured() {
    let Some(server) = PgServer::shared_or_skip() else {
        return;
    };
    let mut config = destination(&server.dsn("postgres"), TABLE);
    config.tls = true;
    let error = PostgresSink::connect("shop-db", &config)
        .await
        .expect_err("the test server has no TLS");
    assert!(matches!(error, PostgresError::Connect { .. }), "{error:?}");
    assert!(error.to_string().contains("TLS"), "{error}");
}

/// A deferred constraint trigger fails the `COMMIT` itself: a retry (the sink cannot
/// tell a refused commit from a lost one), and nothing was applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_commit_is_a_retry_and_applies_nothing() {
    let Some(server) = PgServer::shared_or_skip() else {
        return;
    };
    let db = server.create_database("commit").await;
    let sink = sink(server, &db, TABLE).await;
    let client = server.client(&db).await;
    client
        .batch_execute(
            "CREATE FUNCTION einmal_test_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
               BEGIN RAISE EXCEPTION 'refused at commit'; END $$; \
             CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON einmal_events \
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION einmal_test_at_commit();",
        )
        .await
        .expect("deferred trigger");
    let event = json_message(1);
    let Err(SinkError::Retry { detail, .. }) = sink.deliver(&event).await else {
        panic!("a failed commit is a retry");
    };
    assert!(detail.starts_with("commit: "), "{detail}");
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_applied").await,
        0
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_events").await,
        0
    );

    client
        .batch_execute("DROP TRIGGER at_commit ON einmal_events")
        .await
        .unwrap();
    assert_eq!(sink.deliver(&event).await, Ok(applied()));
    assert_eq!(sink.deliver(&event).await, Ok(duplicate()));
    assert_eq!(
        count(&client, "SELECT count(*) FROM einmal_events").await,
        1
    );
}
