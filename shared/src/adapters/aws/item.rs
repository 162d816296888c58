//! Inbox item <-> DynamoDB attribute map.
//!
//! One flat item per event; optional envelope fields are omitted when absent
//! (DynamoDB has no use for NULL placeholders and they cost bytes).
//!
//! The compressed body lives in an item of its own ([`body_key`]), written once at
//! receive and never rewritten: every write of the event's item costs its size in
//! KB, so keeping the body out keeps the put, a rejected duplicate put and the
//! finish at one write unit each (a ~3 KB event's item was 1.1 KB with the body,
//! ~0.4 KB without). Items of the earlier layout (body inline, no [`BODY_ITEM`]
//! marker) still decode with their body, so a mixed-version deployment processes
//! them.

use std::collections::HashMap;
use std::str::FromStr;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use crate::envelope::{Envelope, InboxKey};
use crate::ports::{DeliveryState, DeliveryStatus, InboxItem, InboxState, Source, Waiting};

pub(crate) const PK: &str = "pk";
pub(crate) const PROVIDER: &str = "provider";
pub(crate) const TENANT: &str = "tenant";
pub(crate) const EVENT_ID: &str = "event_id";
pub(crate) const EVENT_TYPE: &str = "event_type";
pub(crate) const OBJECT_ID: &str = "object_id";
pub(crate) const OBJECT_VERSION: &str = "object_version";
pub(crate) const OCCURRED_AT: &str = "occurred_at";
pub(crate) const DELIVERY_ID: &str = "delivery_id";
pub(crate) const STATE: &str = "state";
pub(crate) const SOURCE: &str = "source";
pub(crate) const ATTEMPTS: &str = "attempts";
pub(crate) const RECEIVED_AT_MS: &str = "received_at_ms";
pub(crate) const UPDATED_AT_MS: &str = "updated_at_ms";
/// The table's TTL attribute (Unix seconds).
pub(crate) const EXPIRES_AT: &str = "expires_at";
pub(crate) const ENQUEUE_FAILED: &str = "enqueue_failed";
pub(crate) const LAST_ERROR: &str = "last_error";
pub(crate) const LAST_ERROR_CLASS: &str = "last_error_class";
pub(crate) const LEASE_UNTIL_MS: &str = "lease_until_ms";
pub(crate) const LEASE_OWNER: &str = "lease_owner";
pub(crate) const RESULT: &str = "result";
pub(crate) const BODY_ENCODING: &str = "body_encoding";
pub(crate) const BODY_LEN: &str = "body_len";
pub(crate) const BODY: &str = "body";
/// `true` on an event item whose body is in its own item ([`body_key`]); absent on
/// items of the earlier layout, which carry [`BODY`] inline.
pub(crate) const BODY_ITEM: &str = "body_item";
/// The pk prefix of the body items. No event key starts with it: event keys start
/// with a provider name.
pub(crate) const BODY_PREFIX: &str = "body#";

/// The key of `pk`'s body item.
pub(crate) fn body_key(pk: &InboxKey) -> String {
    format!("{BODY_PREFIX}{}", pk.as_str())
}

/// The body item of `item`: its key, the compressed body and the event's TTL, so the
/// table's TTL deletes it with the event. Nothing indexes it.
pub(crate) fn encode_body(item: &InboxItem) -> Item {
    Item::from([
        (PK.to_string(), AttributeValue::S(body_key(&item.key))),
        (
            BODY.to_string(),
            AttributeValue::B(Blob::new(item.body.clone())),
        ),
        (EXPIRES_AT.to_string(), n_attr(item.expires_at)),
    ])
}

/// The compressed body of a body item.
pub(crate) fn decode_body(mut m: Item) -> Result<Vec<u8>, String> {
    let pk = match m.remove(PK) {
        Some(AttributeValue::S(pk)) => pk,
        _ => return Err("body item without a string pk".to_string()),
    };
    Decoder { pk: &pk, m: &mut m }.binary(BODY)
}
/// Set by the sweeper's dead-letter marking of an item whose pointer reached the DLQ
/// ([`crate::ports::InboxProcessing::mark_dead_letter`]): the `updated_at_ms` of the
/// item as the sweeper read it, so a run that began from that same item (another
/// message's, committing while the sweeper marked) still finishes it. Removed by the
/// next finish or requeue. Not part of [`InboxItem`].
pub(crate) const DEAD_OVER: &str = "dead_over";
/// Set by the conditional put only: a random id of that `put_new` call (64 bits, hex),
/// so a retried PutItem whose first attempt stored the item (its response was lost)
/// recognises the item as its own. Not part of [`InboxItem`]; nothing else reads it.
pub(crate) const PUT_ID: &str = "put_id";

/// A fresh [`PUT_ID`] value.
pub(crate) fn new_put_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The [`PUT_ID`] of a stored item, if it has one.
pub(crate) fn put_id(m: &Item) -> Option<&str> {
    match m.get(PUT_ID) {
        Some(AttributeValue::S(id)) => Some(id),
        _ => None,
    }
}
/// Sparse attribute, the hash key of the [`BY_SWEEP_SHARD`] index: one of
/// [`SWEEP_SHARDS`] shard names (`p#0` .. `p#15`, from a hash of `pk`) while the item
/// is pending (not terminal), absent once it is `completed`, `ignored` or
/// `dead_letter`. Its value never changes while the item is pending, so a claim or
/// a retry never writes the index; only entering (put, replay) and leaving (terminal
/// finish, dead letter) do.
pub(crate) const SWEEP_SHARD: &str = "sweep_shard";
/// The sweeper's sparse GSI: hash [`SWEEP_SHARD`], range [`RECEIVED_AT_MS`] (which
/// never changes), KEYS_ONLY: an entry is the key, the shard and the receive time,
/// about 100 bytes, one write unit to enter and one to leave.
pub(crate) const BY_SWEEP_SHARD: &str = "by_sweep_shard";
/// Hash partitions of [`BY_SWEEP_SHARD`]: a single constant hash key would put every
/// pending item on one index partition (about 1,000 writes/s before it throttles the
/// table); 16 spread the writes, and a sweep costs one Query per shard.
pub(crate) const SWEEP_SHARDS: u32 = 16;

/// The [`SWEEP_SHARD`] value of an item: FNV-1a of `pk`, modulo [`SWEEP_SHARDS`].
/// Stable across releases (writers and the sweeper must agree), cheap, and spread
/// well enough for keys that differ in their event id.
pub(crate) fn sweep_shard(pk: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in pk.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("p#{}", hash % SWEEP_SHARDS)
}

/// Every shard name, for the sweeper's queries.
pub(crate) fn sweep_shards() -> impl Iterator<Item = String> {
    (0..SWEEP_SHARDS).map(|n| format!("p#{n}"))
}

/// Whether an item in `state` belongs in the sweeper's index: every non-terminal state
/// but `waiting` (parked items are in [`BY_WAIT_SHARD`] instead, so that thousands of
/// them never slow the search for stuck items).
pub(crate) fn in_sweep_index(state: InboxState) -> bool {
    !state.is_terminal() && state != InboxState::Waiting
}

/// [`crate::ports::Waiting::on`]: the prerequisite record's pk. Sparse: present while
/// the item waits (and while a woken waiter is processed again), removed when it
/// moves on. The range key of [`BY_WAIT_SHARD`].
pub(crate) const WAIT_ON: &str = "wait_on";
/// [`crate::ports::Waiting::since_ms`], projected into [`BY_WAIT_SHARD`].
pub(crate) const WAITING_SINCE_MS: &str = "waiting_since_ms";
/// Sparse hash key of [`BY_WAIT_SHARD`]: [`sweep_shard`] of [`WAIT_ON`], so all
/// waiters of one record are in one shard (one Query wakes them) and the sweeper
/// reads the parked items with one Query per shard.
pub(crate) const WAIT_SHARD: &str = "wait_shard";
/// The waiters' sparse GSI: hash [`WAIT_SHARD`], range [`WAIT_ON`], projecting
/// `state`, `updated_at_ms` and `waiting_since_ms` (INCLUDE), so neither the wake nor
/// the sweeper reads the items. Parking writes one entry, leaving deletes it.
pub(crate) const BY_WAIT_SHARD: &str = "by_wait_shard";
/// The non-key attributes [`BY_WAIT_SHARD`] projects.
pub(crate) const WAIT_INDEX_PROJECTION: [&str; 3] = [STATE, UPDATED_AT_MS, WAITING_SINCE_MS];

/// Sparse attribute, the hash key of the [`BY_HINT`] index: `{provider}#{tenant}` on
/// the hints of GoPay and Klarna push ([`crate::ports::hint_scope`]), absent on every
/// other item. Set by the put only; no update ever touches it.
pub(crate) const HINT_SCOPE: &str = "hint_scope";
/// The reconciler's sparse GSI: hash [`HINT_SCOPE`], range [`RECEIVED_AT_MS`],
/// KEYS_ONLY: state changes of a hint never write the index (only the put and the TTL
/// delete do); the reconciler reads the few attributes it needs with BatchGetItem.
pub(crate) const BY_HINT: &str = "by_hint";

/// The relay's delivery record ([`crate::ports::DeliveryStatus`]): a list of maps, one
/// per destination (and per domain output), each with its last attempt only, so its
/// size is bounded by the tenant's destinations, never by the attempts.
pub(crate) const DELIVERIES: &str = "deliveries";
/// Sparse: the earliest next attempt (Unix ms) of a pending delivery; absent when
/// nothing is pending. The range key of [`BY_RELAY_DUE`].
pub(crate) const RELAY_DUE_MS: &str = "relay_due_ms";
/// Sparse hash key of [`BY_RELAY_DUE`]: [`sweep_shard`] of the item's pk, present
/// exactly while [`RELAY_DUE_MS`] is (written and removed together).
pub(crate) const RELAY_SHARD: &str = "relay_shard";
/// The relay's lease on an item whose deliveries it retries (Unix ms) and its holder:
/// separate from the processor's lease, which is gone once the item is finished.
pub(crate) const RELAY_LEASE_UNTIL_MS: &str = "relay_lease_until_ms";
pub(crate) const RELAY_OWNER: &str = "relay_owner";
/// The relay's sparse GSI: hash [`RELAY_SHARD`], range [`RELAY_DUE_MS`], projecting
/// [`RELAY_INDEX_PROJECTION`] (INCLUDE). Only items with a pending delivery are in it:
/// the happy path (every destination answered at once) never writes it; a failed
/// delivery enters it (one write), each retry moves it (the range key changes: a
/// delete and a put) and the last outcome removes it (one delete).
pub(crate) const BY_RELAY_DUE: &str = "by_relay_due";
/// Sparse: when the item's latest dead-lettered delivery was given up
/// ([`crate::ports::dead_lettered_at`]); absent when none is dead-lettered. The range key
/// of [`BY_RELAY_DEAD`].
pub(crate) const RELAY_DEAD_MS: &str = "relay_dead_ms";
/// Sparse hash key of [`BY_RELAY_DEAD`]: [`sweep_shard`] of the item's pk, present
/// exactly while [`RELAY_DEAD_MS`] is (written and removed together).
pub(crate) const RELAY_DEAD_SHARD: &str = "relay_dead_shard";
/// The dead-lettered deliveries' sparse GSI: hash [`RELAY_DEAD_SHARD`], range
/// [`RELAY_DEAD_MS`], projecting [`RELAY_INDEX_PROJECTION`] (INCLUDE) like
/// [`BY_RELAY_DUE`], so `einmal dlq list`, the console and the dead-letter gauges read
/// the index alone. Only items with a dead-lettered delivery are in it: a delivery
/// that is given up enters it (one write), a replay that schedules it again takes it
/// out (one delete); the happy path never writes it.
pub(crate) const BY_RELAY_DEAD: &str = "by_relay_dead";
/// What [`BY_RELAY_DUE`] (and [`BY_RELAY_DEAD`]) projects: the deliveries and the fields an [`InboxItem`]
/// needs, all but the body and the processing bookkeeping, so the backlog metrics
/// ([`crate::ports::InboxRelay::relay_pending`]) read the index alone. An entry is a
/// few hundred bytes (one write unit) for one destination.
pub const RELAY_INDEX_PROJECTION: [&str; 16] = [
    DELIVERIES,
    PROVIDER,
    TENANT,
    EVENT_ID,
    EVENT_TYPE,
    OBJECT_ID,
    OBJECT_VERSION,
    OCCURRED_AT,
    STATE,
    SOURCE,
    ATTEMPTS,
    RECEIVED_AT_MS,
    UPDATED_AT_MS,
    EXPIRES_AT,
    BODY_ENCODING,
    BODY_LEN,
];

// The attributes of one entry of [`DELIVERIES`] (a map each). Short names: the list
// is rewritten by every finish and retry, and its bytes count in every write unit.
const D_DESTINATION: &str = "dest";
const D_KEY: &str = "key";
const D_STATE: &str = "state";
const D_ATTEMPTS: &str = "attempts";
const D_STATUS: &str = "status";
const D_LATENCY_MS: &str = "latency_ms";
const D_AT_MS: &str = "at_ms";
const D_NEXT_MS: &str = "next_ms";
const D_DETAIL: &str = "detail";
/// A domain output as its JSON text: the output's data is arbitrary JSON, whose
/// numbers need not fit DynamoDB's number type.
const D_OUTPUT: &str = "output";
const D_RELEASE_OWED: &str = "release_owed";

fn delivery_state(s: &str) -> Option<DeliveryState> {
    [
        DeliveryState::Delivered,
        DeliveryState::Pending,
        DeliveryState::DeadLetter,
        DeliveryState::Superseded,
    ]
    .into_iter()
    .find(|st| st.as_str() == s)
}

/// [`DELIVERIES`]' value: a list of maps, optional fields omitted.
pub(crate) fn deliveries_attr(deliveries: &[DeliveryStatus]) -> AttributeValue {
    AttributeValue::L(deliveries.iter().map(delivery_attr).collect())
}

fn delivery_attr(d: &DeliveryStatus) -> AttributeValue {
    let mut m = Item::with_capacity(10);
    m.insert(D_DESTINATION.into(), s_attr(&d.destination));
    m.insert(D_KEY.into(), s_attr(&d.key));
    m.insert(D_STATE.into(), s_attr(d.state.as_str()));
    m.insert(D_ATTEMPTS.into(), n_attr(i64::from(d.attempts)));
    let numbers = [
        (D_STATUS, d.last_status.map(i64::from)),
        (
            D_LATENCY_MS,
            d.last_latency_ms
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
        ),
        (D_AT_MS, d.last_attempt_ms),
        (D_NEXT_MS, d.next_attempt_ms),
    ];
    for (name, value) in numbers {
        if let Some(v) = value {
            m.insert(name.into(), n_attr(v));
        }
    }
    if let Some(detail) = &d.detail {
        m.insert(D_DETAIL.into(), s_attr(detail));
    }
    if let Some(output) = &d.output {
        // An Output is plain data: serialising it cannot fail.
        let json = serde_json::to_string(output).unwrap_or_default();
        m.insert(D_OUTPUT.into(), AttributeValue::S(json));
    }
    if d.release_owed {
        m.insert(D_RELEASE_OWED.into(), AttributeValue::Bool(true));
    }
    AttributeValue::M(m)
}

fn decode_deliveries(pk: &str, value: AttributeValue) -> Result<Vec<DeliveryStatus>, String> {
    let bad = |why: String| format!("item {pk}: attribute {DELIVERIES}: {why}");
    let AttributeValue::L(list) = value else {
        return Err(bad("expected a list".into()));
    };
    list.into_iter()
        .enumerate()
        .map(|(i, entry)| {
            let AttributeValue::M(mut m) = entry else {
                return Err(bad(format!("entry {i} is not a map")));
            };
            let entry_pk = format!("{pk} {DELIVERIES}[{i}]");
            let mut d = Decoder {
                pk: &entry_pk,
                m: &mut m,
            };
            let state = d.string(D_STATE)?;
            Ok(DeliveryStatus {
                destination: d.string(D_DESTINATION)?,
                key: d.string(D_KEY)?,
                state: delivery_state(&state).ok_or_else(|| d.bad(D_STATE, "unknown state"))?,
                attempts: d.number(D_ATTEMPTS)?,
                last_status: d.opt_number(D_STATUS)?,
                last_latency_ms: d.opt_number(D_LATENCY_MS)?,
                last_attempt_ms: d.opt_number(D_AT_MS)?,
                next_attempt_ms: d.opt_number(D_NEXT_MS)?,
                detail: d.opt_string(D_DETAIL)?,
                output: match d.opt_string(D_OUTPUT)? {
                    None => None,
                    Some(json) => Some(
                        serde_json::from_str(&json)
                            .map_err(|_| d.bad(D_OUTPUT, "not an output's JSON"))?,
                    ),
                },
                release_owed: d.opt_bool(D_RELEASE_OWED)?.unwrap_or(false),
            })
        })
        .collect()
}

pub(crate) type Item = HashMap<String, AttributeValue>;

/// The pk prefix of the relay's ordering cursors (small items in the inbox table, one
/// per destination and object; see `cursor.rs`). No event key starts with it: event
/// keys start with a provider name.
pub(crate) const CURSOR_PREFIX: &str = "cursor#";

/// The pk prefix of PayPal's verified certificates (`certs.rs`). No event key starts
/// with it: event keys start with a provider name.
pub(crate) const CERT_PREFIX: &str = "cert#";

/// Whether a raw item of the inbox table is an event (not an ordering cursor, a body
/// item, a sweeper item or a certificate).
pub(crate) fn is_event(m: &Item) -> bool {
    !matches!(m.get(PK), Some(AttributeValue::S(pk))
        if pk.starts_with(CURSOR_PREFIX)
            || pk.starts_with(BODY_PREFIX)
            || pk.starts_with(SWEEP_PREFIX)
            || pk.starts_with(CERT_PREFIX))
}

/// The pk prefix of the sweeper's own items (no event key starts with it).
pub(crate) const SWEEP_PREFIX: &str = "sweep#";
/// The sweeper's waiting cursor: where its last pass over the waiters' index stopped
/// (`waiting.rs`). No TTL, no index attributes.
pub(crate) const WAITING_CURSOR: &str = "sweep#waiting-cursor";

/// A string attribute.
pub(crate) fn s_attr(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

/// A number attribute.
pub(crate) fn n_attr(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// The event's item without its body ([`BODY_ITEM`] set): [`encode_body`] holds it.
pub(crate) fn encode(item: &InboxItem) -> Item {
    let env = &item.envelope;
    let mut m = Item::with_capacity(24);
    let s = |v: &str| AttributeValue::S(v.to_string());
    let n = |v: String| AttributeValue::N(v);
    m.insert(PK.into(), s(item.key.as_str()));
    m.insert(PROVIDER.into(), s(&env.provider));
    m.insert(TENANT.into(), s(&env.tenant));
    m.insert(EVENT_ID.into(), s(&env.event_id));
    m.insert(EVENT_TYPE.into(), s(&env.event_type));
    if let Some(v) = &env.object_id {
        m.insert(OBJECT_ID.into(), s(v));
    }
    if let Some(v) = &env.object_version {
        m.insert(OBJECT_VERSION.into(), s(v));
    }
    if let Some(v) = env.occurred_at {
        m.insert(OCCURRED_AT.into(), n(v.to_string()));
    }
    if let Some(v) = &env.delivery_id {
        m.insert(DELIVERY_ID.into(), s(v));
    }
    m.insert(STATE.into(), s(item.state.as_str()));
    if in_sweep_index(item.state) {
        m.insert(SWEEP_SHARD.into(), s(&sweep_shard(item.key.as_str())));
    }
    m.insert(SOURCE.into(), s(item.source.as_str()));
    if let Some(scope) = crate::ports::hint_scope(env) {
        m.insert(HINT_SCOPE.into(), s(&scope));
    }
    m.insert(ATTEMPTS.into(), n(item.attempts.to_string()));
    m.insert(RECEIVED_AT_MS.into(), n(item.received_at_ms.to_string()));
    m.insert(UPDATED_AT_MS.into(), n(item.updated_at_ms.to_string()));
    m.insert(EXPIRES_AT.into(), n(item.expires_at.to_string()));
    m.insert(
        ENQUEUE_FAILED.into(),
        AttributeValue::Bool(item.enqueue_failed),
    );
    if let Some(v) = &item.last_error {
        m.insert(LAST_ERROR.into(), s(v));
    }
    if let Some(v) = &item.last_error_class {
        m.insert(LAST_ERROR_CLASS.into(), s(v));
    }
    if let Some(v) = item.lease_until_ms {
        m.insert(LEASE_UNTIL_MS.into(), n(v.to_string()));
    }
    if let Some(v) = &item.lease_owner {
        m.insert(LEASE_OWNER.into(), s(v));
    }
    if let Some(v) = &item.result {
        m.insert(RESULT.into(), s(v));
    }
    m.insert(BODY_ENCODING.into(), s(&item.body_encoding));
    m.insert(BODY_LEN.into(), n(item.body_len.to_string()));
    m.insert(BODY_ITEM.into(), AttributeValue::Bool(true));
    if let Some(w) = &item.waiting {
        m.insert(WAIT_ON.into(), s(&w.on));
        m.insert(WAIT_SHARD.into(), s(&sweep_shard(&w.on)));
        m.insert(WAITING_SINCE_MS.into(), n(w.since_ms.to_string()));
    }
    if !item.deliveries.is_empty() {
        m.insert(DELIVERIES.into(), deliveries_attr(&item.deliveries));
    }
    if let Some(due) = item.relay_due_ms {
        m.insert(RELAY_DUE_MS.into(), n(due.to_string()));
        m.insert(RELAY_SHARD.into(), s(&sweep_shard(item.key.as_str())));
    }
    if let Some(dead) = crate::ports::dead_lettered_at(&item.deliveries, item.updated_at_ms) {
        m.insert(RELAY_DEAD_MS.into(), n(dead.to_string()));
        m.insert(RELAY_DEAD_SHARD.into(), s(&sweep_shard(item.key.as_str())));
    }
    m
}

/// Decode a stored item. The error names the key and the attribute, never values.
/// The body comes back empty when it is in its own item ([`BODY_ITEM`]; a compressed
/// body is never empty, a zstd frame has a header), inline for the earlier layout.
pub(crate) fn decode(m: Item) -> Result<InboxItem, String> {
    decode_with(m, true)
}

/// Decode an entry of [`BY_RELAY_DUE`] ([`RELAY_INDEX_PROJECTION`]): the body and the
/// bookkeeping the index does not project come back empty.
/// The item an `UpdateItem` with `ReturnValues=ALL_NEW` returned (`what` names the
/// write in the error when DynamoDB returned none).
pub(crate) fn decode_returned(
    attributes: Option<Item>,
    what: &str,
    key: &InboxKey,
) -> Result<InboxItem, crate::ports::StoreError> {
    let item = attributes.ok_or_else(|| {
        crate::ports::StoreError::Unavailable(format!(
            "DynamoDB UpdateItem: {what} of {key} returned no item"
        ))
    })?;
    decode(item).map_err(crate::ports::StoreError::Corrupt)
}

pub(crate) fn decode_projected(m: Item) -> Result<InboxItem, String> {
    decode_with(m, false)
}

fn decode_with(mut m: Item, with_body: bool) -> Result<InboxItem, String> {
    let pk = match m.remove(PK) {
        Some(AttributeValue::S(pk)) => pk,
        _ => return Err("item without a string pk".to_string()),
    };
    let mut d = Decoder { pk: &pk, m: &mut m };
    let envelope = Envelope {
        provider: d.string(PROVIDER)?,
        tenant: d.string(TENANT)?,
        event_id: d.string(EVENT_ID)?,
        event_type: d.string(EVENT_TYPE)?,
        object_id: d.opt_string(OBJECT_ID)?,
        object_version: d.opt_string(OBJECT_VERSION)?,
        occurred_at: d.opt_number(OCCURRED_AT)?,
        delivery_id: d.opt_string(DELIVERY_ID)?,
    };
    let state_str = d.string(STATE)?;
    let state = InboxState::parse(&state_str).ok_or_else(|| d.bad(STATE, "unknown state"))?;
    let source_str = d.string(SOURCE)?;
    let source = Source::parse(&source_str).ok_or_else(|| d.bad(SOURCE, "unknown source"))?;
    let item = InboxItem {
        envelope,
        state,
        source,
        attempts: d.number(ATTEMPTS)?,
        received_at_ms: d.number(RECEIVED_AT_MS)?,
        updated_at_ms: d.number(UPDATED_AT_MS)?,
        expires_at: d.number(EXPIRES_AT)?,
        enqueue_failed: d.opt_bool(ENQUEUE_FAILED)?.unwrap_or(false),
        last_error: d.opt_string(LAST_ERROR)?,
        last_error_class: d.opt_string(LAST_ERROR_CLASS)?,
        lease_until_ms: d.opt_number(LEASE_UNTIL_MS)?,
        lease_owner: d.opt_string(LEASE_OWNER)?,
        result: d.opt_string(RESULT)?,
        body_encoding: d.string(BODY_ENCODING)?,
        body_len: d.number(BODY_LEN)?,
        body: match (with_body, d.opt_bool(BODY_ITEM)?) {
            (false, _) | (true, Some(true)) => {
                d.m.remove(BODY);
                Vec::new()
            }
            (true, _) => d.binary(BODY)?,
        },
        waiting: match (d.opt_string(WAIT_ON)?, d.opt_number(WAITING_SINCE_MS)?) {
            (Some(on), Some(since_ms)) => Some(Waiting { on, since_ms }),
            _ => None,
        },
        deliveries: match d.m.remove(DELIVERIES) {
            None | Some(AttributeValue::Null(_)) => Vec::new(),
            Some(list) => decode_deliveries(&pk, list)?,
        },
        relay_due_ms: d.opt_number(RELAY_DUE_MS)?,
        key: InboxKey::from_stored(pk.clone()),
    };
    Ok(item)
}

struct Decoder<'a> {
    pk: &'a str,
    m: &'a mut Item,
}

impl Decoder<'_> {
    fn bad(&self, attr: &str, why: &str) -> String {
        format!("item {}: attribute {attr}: {why}", self.pk)
    }

    fn string(&mut self, attr: &str) -> Result<String, String> {
        self.opt_string(attr)?
            .ok_or_else(|| self.bad(attr, "missing"))
    }

    fn opt_string(&mut self, attr: &str) -> Result<Option<String>, String> {
        match self.m.remove(attr) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::S(v)) => Ok(Some(v)),
            Some(_) => Err(self.bad(attr, "expected a string")),
        }
    }

    fn number<T: FromStr>(&mut self, attr: &str) -> Result<T, String> {
        self.opt_number(attr)?
            .ok_or_else(|| self.bad(attr, "missing"))
    }

    fn opt_number<T: FromStr>(&mut self, attr: &str) -> Result<Option<T>, String> {
        match self.m.remove(attr) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::N(v)) => v
                .parse()
                .map(Some)
                .map_err(|_| self.bad(attr, "number out of range")),
            Some(_) => Err(self.bad(attr, "expected a number")),
        }
    }

    fn opt_bool(&mut self, attr: &str) -> Result<Option<bool>, String> {
        match self.m.remove(attr) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::Bool(v)) => Ok(Some(v)),
            Some(_) => Err(self.bad(attr, "expected a boolean")),
        }
    }

    fn binary(&mut self, attr: &str) -> Result<Vec<u8>, String> {
        match self.m.remove(attr) {
            Some(AttributeValue::B(v)) => Ok(v.into_inner()),
            None => Err(self.bad(attr, "missing")),
            Some(_) => Err(self.bad(attr, "expected binary")),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small received Stripe item (the queue's tests use it too).
    pub(crate) fn sample() -> InboxItem {
        let envelope = Envelope {
            provider: "stripe".into(),
            tenant: "shop-1".into(),
            event_id: "evt_1".into(),
            event_type: "payment_intent.succeeded".into(),
            object_id: Some("pi_1".into()),
            object_version: None,
            occurred_at: Some(1_700_000_000),
            delivery_id: None,
        };
        InboxItem {
            key: envelope.key(),
            envelope,
            state: InboxState::Received,
            source: Source::Webhook,
            attempts: 0,
            received_at_ms: 1_700_000_000_123,
            updated_at_ms: 1_700_000_000_123,
            expires_at: 1_702_592_000,
            enqueue_failed: false,
            last_error: None,
            last_error_class: None,
            lease_until_ms: None,
            lease_owner: None,
            result: None,
            body_encoding: "zstd".into(),
            body_len: 42,
            body: vec![0, 1, 2, 255],
            waiting: None,
            deliveries: Vec::new(),
            relay_due_ms: None,
        }
    }

    /// What decoding the event's item gives: everything but the body, which is in
    /// its own item.
    fn stored(item: &InboxItem) -> InboxItem {
        InboxItem {
            body: Vec::new(),
            ..item.clone()
        }
    }

    #[test]
    fn the_body_is_in_its_own_item_written_once() {
        let item = sample();
        let m = encode(&item);
        assert!(!m.contains_key(BODY), "the event's item carries no body");
        assert_eq!(m.get(BODY_ITEM), Some(&AttributeValue::Bool(true)));
        let body = encode_body(&item);
        assert_eq!(
            body.get(PK),
            Some(&AttributeValue::S("body#stripe#shop-1#evt_1".into()))
        );
        assert_eq!(body.get(EXPIRES_AT), Some(&n_attr(item.expires_at)));
        assert!(!is_event(&body), "no listing shows a body item");
        // Nothing indexes it.
        for attr in [SWEEP_SHARD, WAIT_SHARD, HINT_SCOPE, RELAY_SHARD] {
            assert!(!body.contains_key(attr), "{attr}");
        }
        assert_eq!(decode_body(body).unwrap(), item.body);
    }

    #[test]
    fn items_of_the_earlier_layout_decode_with_their_inline_body() {
        let item = sample();
        let mut m = encode(&item);
        m.remove(BODY_ITEM);
        m.insert(BODY.into(), AttributeValue::B(Blob::new(item.body.clone())));
        assert_eq!(decode(m).unwrap(), item);
    }

    #[test]
    fn round_trips_and_omits_absent_optionals() {
        let item = sample();
        let m = encode(&item);
        assert!(!m.contains_key(OBJECT_VERSION));
        assert!(!m.contains_key(DELIVERY_ID));
        assert!(!m.contains_key(LAST_ERROR));
        assert!(!m.contains_key(LEASE_OWNER));
        assert!(!m.contains_key(RESULT));
        assert_eq!(decode(m).unwrap(), stored(&item));
    }

    #[test]
    fn round_trips_processing_state() {
        let mut item = sample();
        item.state = InboxState::Processing;
        item.attempts = 3;
        item.last_error = Some("waiting: payment not seen yet".into());
        item.last_error_class = Some("transient".into());
        item.lease_until_ms = Some(1_700_000_030_000);
        item.lease_owner = Some("worker-1".into());
        item.result = Some("order shop-1#1001 paid".into());
        let m = encode(&item);
        assert_eq!(
            m.get(LEASE_UNTIL_MS),
            Some(&AttributeValue::N("1700000030000".into()))
        );
        assert_eq!(decode(m).unwrap(), stored(&item));
    }

    #[test]
    fn pending_items_carry_a_stable_shard_and_terminal_ones_none() {
        let item = sample();
        let m = encode(&item);
        let shard = sweep_shard(item.key.as_str());
        assert_eq!(m.get(SWEEP_SHARD), Some(&AttributeValue::S(shard.clone())));
        // Pinned: writers of every release and the sweeper must agree.
        assert_eq!(sweep_shard("stripe#shop-1#evt_1"), shard);
        assert_eq!(sweep_shard(""), "p#5");
        assert!(sweep_shards().any(|s| s == shard));
        for state in [
            InboxState::Completed,
            InboxState::Ignored,
            InboxState::DeadLetter,
        ] {
            let mut done = sample();
            done.state = state;
            assert!(!encode(&done).contains_key(SWEEP_SHARD), "{state}");
        }
        // Spread: 1,000 event ids use every shard.
        let used: std::collections::HashSet<String> = (0..1000)
            .map(|i| sweep_shard(&format!("stripe#shop-1#evt_{i}")))
            .collect();
        assert_eq!(used.len(), SWEEP_SHARDS as usize);
    }

    #[test]
    fn only_gopay_and_klarna_push_hints_carry_a_hint_scope() {
        assert!(
            !encode(&sample()).contains_key(HINT_SCOPE),
            "a Stripe event"
        );
        for (provider, event_type, scope) in [
            ("gopay", "hint.payment", Some("gopay#shop-1")),
            ("klarna-push", "hint.order", Some("klarna-push#shop-1")),
            ("mollie", "hint.payment", None),
            ("gopay", "payment.paid", None),
        ] {
            let mut item = sample();
            item.envelope.provider = provider.into();
            item.envelope.event_type = event_type.into();
            let m = encode(&item);
            assert_eq!(
                m.get(HINT_SCOPE)
                    .and_then(|v| v.as_s().ok())
                    .map(String::as_str),
                scope,
                "{provider} {event_type}"
            );
            // Decoding ignores it: it is derived, not part of the item.
            assert_eq!(decode(m).unwrap(), stored(&item));
        }
    }

    #[test]
    fn deliveries_and_the_relay_due_time_round_trip() {
        let mut item = sample();
        item.state = InboxState::Completed;
        item.deliveries = vec![
            DeliveryStatus {
                destination: "shop-app".into(),
                key: "msg_0123".into(),
                state: DeliveryState::Pending,
                attempts: 2,
                last_status: Some(503),
                last_latency_ms: Some(41),
                last_attempt_ms: Some(1_700_000_001_000),
                next_attempt_ms: Some(1_700_000_011_000),
                detail: Some("retryable (status 503): busy".into()),
                output: None,
                release_owed: false,
            },
            DeliveryStatus {
                destination: "mail".into(),
                key: "msg_4567".into(),
                state: DeliveryState::Delivered,
                attempts: 1,
                last_status: None,
                last_latency_ms: None,
                last_attempt_ms: None,
                next_attempt_ms: None,
                detail: None,
                output: Some(crate::destinations::Output {
                    kind: "notification.payment_received".into(),
                    key: "t1#order-1#notify#1".into(),
                    object_id: None,
                    // Beyond DynamoDB's number range: kept as JSON text.
                    data: serde_json::json!({"amount": 1e300, "to": ["a@example.com"]}),
                }),
                release_owed: true,
            },
        ];
        item.relay_due_ms = Some(1_700_000_011_000);
        let m = encode(&item);
        let shard = sweep_shard(item.key.as_str());
        assert_eq!(m.get(RELAY_SHARD), Some(&AttributeValue::S(shard)));
        assert!(matches!(m.get(DELIVERIES), Some(AttributeValue::L(l)) if l.len() == 2));
        assert_eq!(decode(m.clone()).unwrap(), stored(&item));
        // The relay index's projection: everything but the body.
        let projected: Item = m
            .into_iter()
            .filter(|(k, _)| k == PK || RELAY_INDEX_PROJECTION.contains(&k.as_str()))
            .collect();
        let partial = decode_projected(projected).unwrap();
        assert_eq!(partial.deliveries, item.deliveries);
        assert!(partial.body.is_empty());
        assert_eq!(partial.envelope, item.envelope);
        // Nothing pending: neither attribute, so not in the relay's index.
        let m = encode(&sample());
        assert!(!m.contains_key(RELAY_SHARD) && !m.contains_key(DELIVERIES));
    }

    #[test]
    fn a_delivery_with_an_unknown_state_is_corrupt_and_named() {
        let mut item = sample();
        item.deliveries = vec![DeliveryStatus {
            destination: "d".into(),
            key: "k".into(),
            state: DeliveryState::Delivered,
            attempts: 1,
            last_status: None,
            last_latency_ms: None,
            last_attempt_ms: None,
            next_attempt_ms: None,
            detail: None,
            output: None,
            release_owed: false,
        }];
        let mut m = encode(&item);
        if let Some(AttributeValue::L(list)) = m.get_mut(DELIVERIES) {
            if let AttributeValue::M(entry) = &mut list[0] {
                entry.insert(D_STATE.into(), AttributeValue::S("lost".into()));
            }
        }
        let err = decode(m).unwrap_err();
        assert!(
            err.contains("deliveries[0]") && err.contains("state"),
            "{err}"
        );
        // A cursor item is no event.
        let cursor = Item::from([(PK.to_string(), AttributeValue::S("cursor#d#p#t#o".into()))]);
        assert!(!is_event(&cursor));
        let cert = Item::from([(
            PK.to_string(),
            AttributeValue::S("cert#https://api.paypal.com/v1/notifications/certs/CERT-1".into()),
        )]);
        assert!(!is_event(&cert));
        assert!(is_event(&encode(&sample())));
    }

    #[test]
    fn corrupt_items_name_the_attribute_not_the_body() {
        let mut m = encode(&sample());
        m.insert(STATE.into(), AttributeValue::S("nonsense".into()));
        let err = decode(m).unwrap_err();
        assert!(err.contains("state"), "{err}");
        let mut m = encode(&sample());
        m.insert(ATTEMPTS.into(), AttributeValue::N("-1".into()));
        assert!(decode(m).unwrap_err().contains("attempts"));
        // Neither inline nor in its own item.
        let mut m = encode(&sample());
        m.remove(BODY_ITEM);
        assert!(decode(m).unwrap_err().contains("body"));
    }
}
