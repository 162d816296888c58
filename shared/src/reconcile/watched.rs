//! GoPay, Klarna push (no list API): the payments the tenant's hints named, each
//! looked up once when its hints say it may have been missed.

use super::thin::{thin_payment, ThinPayment};
use super::{ReconcileError, Reconciler};
use crate::config::TenantConfig;
use crate::ports::InboxState;
use crate::providers::thin::ThinResource;

/// Most hint items read per GoPay / Klarna push tenant and run, oldest first from the
/// checkpoint; when a run reads this many, the checkpoint stops at the last one read
/// and the next run goes on from there.
pub const MAX_WATCHED_ITEMS: usize = 2_000;

impl Reconciler {
    /// GoPay / Klarna push (no list API): the resources named by this tenant's hints
    /// received since `since` that no hint has completed, none is still processing,
    /// and at least one ended `ignored` (the fetched state was not final), each fetched
    /// once now. Also the oldest point the checkpoint must not pass: the arrival of the
    /// oldest hint still in processing, or the last hint read when a run reads
    /// [`MAX_WATCHED_ITEMS`] (there may be more behind it).
    pub(super) async fn watched(
        &self,
        tenant: &TenantConfig,
        facts: &ThinResource,
        since: i64,
    ) -> Result<(Vec<ThinPayment>, Option<i64>), ReconcileError> {
        let provider = tenant.provider.as_str();
        let index = self.hints.as_ref().ok_or_else(|| {
            ReconcileError::Config(format!(
                "reconciling {provider} reads the inbox's hint index, which is not configured"
            ))
        })?;
        let hints = index
            .hints_since(
                provider,
                &tenant.tenant,
                since.saturating_mul(1000),
                MAX_WATCHED_ITEMS,
            )
            .await?;
        let unread_from = match hints.last() {
            Some(last) if hints.len() >= MAX_WATCHED_ITEMS => {
                tracing::warn!(
                    provider, tenant = %tenant.tenant, read = hints.len(),
                    "more hints since the checkpoint than one run reads; the next run goes on"
                );
                Some(last.received_at_ms.div_euclid(1000))
            }
            _ => None,
        };
        struct Seen {
            first_ms: i64,
            completed: bool,
            pending: bool,
            ignored: bool,
        }
        let mut by_id: std::collections::BTreeMap<String, Seen> = Default::default();
        for hint in hints {
            let seen = by_id.entry(hint.object_id).or_insert(Seen {
                first_ms: i64::MAX,
                completed: false,
                pending: false,
                ignored: false,
            });
            seen.first_ms = seen.first_ms.min(hint.received_at_ms);
            match hint.state {
                InboxState::Completed => seen.completed = true,
                InboxState::Ignored => seen.ignored = true,
                // Dead letters are the DLQ's and replay's business.
                InboxState::DeadLetter => {}
                _ => seen.pending = true,
            }
        }
        let mut pending_since = unread_from;
        let mut out = Vec::new();
        for (id, seen) in by_id {
            let first = seen.first_ms.div_euclid(1000);
            if seen.completed {
                continue;
            }
            if seen.pending {
                pending_since = Some(pending_since.map_or(first, |p| p.min(first)));
                continue;
            }
            if !seen.ignored {
                continue;
            }
            let body = self.lookup.fetch(tenant, provider, facts.kind, &id).await?;
            let value: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|e| ReconcileError::Payload(format!("{provider} {id}: {e}")))?;
            let mut payment = thin_payment(provider, facts, &value)?;
            payment.id = id;
            payment.at = first;
            out.push(payment);
        }
        Ok((out, pending_since))
    }
}
