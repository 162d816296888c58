//! A subscription service as an einmal domain, in its own crate: Stripe's
//! `customer.subscription.created|updated|deleted` keep one `subscription` record at
//! the newest version (the event's `created`), and `invoice.paid` records each invoice
//! once and adds it to its subscription's paid total. The framework's guards
//! (effect keys, version conditions, waiting) make that exactly once, whatever the
//! order, duplicates or crashes.

use einmal::domain::state::{StateKey, StateRecord};
use einmal::domain::{Change, Decision, Domain, DomainError, DomainEvent};
use serde_json::{json, Value};

pub const SUBSCRIPTION: &str = "subscription";
pub const INVOICE: &str = "invoice";

/// The domain: no state of its own (pure, deterministic).
pub struct Subscriptions;

/// What one event says, once parsed.
enum Fact {
    /// The subscription as of `version` (the event's `created`, Unix seconds).
    Subscription {
        id: String,
        customer: String,
        plan: String,
        status: String,
        version: i64,
    },
    InvoicePaid {
        id: String,
        subscription: String,
        amount_minor: i64,
        currency: String,
    },
}

fn fact(event: &DomainEvent<'_>) -> Result<Option<Fact>, DomainError> {
    let kind = event.envelope.event_type.as_str();
    let subscription_event = kind
        .strip_prefix("customer.subscription.")
        .is_some_and(|action| ["created", "updated", "deleted"].contains(&action));
    if event.envelope.provider != "stripe" || !(subscription_event || kind == "invoice.paid") {
        return Ok(None);
    }
    let bad = |what: &str| DomainError::Permanent(format!("{kind}: {what}"));
    let body: Value = serde_json::from_slice(event.body).map_err(|_| bad("body is not JSON"))?;
    let object = &body["data"]["object"];
    let text = |field: &str| {
        object[field]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| bad(&format!("`data.object.{field}` is missing")))
    };
    Ok(Some(if subscription_event {
        Fact::Subscription {
            id: text("id")?,
            customer: text("customer")?,
            plan: object["items"]["data"][0]["price"]["id"]
                .as_str()
                .ok_or_else(|| bad("no plan (`items.data[0].price.id`)"))?
                .to_owned(),
            status: text("status")?,
            version: event
                .envelope
                .occurred_at
                .ok_or_else(|| bad("no `created`"))?,
        }
    } else {
        Fact::InvoicePaid {
            id: text("id")?,
            subscription: text("subscription")?,
            amount_minor: object["amount_paid"]
                .as_i64()
                .ok_or_else(|| bad("`amount_paid` is not an integer"))?,
            currency: text("currency")?,
        }
    }))
}

fn key(event: &DomainEvent<'_>, kind: &str, id: &str) -> StateKey {
    StateKey::new(&event.envelope.tenant, kind, id)
}

impl Domain for Subscriptions {
    fn targets(&self, event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError> {
        Ok(match fact(event)? {
            None => vec![],
            Some(Fact::Subscription { id, .. }) => vec![key(event, SUBSCRIPTION, &id)],
            // The subscription first: an invoice before its subscription waits on it.
            Some(Fact::InvoicePaid {
                id, subscription, ..
            }) => vec![
                key(event, SUBSCRIPTION, &subscription),
                key(event, INVOICE, &id),
            ],
        })
    }

    fn decide(
        &self,
        event: &DomainEvent<'_>,
        current: &[StateRecord],
    ) -> Result<Decision, DomainError> {
        let tenant = &event.envelope.tenant;
        match fact(event)? {
            None => Ok(Decision::Ignore {
                reason: format!("unsupported event type {}", event.envelope.event_type),
            }),
            Some(Fact::Subscription {
                id,
                customer,
                plan,
                status,
                version,
            }) => {
                let sub = &current[0];
                let at = sub.data["version"].as_i64();
                if sub.exists() && at >= Some(version) {
                    return Ok(Decision::Ignore {
                        reason: format!("superseded: subscription {id} is at {at:?}"),
                    });
                }
                // The newest event decides plan and status; the paid totals stay.
                let data = json!({
                    "subscription_id": id, "customer": customer, "plan": plan,
                    "status": status, "version": version,
                    "paid_minor": sub.data["paid_minor"].as_i64().unwrap_or(0),
                    "invoices": sub.data["invoices"].as_i64().unwrap_or(0),
                });
                Ok(Decision::Apply {
                    result: format!("subscription {id}: {plan} {status}"),
                    changes: vec![Change::new(
                        sub.key.clone(),
                        format!("{tenant}#subscription-{id}#v{version}"),
                        data,
                    )],
                })
            }
            Some(Fact::InvoicePaid {
                id,
                subscription,
                amount_minor,
                currency,
            }) => {
                let (sub, invoice) = (&current[0], &current[1]);
                if !sub.exists() {
                    return Err(DomainError::Wait(format!("subscription {subscription}")));
                }
                // One key on the invoice guards both changes: the subscription is
                // shared by all its invoices, so it carries none of their keys.
                let effect = format!("{tenant}#invoice-{id}#paid");
                let mut totals = sub.data.clone();
                totals["paid_minor"] =
                    json!(totals["paid_minor"].as_i64().unwrap_or(0) + amount_minor);
                totals["invoices"] = json!(totals["invoices"].as_i64().unwrap_or(0) + 1);
                let paid = json!({"invoice_id": id, "subscription": subscription,
                                  "amount_minor": amount_minor, "currency": currency});
                Ok(Decision::Apply {
                    result: format!("invoice {id} paid: {amount_minor} {currency}"),
                    changes: vec![
                        Change::new(invoice.key.clone(), effect.clone(), paid),
                        Change::keyed_on(sub.key.clone(), invoice.key.clone(), effect, totals),
                    ],
                })
            }
        }
    }
}
