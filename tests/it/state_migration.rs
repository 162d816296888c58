//! The state table's layout change (moto): a table of the previous layout (hash `pk`
//! with the `by_tenant_kind` index) is refused by `create_state_table` with the way
//! out, and `migrate_state_table` (the `einmal-migrate-state` binary) copies every
//! record into the new layout, safely re-runnable, never over a newer version.

use einmal::domain::state::CommitOne;
use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement,
    KeyType, Projection, ProjectionType, ScalarAttributeType,
};
use einmal::adapters::aws::{create_state_table, migrate_state_table, DynamoStateStore, Migrated};
use einmal::domain::state::{StateKey, StateRecord, StateStore, StateWrite};
use einmal_tests::moto;
use serde_json::json;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

/// The previous layout's table, as `create_state_table` made it before.
async fn old_table(client: &aws_sdk_dynamodb::Client, table: &str) {
    let key = |name: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(t)
            .build()
            .unwrap()
    };
    let attribute = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .unwrap()
    };
    let index = GlobalSecondaryIndex::builder()
        .index_name("by_tenant_kind")
        .key_schema(key("tenant_kind", KeyType::Hash))
        .key_schema(key("pk", KeyType::Range))
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::All)
                .build(),
        )
        .build()
        .unwrap();
    client
        .create_table()
        .table_name(table)
        .attribute_definitions(attribute("pk"))
        .attribute_definitions(attribute("tenant_kind"))
        .key_schema(key("pk", KeyType::Hash))
        .global_secondary_indexes(index)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("old-layout table");
}

/// One record in the previous layout's item format.
fn old_item(r: &StateRecord) -> HashMap<String, AttributeValue> {
    let k = &r.key;
    let mut m = HashMap::from([
        ("pk".to_string(), s(&k.pk())),
        (
            "tenant_kind".to_string(),
            s(&format!("{}#{}", k.tenant, k.kind)),
        ),
        ("tenant".to_string(), s(&k.tenant)),
        ("kind".to_string(), s(&k.kind)),
        ("id".to_string(), s(&k.id)),
        (
            "version".to_string(),
            AttributeValue::N(r.version.to_string()),
        ),
        ("data".to_string(), s(&r.data.to_string())),
        (
            "updated_at_ms".to_string(),
            AttributeValue::N("1700000000000".into()),
        ),
    ]);
    if !r.applied.is_empty() {
        m.insert(
            "applied".to_string(),
            AttributeValue::Ss(r.applied.iter().cloned().collect()),
        );
    }
    m
}

fn record(kind: &str, id: &str, version: u64, applied: &[&str]) -> StateRecord {
    StateRecord {
        key: StateKey::new("shop-1", kind, id),
        version,
        data: json!({"id": id, "v": version}),
        applied: applied.iter().map(|a| a.to_string()).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_layout_table_is_refused_and_migrated_once_and_safely() {
    let sdk = moto::shared().sdk_config().await;
    let client = aws_sdk_dynamodb::Client::new(&sdk);
    let (old, new) = (
        moto::unique_name("einmal-state-v1"),
        moto::unique_name("einmal-state-v2"),
    );
    old_table(&client, &old).await;
    let records = [
        record("order", "1001", 3, &["shop-1#1001#pay#1"]),
        record("order", "1002", 1, &[]),
        record("sku", "SKU-RED-M", 7, &[]),
    ];
    for r in &records {
        client
            .put_item()
            .table_name(&old)
            .set_item(Some(old_item(r)))
            .send()
            .await
            .unwrap();
    }

    let refused = create_state_table(&client, &old)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("einmal-migrate-state"), "{refused}");

    let done = migrate_state_table(&sdk, &old, &new).await.unwrap();
    assert_eq!(
        done,
        Migrated {
            copied: 3,
            already_there: 0
        }
    );
    let store = DynamoStateStore::new(client.clone(), &new);
    let keys: Vec<StateKey> = records.iter().map(|r| r.key.clone()).collect();
    assert_eq!(store.load(&keys).await.unwrap(), records);
    let orders = store.list("shop-1", "order", 0).await.unwrap();
    assert_eq!(orders, records[..2].to_vec());

    // A commit on the new table, then a re-run: nothing is copied over it.
    let mut next = records[1].clone();
    next.version = 2;
    next.data = json!("newer");
    let write = StateWrite {
        record: next.clone(),
        expected_version: 1,
    };
    store.commit(&[write]).await.unwrap();
    let again = migrate_state_table(&sdk, &old, &new).await.unwrap();
    assert_eq!(
        again,
        Migrated {
            copied: 0,
            already_there: 3
        }
    );
    assert_eq!(store.load(&keys[1..2]).await.unwrap(), vec![next]);

    let itself = migrate_state_table(&sdk, &new, &new).await.unwrap_err();
    assert!(itself.to_string().contains("into itself"), "{itself}");
}
