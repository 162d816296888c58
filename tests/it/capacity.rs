//! DynamoDB capacity units per webhook, measured: every DynamoDB request the SDK sends
//! while a real webhook goes through ingest and processing (against moto) is captured
//! at the SDK's HTTP layer, with the item it touches read raw from the server right
//! before and right after the request. The units each request consumes follow from
//! DynamoDB's documented rules:
//!
//! - item size = attribute name bytes + value bytes (S: UTF-8 bytes; N: 1 byte per two
//!   significant digits + 1; B: raw bytes; BOOL/NULL: 1; L/M: 3 + elements + 1 each);
//! - writes: 1 WRU per started KB of the larger of the old and the new item (a put of
//!   a new item: the new one); a failed condition still costs the existing item's size;
//!   transactional writes (and condition checks) count double;
//! - GSI writes, for items in the index before or after the write, at the size of the
//!   index entry (keys + projected attributes): entering 1 write, leaving 1, a changed
//!   index key 2 (delete + put), a changed projected attribute 1, nothing else 0;
//! - reads: strongly consistent 1 RRU per started 4 KB of the item (eventually
//!   consistent half), per item in a BatchGetItem, a Query over the summed size,
//!   transactional reads double.
//!
//! The test prints a per-call table and the totals for a Stripe payment and a Shopify
//! order (the samples in `events/samples/domain/`) and a ~3 KB Stripe event, and
//! asserts only structural facts: the body is put once in an item of its own, the
//! event's item stays under 1 KB (its put, a duplicate's rejected put and the finish
//! cost one write unit each), the processor starts from the SQS message (no claim, no
//! inbox read) and writes the inbox once (the finish, which reads nothing back), the
//! sweeper's index costs one write to enter and one to leave, a duplicate costs its
//! rejected put only.
//!
//! `cargo test -p einmal-tests --test it capacity:: -- --nocapture` shows the figures the
//! README's cost section uses.
//!
//! The hot-record tests drive many Shopify `orders/create` of one SKU (5,000 in the
//! suite, 20,000 in `bench/hot-record.sh`: `EINMAL_HOT_RECORD_ORDERS`) through the
//! processor's commit path (decide + guarded commit, no HTTP or inbox around it) on
//! moto and on the embedded store: the SKU's stock is exact, its record after all the
//! orders is the size it was after a tenth of them, and (moto) every measured commit
//! costs the same write units. A read check (a record the decision read and does not write) is
//! costed too: a `ConditionCheck` in the commit's transaction.

use einmal::domain::state::CommitOne;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::interceptors::{
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::types::ProjectionType;
use base64::Engine;
use einmal::adapters::aws::{create_queues, create_tables, AwsStore};
use einmal::adapters::aws::{create_state_table, DynamoStateStore};
use einmal::config::Secret;
use einmal::destinations::http::HttpDestination;
use einmal::destinations::http::HttpSink;
use einmal::destinations::{BodyFormat, DestinationConfig, DestinationKind};
use einmal::domain::reference::{order_key, seed_sku, sku_key, ReferenceDomain, Sku};
use einmal::domain::state::{CommitOutcome, ReadCheck, StateKey, StateStore, StateWrite};
use einmal::domain::DomainEvent;
use einmal::envelope::Envelope;
use einmal::https::HttpsClient;
use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::{EffectOutcome, MessageOutcome, Processor};
use einmal::pipeline::relay::{Relay, RelayDestination};
use einmal::ports::{DeliveryState, Inbox, Queue};
use einmal_tests::moto::{self, OperationLog};
use einmal_tests::scenario::{self, sample, Event, Kind, TENANT};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------
// DynamoDB's size and unit rules

/// Bytes of a number: 1 per two significant digits, plus 1.
fn number_size(n: &str) -> usize {
    let mantissa = n
        .trim_start_matches(['-', '+'])
        .split(['e', 'E'])
        .next()
        .unwrap_or("");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
    significant.max(1).div_ceil(2) + 1
}

fn binary_size(b64: &str) -> usize {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map(|b| b.len())
        .unwrap_or_else(|e| panic!("binary attribute is not base64: {e}"))
}

/// Bytes of one attribute value in DynamoDB's JSON wire format.
fn value_size(v: &Value) -> usize {
    let (kind, inner) = v
        .as_object()
        .and_then(|o| o.iter().next())
        .unwrap_or_else(|| panic!("not an attribute value: {v}"));
    let str_of = |x: &Value| x.as_str().unwrap_or_default().to_string();
    match kind.as_str() {
        "S" => str_of(inner).len(),
        "N" => number_size(&str_of(inner)),
        "B" => binary_size(&str_of(inner)),
        "BOOL" | "NULL" => 1,
        "SS" => inner
            .as_array()
            .unwrap()
            .iter()
            .map(|s| str_of(s).len())
            .sum(),
        "NS" => inner
            .as_array()
            .unwrap()
            .iter()
            .map(|s| number_size(&str_of(s)))
            .sum(),
        "BS" => inner
            .as_array()
            .unwrap()
            .iter()
            .map(|s| binary_size(&str_of(s)))
            .sum(),
        "L" => {
            3 + inner
                .as_array()
                .unwrap()
                .iter()
                .map(|e| value_size(e) + 1)
                .sum::<usize>()
        }
        "M" => {
            3 + inner
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, e)| k.len() + value_size(e) + 1)
                .sum::<usize>()
        }
        other => panic!("unknown attribute type {other}"),
    }
}

/// Bytes of an item (a JSON map of attribute values).
fn item_size(item: &Value) -> usize {
    item.as_object()
        .map(|m| m.iter().map(|(k, v)| k.len() + value_size(v)).sum())
        .unwrap_or(0)
}

fn write_units(bytes: usize) -> f64 {
    bytes.div_ceil(1024).max(1) as f64
}

fn read_units(bytes: usize, consistent: bool) -> f64 {
    let units = bytes.div_ceil(4096).max(1) as f64;
    if consistent {
        units
    } else {
        units / 2.0
    }
}

#[test]
fn sizes_follow_the_documented_rules() {
    // The examples of the developer guide's "Item sizes and formats".
    assert_eq!(number_size("12345"), 4);
    assert_eq!(number_size("-0.000120"), 2);
    assert_eq!(number_size("1700000000000"), 2);
    assert_eq!(number_size("0"), 2);
    let item = json!({"pk": {"S": "abc"}, "n": {"N": "123"}, "b": {"B": "AAEC"},
                      "t": {"BOOL": true}, "l": {"L": [{"S": "x"}, {"N": "1"}]}});
    // pk 2+3, n 1+3, b 1+3, t 1+1, l 1+(3 + (1+1) + (2+1))
    assert_eq!(item_size(&item), 5 + 4 + 4 + 2 + 9);
    assert_eq!(write_units(1024), 1.0);
    assert_eq!(write_units(1025), 2.0);
    assert_eq!(read_units(10, true), 1.0);
    assert_eq!(read_units(4097, false), 1.0);
}

// ---------------------------------------------------------------------------
// Table shapes, from DescribeTable

#[derive(Debug, Clone)]
struct Index {
    name: String,
    keys: Vec<String>,
    /// `None`: ALL; `Some(extra)`: KEYS_ONLY (empty) or INCLUDE.
    projected: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Table {
    role: &'static str,
    keys: Vec<String>,
    indexes: Vec<Index>,
}

async fn describe(client: &aws_sdk_dynamodb::Client, name: &str, role: &'static str) -> Table {
    let out = client
        .describe_table()
        .table_name(name)
        .send()
        .await
        .expect("DescribeTable");
    let t = out.table().expect("table description");
    let keys = t
        .key_schema()
        .iter()
        .map(|k| k.attribute_name().to_string())
        .collect();
    let indexes = t
        .global_secondary_indexes()
        .iter()
        .map(|g| {
            let projection = g.projection().expect("projection");
            let projected = match projection.projection_type() {
                Some(ProjectionType::All) => None,
                Some(ProjectionType::Include) => Some(projection.non_key_attributes().to_vec()),
                _ => Some(Vec::new()),
            };
            Index {
                name: g.index_name().unwrap_or("?").to_string(),
                keys: g
                    .key_schema()
                    .iter()
                    .map(|k| k.attribute_name().to_string())
                    .collect(),
                projected,
            }
        })
        .collect();
    Table {
        role,
        keys,
        indexes,
    }
}

// ---------------------------------------------------------------------------
// Raw reads of the server's items, outside the SDK (so outside the capture)

fn decode_chunked(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size");
        let size_text = std::str::from_utf8(&body[..line_end]).expect("chunk size");
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .expect("hex chunk size");
        body = &body[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// One DynamoDB JSON call to moto over a plain socket.
fn raw_call(endpoint: &str, target: &str, body: &Value) -> Value {
    let addr = endpoint.trim_start_matches("http://");
    let body = body.to_string();
    let mut stream = TcpStream::connect(addr).expect("connect to moto");
    write!(
        stream,
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: DynamoDB_20120810.{target}\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write request");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read response");
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("HTTP response");
    let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
    // HTTP/1.0 from the single-threaded server (it closes every connection).
    assert!(
        head.starts_with("http/1.1 200") || head.starts_with("http/1.0 200"),
        "{target}: {head}"
    );
    let payload = &response[split + 4..];
    let payload = if head.contains("transfer-encoding: chunked") {
        decode_chunked(payload)
    } else {
        payload.to_vec()
    };
    serde_json::from_slice(&payload).expect("JSON response")
}

fn raw_get(endpoint: &str, table: &str, key: &Value) -> Option<Value> {
    let out = raw_call(
        endpoint,
        "GetItem",
        &json!({"TableName": table, "Key": key, "ConsistentRead": true}),
    );
    out.get("Item").cloned()
}

// ---------------------------------------------------------------------------
// The capture

#[derive(Debug, Clone)]
struct Target {
    table: String,
    key: Value,
    /// Put, Update, Delete, ConditionCheck, Get.
    action: &'static str,
    old: Option<Value>,
    new: Option<Value>,
}

#[derive(Debug, Clone)]
struct Call {
    op: String,
    request: Value,
    targets: Vec<Target>,
    consistent: bool,
    status: u16,
    response: Value,
}

#[derive(Clone)]
struct Capture {
    endpoint: String,
    tables: Arc<HashMap<String, Table>>,
    in_flight: Arc<Mutex<Option<Call>>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Capture")
    }
}

impl Capture {
    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    fn key_of(&self, table: &str, item: &Value) -> Value {
        let t = self
            .tables
            .get(table)
            .unwrap_or_else(|| panic!("unknown table {table}"));
        let mut key = serde_json::Map::new();
        for k in &t.keys {
            key.insert(k.clone(), item[k].clone());
        }
        Value::Object(key)
    }

    fn targets(&self, op: &str, request: &Value) -> (Vec<Target>, bool) {
        let target = |table: &Value, key: Value, action| Target {
            table: table.as_str().expect("TableName").to_string(),
            key,
            action,
            old: None,
            new: None,
        };
        let consistent = request["ConsistentRead"].as_bool().unwrap_or(false);
        let targets = match op {
            "PutItem" => vec![target(
                &request["TableName"],
                self.key_of(request["TableName"].as_str().unwrap(), &request["Item"]),
                "Put",
            )],
            "UpdateItem" => vec![target(
                &request["TableName"],
                request["Key"].clone(),
                "Update",
            )],
            "DeleteItem" => vec![target(
                &request["TableName"],
                request["Key"].clone(),
                "Delete",
            )],
            "GetItem" => vec![target(&request["TableName"], request["Key"].clone(), "Get")],
            "BatchGetItem" => {
                let mut out = Vec::new();
                let mut consistent = true;
                for (table, wanted) in request["RequestItems"].as_object().unwrap() {
                    consistent &= wanted["ConsistentRead"].as_bool().unwrap_or(false);
                    for key in wanted["Keys"].as_array().unwrap() {
                        out.push(target(&json!(table), key.clone(), "Get"));
                    }
                }
                return (out, consistent);
            }
            "TransactWriteItems" => request["TransactItems"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    if let Some(put) = t.get("Put") {
                        let table = put["TableName"].as_str().unwrap();
                        target(&put["TableName"], self.key_of(table, &put["Item"]), "Put")
                    } else if let Some(u) = t.get("Update") {
                        target(&u["TableName"], u["Key"].clone(), "Update")
                    } else if let Some(d) = t.get("Delete") {
                        target(&d["TableName"], d["Key"].clone(), "Delete")
                    } else {
                        let c = &t["ConditionCheck"];
                        target(&c["TableName"], c["Key"].clone(), "ConditionCheck")
                    }
                })
                .collect(),
            "TransactGetItems" => request["TransactItems"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| target(&t["Get"]["TableName"], t["Get"]["Key"].clone(), "Get"))
                .collect(),
            // Query / Scan: costed from the response.
            _ => Vec::new(),
        };
        (targets, consistent)
    }
}

impl Intercept for Capture {
    fn name(&self) -> &'static str {
        "einmal-capacity-capture"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let op = moto::operation_of(context).to_string();
        let request = context.request();
        let body = request.body().bytes().expect("a buffered request body");
        let request: Value = serde_json::from_slice(body)?;
        let (mut targets, consistent) = self.targets(&op, &request);
        for t in &mut targets {
            t.old = raw_get(&self.endpoint, &t.table, &t.key);
        }
        let previous = self.in_flight.lock().unwrap().replace(Call {
            op,
            request,
            targets,
            consistent,
            status: 0,
            response: Value::Null,
        });
        assert!(
            previous.is_none(),
            "requests overlap: the capture needs one at a time"
        );
        Ok(())
    }

    fn read_after_execution(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let Some(mut call) = self.in_flight.lock().unwrap().take() else {
            return Ok(());
        };
        if let Some(response) = context.response() {
            call.status = response.status().as_u16();
            call.response = response
                .body()
                .bytes()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
        }
        for t in &mut call.targets {
            t.new = raw_get(&self.endpoint, &t.table, &t.key);
        }
        self.calls.lock().unwrap().push(call);
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Costing

#[derive(Debug, Default, Clone)]
struct Cost {
    label: String,
    table_wru: f64,
    /// (index name, WRU, what happened)
    index: Vec<(String, f64, &'static str)>,
    rru: f64,
    sizes: String,
}

impl Cost {
    fn index_wru(&self) -> f64 {
        self.index.iter().map(|(_, w, _)| w).sum()
    }
    fn index_wru_of(&self, name: &str) -> f64 {
        self.index
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, w, _)| w)
            .sum()
    }
}

fn index_entry(table: &Table, index: &Index, item: &Value) -> Option<Value> {
    let m = item.as_object()?;
    if !index.keys.iter().all(|k| m.contains_key(k)) {
        return None;
    }
    Some(match &index.projected {
        None => item.clone(),
        Some(extra) => {
            let mut entry = serde_json::Map::new();
            for k in table.keys.iter().chain(&index.keys).chain(extra) {
                if let Some(v) = m.get(k) {
                    entry.insert(k.clone(), v.clone());
                }
            }
            Value::Object(entry)
        }
    })
}

/// The GSI writes of one successful item write.
fn index_writes(
    table: &Table,
    old: Option<&Value>,
    new: Option<&Value>,
) -> Vec<(String, f64, &'static str)> {
    let mut out = Vec::new();
    for index in &table.indexes {
        let before = old.and_then(|o| index_entry(table, index, o));
        let after = new.and_then(|n| index_entry(table, index, n));
        let keys_of =
            |e: &Value| -> Vec<Value> { index.keys.iter().map(|k| e[k].clone()).collect() };
        let name = index.name.clone();
        match (before, after) {
            (None, None) => {}
            (None, Some(a)) => out.push((name, write_units(item_size(&a)), "enters")),
            (Some(b), None) => out.push((name, write_units(item_size(&b)), "leaves")),
            (Some(b), Some(a)) if keys_of(&b) != keys_of(&a) => out.push((
                name,
                write_units(item_size(&b)) + write_units(item_size(&a)),
                "key changes",
            )),
            (Some(b), Some(a)) if b != a => {
                out.push((name, write_units(item_size(&a)), "entry changes"))
            }
            (Some(_), Some(_)) => out.push((name, 0.0, "untouched")),
        }
    }
    out
}

fn cost(capture: &Capture, call: &Call) -> Cost {
    let ok = call.status == 200;
    let table_of = |name: &str| -> &Table {
        capture
            .tables
            .get(name)
            .unwrap_or_else(|| panic!("unknown table {name}"))
    };
    let role = |t: &Target| table_of(&t.table).role;
    let size = |v: &Option<Value>| v.as_ref().map(item_size).unwrap_or(0);
    let mut c = Cost::default();
    let transactional = call.op.starts_with("Transact");
    let factor = if transactional { 2.0 } else { 1.0 };
    match call.op.as_str() {
        "PutItem" | "UpdateItem" | "DeleteItem" | "TransactWriteItems" => {
            let mut sizes = Vec::new();
            for t in &call.targets {
                let (old, new) = (size(&t.old), size(&t.new));
                let billed = if !ok || t.action == "ConditionCheck" {
                    old
                } else {
                    old.max(new)
                };
                c.table_wru += factor * write_units(billed);
                sizes.push(format!("{} {} {old}→{new} B", role(t), t.action));
                if ok && t.action != "ConditionCheck" {
                    c.index.extend(index_writes(
                        table_of(&t.table),
                        t.old.as_ref(),
                        t.new.as_ref(),
                    ));
                }
            }
            c.sizes = sizes.join(", ");
        }
        "GetItem" | "BatchGetItem" | "TransactGetItems" => {
            let consistent = call.consistent || transactional;
            let mut sizes = Vec::new();
            for t in &call.targets {
                let s = size(&t.old);
                c.rru += factor * read_units(s, consistent);
                sizes.push(format!("{} {s} B", role(t)));
            }
            c.sizes = sizes.join(", ");
        }
        "Query" | "Scan" => {
            let items = call.response["Items"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let bytes: usize = items.iter().map(item_size).sum();
            let consistent = call.request["ConsistentRead"].as_bool().unwrap_or(false);
            c.rru = read_units(bytes, consistent);
            c.sizes = format!("{} entries, {bytes} B", items.len());
        }
        other => panic!("no capacity rule for {other}"),
    }
    c.label = label(capture, call);
    c
}

fn label(capture: &Capture, call: &Call) -> String {
    let role = call
        .targets
        .first()
        .and_then(|t| capture.tables.get(&t.table))
        .map(|t| t.role)
        .unwrap_or("inbox");
    let what = match (call.op.as_str(), role) {
        ("PutItem", "inbox")
            if call.request["Item"]["pk"]["S"]
                .as_str()
                .is_some_and(|pk| pk.starts_with("body#")) =>
        {
            if call.status == 200 {
                "receiver: body item (written once)".into()
            } else {
                "receiver: body item (already there)".into()
            }
        }
        ("PutItem", "inbox") if call.status == 200 => "receiver: conditional put (new)".into(),
        ("PutItem", "inbox") => "receiver: conditional put (duplicate, condition fails)".into(),
        ("UpdateItem", "inbox") => {
            let expr = call.request["UpdateExpression"].as_str().unwrap_or("");
            if expr.starts_with("SET #state = :processing") {
                "processor: claim (received → processing)".to_string()
            } else if expr.starts_with("SET #lease_until = :until, #owner") {
                "relay: claim (relay lease)".to_string()
            } else if call.request["ConditionExpression"]
                .as_str()
                .is_some_and(|c| c.starts_with("#owner = :owner"))
            {
                "relay: finish (outcomes, lease released)".to_string()
            } else {
                let state = call.request["ExpressionAttributeValues"][":state"]["S"]
                    .as_str()
                    .unwrap_or("?");
                format!("processor: finish (→ {state})")
            }
        }
        ("TransactWriteItems", _) => format!(
            "processor: commit, TransactWriteItems of {}",
            call.targets.len()
        ),
        ("PutItem", "state") => "processor: commit, conditional put".into(),
        ("GetItem", "inbox")
            if call.request["Key"]["pk"]["S"]
                .as_str()
                .is_some_and(|pk| pk.starts_with("body#")) =>
        {
            "relay: body item".into()
        }
        ("GetItem", r) => format!("processor: load {r} record"),
        ("BatchGetItem", r) => format!("processor: load {} {r} records", call.targets.len()),
        (op, r) => format!("{op} ({r})"),
    };
    format!("{what} [{}]", call.op)
}

// ---------------------------------------------------------------------------
// The scenario

struct Rig {
    capture: Capture,
    sqs_ops: OperationLog,
    store: Arc<AwsStore>,
    state: Arc<DynamoStateStore>,
    ingest: Ingestor,
    processor: Processor,
    inbox_index: String,
}

async fn rig() -> Rig {
    rig_with(None).await
}

/// [`rig`] whose processor delivers to an HTTP destination at `url` (every event type
/// of the tenant), the outcome on its finish write.
async fn rig_with(destination: Option<&str>) -> Rig {
    let moto = moto::shared();
    let sdk = moto.sdk_config().await;
    let plain = aws_sdk_dynamodb::Client::new(&sdk);
    let name = moto::unique_name("einmal-cap");
    create_tables(&plain, &name).await.expect("inbox table");
    let names = create_queues(&aws_sdk_sqs::Client::new(&sdk), &name, 3)
        .await
        .expect("queues");
    let state_table = format!("{name}-state");
    create_state_table(&plain, &state_table)
        .await
        .expect("state table");
    let inbox = describe(&plain, &name, "inbox").await;
    let inbox_index = inbox
        .indexes
        .iter()
        .find(|i| i.name.contains("sweep"))
        .map(|i| i.name.clone())
        .expect("the sweeper's index");
    let tables = HashMap::from([
        (name.clone(), inbox),
        (
            state_table.clone(),
            describe(&plain, &state_table, "state").await,
        ),
    ]);
    let capture = Capture {
        endpoint: moto.endpoint.clone(),
        tables: Arc::new(tables),
        in_flight: Arc::default(),
        calls: Arc::default(),
    };
    let sqs_ops = OperationLog::new();
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .interceptor(capture.clone())
            .build(),
    );
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&sdk)
            .interceptor(sqs_ops.clone())
            .build(),
    );
    let store = Arc::new(AwsStore::new(dynamodb.clone(), sqs, names));
    let state = Arc::new(DynamoStateStore::new(dynamodb, state_table));
    let ingest = Ingestor::new(scenario::config(), store.clone(), store.clone());
    let processor = Processor::new(
        store.clone(),
        store.clone(),
        store.clone(),
        state.clone(),
        Arc::new(ReferenceDomain::new()),
    )
    .with_settings(scenario::settings(30_000, 3));
    let processor = match destination {
        None => processor,
        Some(url) => processor.with_relay(Arc::new(http_relay(store.clone(), url))),
    };
    Rig {
        capture,
        sqs_ops,
        store,
        state,
        ingest,
        processor,
        inbox_index,
    }
}

struct Measured {
    name: String,
    ingest: Vec<Cost>,
    process: Vec<Cost>,
    duplicate: Vec<Cost>,
    inbox_item_bytes: usize,
    body_item_bytes: usize,
    body_bytes: usize,
}

fn total(costs: &[Cost]) -> (f64, f64, f64) {
    costs.iter().fold((0.0, 0.0, 0.0), |(t, i, r), c| {
        (t + c.table_wru, i + c.index_wru(), r + c.rru)
    })
}

async fn measure(r: &Rig, name: &str, event: &Event) -> Measured {
    r.capture.take();
    r.sqs_ops.take();
    let request = event.request(&r.ingest.config());
    let response = r.ingest.ingest(event.provider, TENANT, &request).await;
    assert_eq!(response.status, 200, "{name}: {}", response.body);
    let ingest_calls = r.capture.take();
    assert_eq!(
        r.sqs_ops.take(),
        ["SendMessage"],
        "{name}: the receiver's one SQS call"
    );

    // The Lambda path: the event source hands the batch over (its ReceiveMessage and
    // DeleteMessageBatch are SQS requests, not DynamoDB units).
    let batch = r
        .store
        .receive(10, Duration::from_secs(30))
        .await
        .expect("receive");
    assert_eq!(batch.len(), 1, "{name}");
    let outcomes = r.processor.process_batch(&batch, "capacity").await;
    assert!(
        outcomes
            .iter()
            .all(|(_, outcome)| matches!(outcome, MessageOutcome::Ack)),
        "{name}: {outcomes:?}"
    );
    let process_calls = r.capture.take();

    let again = r.ingest.ingest(event.provider, TENANT, &request).await;
    assert_eq!(again.body["duplicate"], true, "{name}: {}", again.body);
    let duplicate_calls = r.capture.take();

    let put_size = |n: usize| {
        ingest_calls
            .iter()
            .filter(|c| c.op == "PutItem")
            .nth(n)
            .and_then(|c| c.targets[0].new.as_ref())
            .map(item_size)
            .expect("a stored item")
    };
    let (inbox_item_bytes, body_item_bytes) = (put_size(0), put_size(1));
    let costs =
        |calls: &[Call]| -> Vec<Cost> { calls.iter().map(|c| cost(&r.capture, c)).collect() };
    let m = Measured {
        name: name.to_string(),
        ingest: costs(&ingest_calls),
        process: costs(&process_calls),
        duplicate: costs(&duplicate_calls),
        inbox_item_bytes,
        body_item_bytes,
        body_bytes: event.body.len(),
    };
    check_structure(r, &m, &ingest_calls, &process_calls, &duplicate_calls);
    m
}

/// Structural facts only, no timings: which calls, which index entries, and the unit
/// counts that follow from the layout (the event's item under 1 KB).
fn check_structure(r: &Rig, m: &Measured, ingest: &[Call], process: &[Call], duplicate: &[Call]) {
    let name = &m.name;
    let ops = |calls: &[Call]| -> Vec<String> { calls.iter().map(|c| c.op.clone()).collect() };
    let inbox = r.store.names().table;
    // The receiver: the event's conditional put, which enters the sweeper's index,
    // then its body item, unconditional and in no index.
    assert_eq!(ops(ingest), ["PutItem", "PutItem"], "{name}");
    assert!(m.ingest[0].label.contains("conditional put"), "{name}");
    assert!(m.ingest[1].label.contains("body item"), "{name}");
    assert!(
        ingest[1].request.get("ConditionExpression").is_none(),
        "{name}"
    );
    assert_eq!(m.ingest[0].index_wru_of(&r.inbox_index), 1.0, "{name}");
    assert_eq!(
        m.ingest[1].index_wru(),
        0.0,
        "{name}: the body item is in no index"
    );
    // The event's item stays under 1 KB: one write unit to put it.
    assert!(
        m.inbox_item_bytes <= 1024,
        "{name}: {} B",
        m.inbox_item_bytes
    );
    assert_eq!(m.ingest[0].table_wru, 1.0, "{name}");
    // A duplicate: its rejected put, one write unit, no index write, no body write.
    assert_eq!(ops(duplicate), ["PutItem"], "{name}");
    assert_ne!(duplicate[0].status, 200, "{name}: the condition fails");
    assert_eq!(m.duplicate[0].table_wru, 1.0, "{name}");
    assert_eq!(m.duplicate[0].index_wru(), 0.0, "{name}");

    // The processor writes the inbox once, the finish: no claim (the message carries
    // the item and its body), and nothing on the inbox is read.
    let inbox_calls: Vec<(&Call, &Cost)> = process
        .iter()
        .zip(&m.process)
        .filter(|(c, _)| c.targets.first().is_some_and(|t| t.table == inbox))
        .collect();
    assert_eq!(
        inbox_calls.len(),
        1,
        "{name}: the finish alone: {:?}",
        ops(process)
    );
    let (finish, finish_cost) = inbox_calls[0];
    assert_eq!(finish.op, "UpdateItem", "{name}");
    assert!(
        finish_cost.label.contains("completed"),
        "{}",
        finish_cost.label
    );
    assert!(
        !process.iter().any(|c| c.request["UpdateExpression"]
            .as_str()
            .is_some_and(|e| e.starts_with("SET #state = :processing"))),
        "{name}: no claim"
    );
    assert_eq!(
        finish_cost.table_wru, 1.0,
        "{name}: the finish of a small item"
    );
    // The terminal finish leaves the sweeper's index.
    assert!(
        finish_cost
            .index
            .iter()
            .any(|(n, w, what)| *n == r.inbox_index && *what == "leaves" && *w == 1.0),
        "{name}: {:?}",
        finish_cost.index
    );
    assert!(finish.request.get("ReturnValues").is_none(), "{name}");
    // Never a scan or a query on the webhook path: nobody waits on these records, so
    // the commit (which reports wait marks) asks for no waiters.
    assert!(
        !process
            .iter()
            .chain(ingest)
            .any(|c| c.op == "Scan" || c.op == "Query"),
        "{name}: {:?}",
        ops(process)
    );
    // The state table has no index: a commit writes no index entry.
    for (c, cost) in process.iter().zip(&m.process) {
        if c.targets.iter().any(|t| t.table == r.state.table()) {
            assert_eq!(cost.index_wru(), 0.0, "{name}: {}", cost.label);
        }
    }
    // The processor's calls besides the waiters' lookups: load, commit, finish.
    let calls = process.iter().filter(|c| c.op != "Query").count();
    assert_eq!(calls, 3, "{name}: {:?}", ops(process));
}

fn print(m: &Measured) {
    println!(
        "\n## {} (body {} B, inbox item {} B, body item {} B)\n",
        m.name, m.body_bytes, m.inbox_item_bytes, m.body_item_bytes
    );
    println!("| call | table WRU | index WRU | RRU | items (old→new) |");
    println!("|---|---|---|---|---|");
    for c in m.ingest.iter().chain(&m.process) {
        let index = if c.index.is_empty() {
            "0".to_string()
        } else {
            let parts: Vec<String> = c
                .index
                .iter()
                .map(|(n, w, what)| format!("{w} ({n} {what})"))
                .collect();
            parts.join(", ")
        };
        println!(
            "| {} | {} | {index} | {} | {} |",
            c.label, c.table_wru, c.rru, c.sizes
        );
    }
    let all: Vec<Cost> = m.ingest.iter().chain(&m.process).cloned().collect();
    let (t, i, r) = total(&all);
    println!(
        "| **per new webhook** | **{t}** | **{i}** | **{r}** | **{} WRU, {r} RRU** |",
        t + i
    );
    let (dt, di, dr) = total(&m.duplicate);
    println!(
        "| duplicate delivery: {} | {dt} | {di} | {dr} | {} |",
        m.duplicate[0].label, m.duplicate[0].sizes
    );
    println!(
        "CAPACITY {}: wru={} rru={} duplicate_wru={} processor_calls={}",
        m.name,
        t + i,
        r,
        dt + di,
        m.process.len()
    );
}

/// The Stripe sample padded to a ~3 KB event with realistic, varied content (a
/// charge's details), as real `payment_intent.succeeded` events are.
fn stripe_3kb() -> Event {
    let base = sample("stripe-payment_intent.succeeded");
    let mut body: Value = serde_json::from_slice(&base.body).expect("JSON");
    let mut charges = Vec::new();
    for i in 0..4 {
        charges.push(json!({
            "id": format!("ch_3Q{i}x8mZ2eZvKYlo2C1a{:04x}", i * 7919),
            "object": "charge",
            "amount": 4990 + i,
            "balance_transaction": format!("txn_3Q{i}x8mZ2eZvKYlo2C0b{:04x}", i * 104_729),
            "billing_details": {"address": {"city": "Berlin", "country": "DE",
                "line1": format!("Hauptstraße {}", 10 + i), "postal_code": format!("1011{i}")},
                "email": format!("customer{i}@example.com"), "name": "Jenny Rosen"},
            "outcome": {"network_status": "approved_by_network", "risk_level": "normal",
                "risk_score": 20 + i, "seller_message": "Payment complete.", "type": "authorized"},
            "payment_method_details": {"card": {"brand": "visa", "exp_month": 8,
                "exp_year": 2030, "last4": format!("42{i}2"), "network": "visa",
                "fingerprint": format!("Xt5EWLLDS7FJjR{i}v")}, "type": "card"},
            "receipt_url": format!("https://pay.stripe.com/receipts/payment/CAcaFwoVYWNjdF8xTTJKVGtMa2RJd0h1{i}"),
        }));
    }
    body["data"]["object"]["charges"] = json!({"object": "list", "data": charges});
    // Another payment of another order: a fresh effect, not a duplicate of the sample's.
    body["data"]["object"]["id"] = json!("pi_demo_3kb");
    body["data"]["object"]["metadata"]["order_id"] = json!("order-1002");
    body["data"]["object"]["description"] = json!("Order order-1002");
    let event = Event {
        body: serde_json::to_vec(&body).expect("JSON"),
        event_id: format!("{}_3kb", base.event_id),
        ..base
    };
    // The event id is the body's `id`.
    let mut value: Value = serde_json::from_slice(&event.body).unwrap();
    value["id"] = json!(event.event_id);
    Event {
        body: serde_json::to_vec(&value).unwrap(),
        ..event
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_and_read_units_per_webhook() {
    let r = rig().await;
    for sku in ["SKU-RED-M", "SKU-BLUE-L"] {
        let outcome = r
            .state
            .commit(&[seed_sku(TENANT, sku, 100)])
            .await
            .expect("seed");
        assert_eq!(outcome, CommitOutcome::Committed);
    }
    let stripe = measure(
        &r,
        "Stripe payment_intent.succeeded (sample)",
        &sample("stripe-payment_intent.succeeded"),
    )
    .await;
    let shopify = measure(
        &r,
        "Shopify orders/create, 2 line items (sample)",
        &sample("shopify-orders-create"),
    )
    .await;
    let big = stripe_3kb();
    assert!(
        (2_800..4_000).contains(&big.body.len()),
        "{}",
        big.body.len()
    );
    let stripe_big = measure(&r, "Stripe payment_intent.succeeded, ~3 KB", &big).await;
    for m in [&stripe, &shopify, &stripe_big] {
        print(m);
    }
    // Every new webhook commits its business record(s): the table shows the full path.
    for m in [&stripe, &shopify, &stripe_big] {
        assert!(
            m.process.iter().any(|c| c.label.contains("commit")),
            "{}: no commit",
            m.name
        );
    }
}

// ---------------------------------------------------------------------------
// Hot records: many orders of one SKU

const HOT_SKU: &str = "SKU-HOT";
const HOT_STOCK: i64 = 1_000_000;

/// How many orders: `EINMAL_HOT_RECORD_ORDERS`, 20,000 in `bench/hot-record.sh`, 5,000 in
/// the suite (moto takes ~11 ms a commit: 20,000 are four minutes of CI). Either way far
/// past what any per-record list would hold before it showed.
fn hot_orders() -> u64 {
    einmal_tests::scenario::sized("EINMAL_HOT_RECORD_ORDERS", 5_000).max(10)
}

/// The orders (1-based) whose record size and commit cost are measured: the first, a
/// tenth, half and the last.
fn measured_orders() -> [u64; 4] {
    let n = hot_orders();
    [1, n / 10, n / 2, n]
}

/// `orders/create` of order `n`: one line of [`HOT_SKU`], quantity 1.
fn hot_order(n: u64) -> (Envelope, Vec<u8>) {
    let id = 1_000_000 + n;
    let body = json!({
        "id": id,
        "name": format!("#{id}"),
        "created_at": "2025-11-29T02:00:00-05:00",
        "updated_at": "2025-11-29T02:00:05-05:00",
        "currency": "EUR",
        "financial_status": "pending",
        "total_price": "10.00",
        "line_items": [{"id": id, "sku": HOT_SKU, "title": "Hot item", "quantity": 1, "price": "10.00"}],
    });
    let envelope = Envelope {
        provider: "shopify".into(),
        tenant: TENANT.into(),
        event_id: format!("hot-{n}"),
        event_type: "orders/create".into(),
        object_id: Some(id.to_string()),
        object_version: Some("2025-11-29T02:00:05-05:00".into()),
        occurred_at: None,
        delivery_id: None,
    };
    (envelope, serde_json::to_vec(&body).expect("JSON"))
}

async fn commit_order(processor: &Processor, n: u64) {
    let (envelope, body) = hot_order(n);
    let event = DomainEvent {
        envelope: &envelope,
        body: &body,
    };
    match processor.decide_and_commit(&event).await {
        Ok(EffectOutcome::Committed(_)) => {}
        other => panic!("order {n}: {other:?}"),
    }
}

fn seed_hot_sku() -> StateWrite {
    seed_sku(TENANT, HOT_SKU, HOT_STOCK)
}

async fn on_hand(state: &dyn StateStore) -> i64 {
    let sku = state.load(&[sku_key(TENANT, HOT_SKU)]).await.expect("load")[0].clone();
    serde_json::from_value::<Sku>(sku.data)
        .expect("a SKU")
        .on_hand
}

/// The value after all orders within 10% of the value after a tenth of them.
fn assert_constant(what: &str, after_tenth: f64, after_all: f64) {
    let ratio = after_all / after_tenth;
    let (tenth, all) = (hot_orders() / 10, hot_orders());
    assert!(
        (0.9..=1.1).contains(&ratio),
        "{what}: {after_tenth} after {tenth} orders, {after_all} after {all}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_hot_sku_record_stays_constant_over_many_orders() {
    let b = Kind::Embedded.backend(5).await;
    assert_eq!(
        b.state.commit(&[seed_hot_sku()]).await.unwrap(),
        CommitOutcome::Committed
    );
    let processor = Processor::new(
        b.inbox.clone(),
        b.processing.clone(),
        b.queue.clone(),
        b.state.clone(),
        Arc::new(ReferenceDomain::new()),
    );
    let (orders, measured) = (hot_orders(), measured_orders());
    let started = Instant::now();
    let mut sizes = Vec::new();
    for n in 1..=orders {
        commit_order(&processor, n).await;
        if measured.contains(&n) {
            let sku = b.state.load(&[sku_key(TENANT, HOT_SKU)]).await.unwrap()[0].clone();
            sizes.push((n, sku.stored_size(), sku.applied.len()));
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(on_hand(&*b.state).await, HOT_STOCK - orders as i64);
    let last_id = (1_000_000 + orders).to_string();
    let last = b.state.load(&[order_key(TENANT, &last_id)]).await.unwrap()[0].clone();
    assert!(last
        .applied
        .contains(&format!("t1#order-{last_id}#stock#SKU-HOT")));
    for (n, bytes, keys) in &sizes {
        println!("HOT-SKU embedded: after {n} orders the SKU record is {bytes} B with {keys} effect keys");
    }
    println!(
        "HOT-SKU embedded: {orders} orders in {:.1} s",
        elapsed.as_secs_f64()
    );
    let size_at = |n: u64| sizes.iter().find(|s| s.0 == n).map(|s| s.1 as f64).unwrap();
    assert_constant("SKU record bytes", size_at(measured[1]), size_at(orders));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_hot_sku_record_and_commit_cost_stay_constant_over_many_orders() {
    let r = rig().await;
    assert_eq!(
        r.state.commit(&[seed_hot_sku()]).await.unwrap(),
        CommitOutcome::Committed
    );
    // Bulk orders go through a client without the capture (it reads every item it
    // touches back from the server); the measured ones through the rig's processor.
    let plain = aws_sdk_dynamodb::Client::new(&moto::shared().sdk_config().await);
    let bulk = Processor::new(
        r.store.clone(),
        r.store.clone(),
        r.store.clone(),
        Arc::new(DynamoStateStore::new(plain.clone(), r.state.table())),
        Arc::new(ReferenceDomain::new()),
    );
    // moto deep-copies the whole table for every TransactWriteItems (its rollback), so
    // a table of thousands of orders makes each commit slower than the last. The bulk
    // orders' records are deleted once committed, 25 per BatchWriteItem: the SKU item,
    // the subject of the test, is untouched, and every order is still a new record
    // when it commits.
    let forget = |orders: Vec<u64>| {
        use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};
        let deletes = orders.into_iter().map(|n| {
            let key = order_key(TENANT, &(1_000_000 + n).to_string());
            let delete = DeleteRequest::builder()
                .key(
                    "tenant_kind",
                    AttributeValue::S(format!("{TENANT}#{}", key.kind)),
                )
                .key("id", AttributeValue::S(key.id))
                .build()
                .expect("a delete request");
            WriteRequest::builder().delete_request(delete).build()
        });
        plain
            .batch_write_item()
            .request_items(r.state.table(), deletes.collect())
            .send()
    };
    let mut committed = Vec::new();
    let sku = sku_key(TENANT, HOT_SKU);
    let sku_item_key = json!({"tenant_kind": {"S": format!("{TENANT}#{}", sku.kind)},
                              "id": {"S": sku.id}});
    let started = Instant::now();
    // (order, SKU item bytes, commit WRU incl. index, load RRU)
    let mut measured: Vec<(u64, usize, f64, f64)> = Vec::new();
    let (orders, measured_at) = (hot_orders(), measured_orders());
    for n in 1..=orders {
        if !measured_at.contains(&n) {
            commit_order(&bulk, n).await;
            committed.push(n);
            if committed.len() == 25 {
                let out = forget(std::mem::take(&mut committed)).await;
                let left = out.expect("delete order records").unprocessed_items;
                assert!(left.unwrap_or_default().is_empty(), "moto left deletes");
            }
            continue;
        }
        r.capture.take();
        commit_order(&r.processor, n).await;
        let calls = r.capture.take();
        let costs: Vec<Cost> = calls.iter().map(|c| cost(&r.capture, c)).collect();
        let ops: Vec<&str> = calls.iter().map(|c| c.op.as_str()).collect();
        // Load and commit; nobody waits on these records, so no waiters Query.
        assert_eq!(ops, ["BatchGetItem", "TransactWriteItems"], "order {n}");
        let commit = &calls[1];
        let actions: Vec<&str> = commit.targets.iter().map(|t| t.action).collect();
        assert_eq!(actions, ["Put", "Put"], "order {n}: the order and the SKU");
        for c in &costs {
            println!(
                "HOT-SKU aws order {n}: {} | table {} WRU | index {} WRU | {} RRU | {}",
                c.label,
                c.table_wru,
                c.index_wru(),
                c.rru,
                c.sizes
            );
        }
        let sku_bytes = item_size(
            &raw_get(&r.capture.endpoint, r.state.table(), &sku_item_key).expect("the SKU item"),
        );
        measured.push((
            n,
            sku_bytes,
            costs[1].table_wru + costs[1].index_wru(),
            costs[0].rru,
        ));
    }
    let elapsed = started.elapsed();
    assert_eq!(on_hand(&*r.state).await, HOT_STOCK - orders as i64);
    for (n, bytes, wru, rru) in &measured {
        println!("HOT-SKU aws: order {n}: SKU item {bytes} B, commit {wru} WRU, load {rru} RRU");
    }
    println!(
        "HOT-SKU aws: {orders} orders on moto in {:.1} s",
        elapsed.as_secs_f64()
    );
    let at = |n: u64| measured.iter().find(|m| m.0 == n).unwrap();
    assert_constant(
        "SKU item bytes",
        at(measured_at[1]).1 as f64,
        at(orders).1 as f64,
    );
    // Write units per commit: the same at every measured order.
    let first = at(1).2;
    assert!(
        measured.iter().all(|m| m.2 == first && m.3 == at(1).3),
        "commit cost changed with the number of orders: {measured:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_check_costs_a_condition_check_in_the_commit() {
    let r = rig().await;
    let (read, written) = (
        StateKey::new(TENANT, "plan", "y"),
        StateKey::new(TENANT, "plan", "x"),
    );
    let create = |key: &StateKey| StateWrite {
        record: einmal::domain::state::StateRecord {
            version: 1,
            data: json!({"active": false}),
            ..einmal::domain::state::StateRecord::missing(key.clone())
        },
        expected_version: 0,
    };
    r.state.commit(&[create(&read)]).await.unwrap();
    r.capture.take();
    let check = ReadCheck {
        key: read.clone(),
        version: 1,
    };
    let out = r.state.commit_checked(&[create(&written)], &[check]).await;
    assert_eq!(out.unwrap(), CommitOutcome::Committed);
    let calls = r.capture.take();
    assert_eq!(calls.len(), 1);
    let actions: Vec<&str> = calls[0].targets.iter().map(|t| t.action).collect();
    assert_eq!(actions, ["Put", "ConditionCheck"]);
    let c = cost(&r.capture, &calls[0]);
    println!(
        "READ-CHECK: {} | table {} WRU | index {} WRU | {}",
        c.label,
        c.table_wru,
        c.index_wru(),
        c.sizes
    );
    // Without the check this would be one PutItem of 1 WRU (+ its index entry); the
    // check makes it a transaction: 2 WRU for the put, 2 for the checked item.
    assert_eq!(c.table_wru, 4.0, "{}", c.sizes);
}

// ---------------------------------------------------------------------------
// Delivered events: one HTTP destination (a real axum server on loopback)

/// A destination that answers 500 to its first `failures` calls, then 200.
struct Hook {
    url: String,
    calls: Arc<std::sync::atomic::AtomicUsize>,
}

async fn hook(failures: usize) -> Hook {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("destination binds");
    let url = format!("http://{}/hooks", listener.local_addr().expect("address"));
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < failures {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    tokio::spawn(async move {
        axum::serve(listener, app)
            .await
            .expect("destination serves");
    });
    Hook { url, calls }
}

impl Hook {
    fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The relay of one HTTP destination `shop-app` for every event of the tenant; jitter
/// 0, so a failed attempt is due again at once.
fn http_relay(store: Arc<AwsStore>, url: &str) -> Relay {
    let config = DestinationConfig {
        name: "shop-app".into(),
        tenant: TENANT.into(),
        provider: None,
        events: vec!["*".into()],
        outputs: Vec::new(),
        ordered: false,
        max_attempts: 10,
        max_age: Duration::from_secs(3 * 86_400),
        kind: DestinationKind::Http(HttpDestination {
            url: url.into(),
            secrets: vec![Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")],
            body: BodyFormat::Original,
            timeout: Duration::from_secs(10),
            allow_private: false,
        }),
    };
    let sink = HttpSink::new(
        match &config.kind {
            DestinationKind::Http(http) => http,
            _ => unreachable!("an HTTP destination"),
        },
        &HttpsClient::new(),
    )
    .expect("the HTTP sink builds");
    Relay::new(
        store,
        vec![RelayDestination {
            config,
            sink: Arc::new(sink),
        }],
    )
    .with_jitter(|| 0.0)
}

fn sum_wru(costs: &[Cost]) -> f64 {
    let (t, i, _) = total(costs);
    t + i
}

/// Calls and write units per delivered event (DynamoDB, on moto), against the same
/// event without a destination: the delivery rides on the processor's finish write, so
/// a delivered event makes no extra call and at most one extra write unit (the bigger
/// finish item); a failed-then-retried one pays the relay's index entry, its claim and
/// its finish, and one Query per shard of the relay's index per `run_due`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_and_write_units_per_delivered_event() {
    let event = || sample("stripe-payment_intent.succeeded");
    let plain = rig().await;
    let base = measure(&plain, "no destination", &event()).await;

    let up = hook(0).await;
    let delivered = rig_with(Some(&up.url)).await;
    let happy = measure(&delivered, "one HTTP destination, answers 200", &event()).await;
    assert_eq!(up.calls(), 1, "one delivery");
    let item = delivered
        .store
        .get(&event().inbox_key())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(item.deliveries.len(), 1);
    assert_eq!(item.deliveries[0].state, DeliveryState::Delivered);
    assert_eq!(item.deliveries[0].last_status, Some(200));
    assert_eq!(
        item.relay_due_ms, None,
        "nothing pending: not in the relay's index"
    );
    // The same calls as without a destination; the outcome rides on the finish write.
    let ops = |m: &Measured| -> Vec<String> {
        m.ingest
            .iter()
            .chain(&m.process)
            .map(|c| c.label.clone())
            .collect()
    };
    assert_eq!(ops(&happy), ops(&base));
    let all = |m: &Measured| -> Vec<Cost> { m.ingest.iter().chain(&m.process).cloned().collect() };
    let extra = sum_wru(&all(&happy)) - sum_wru(&all(&base));
    assert!(
        (0.0..=1.0).contains(&extra),
        "a delivered event costs {extra} extra WRU"
    );
    let reads = |m: &Measured| total(&all(m)).2;
    assert_eq!(reads(&happy), reads(&base), "no extra read");

    // Fails once: pending on the finish (entering the relay's index), then one run_due
    // of the relay (the sweeper's pass) delivers it.
    let flaky = hook(1).await;
    let retried = rig_with(Some(&flaky.url)).await;
    let first = measure(&retried, "one HTTP destination, fails once", &event()).await;
    assert_eq!(flaky.calls(), 1);
    let item = retried
        .store
        .get(&event().inbox_key())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(item.deliveries[0].state, DeliveryState::Pending);
    assert_eq!(item.deliveries[0].last_status, Some(500));
    assert!(item.relay_due_ms.is_some());
    let finish = first
        .process
        .iter()
        .find(|c| c.label.contains("finish"))
        .expect("the finish");
    assert_eq!(
        finish.index_wru_of("by_relay_due"),
        1.0,
        "{:?}",
        finish.index
    );
    assert_eq!(ops(&first), ops(&base));

    retried.capture.take();
    let relay = retried.processor.relay().expect("a relay").clone();
    let report = relay
        .run_due(einmal::time::now_millis(), 10)
        .await
        .expect("run_due");
    assert_eq!((report.items, report.attempts), (1, 1), "{report:?}");
    assert_eq!(flaky.calls(), 2, "delivered on the retry");
    let run_calls = retried.capture.take();
    let run: Vec<Cost> = run_calls
        .iter()
        .map(|c| cost(&retried.capture, c))
        .collect();
    let queries = run_calls.iter().filter(|c| c.op == "Query").count();
    let writes: Vec<&Cost> = run
        .iter()
        .zip(&run_calls)
        .filter(|(_, c)| c.op != "Query")
        .map(|(cost, _)| cost)
        .collect();
    assert_eq!(queries, 16, "one Query per shard of by_relay_due");
    assert!(
        run_calls
            .iter()
            .filter(|c| c.op == "Query")
            .all(|c| c.request["IndexName"] == "by_relay_due"),
        "only the relay's index"
    );
    let labels: Vec<&str> = writes.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "relay: claim (relay lease) [UpdateItem]",
            "relay: body item [GetItem]",
            "relay: finish (outcomes, lease released) [UpdateItem]"
        ]
    );
    assert_eq!(
        writes[0].index_wru(),
        0.0,
        "the claim leaves the index alone"
    );
    assert_eq!(
        writes[2].index_wru_of("by_relay_due"),
        1.0,
        "delivered: it leaves"
    );
    let item = retried
        .store
        .get(&event().inbox_key())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(item.deliveries[0].state, DeliveryState::Delivered);
    assert_eq!(item.deliveries[0].attempts, 2);
    assert_eq!(item.relay_due_ms, None);

    for m in [&base, &happy, &first] {
        print(m);
    }
    println!("\n## relay run_due: the retry of the event above (delivered)\n");
    println!("| call | table WRU | index WRU | RRU | items (old→new) |");
    println!("|---|---|---|---|---|");
    let (mut qn, mut qr) = (0, 0.0);
    for (c, call) in run.iter().zip(&run_calls) {
        if call.op == "Query" {
            qn += 1;
            qr += c.rru;
            continue;
        }
        println!(
            "| {} | {} | {} | {} | {} |",
            c.label,
            c.table_wru,
            c.index_wru(),
            c.rru,
            c.sizes
        );
    }
    println!("| {qn} × Query by_relay_due | 0 | 0 | {qr} | per run_due, not per event |");
    let retry_wru = sum_wru(&run) + finish.index_wru_of("by_relay_due");
    println!(
        "DELIVERY-CAPACITY: base wru={} rru={} calls={}; delivered (200) wru={} rru={} calls={} (extra wru {extra}); \
         failed-then-retried: processing wru={} + retry wru={} (index enter {} + claim + finish), \
         retry calls={} ({qn} Query + {} UpdateItem), retry rru={qr}",
        sum_wru(&all(&base)),
        reads(&base),
        ops(&base).len(),
        sum_wru(&all(&happy)),
        reads(&happy),
        ops(&happy).len(),
        sum_wru(&all(&first)),
        retry_wru,
        finish.index_wru_of("by_relay_due"),
        run_calls.len(),
        writes.len(),
    );
}
