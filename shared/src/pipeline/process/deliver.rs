//! Deliver (step 4): a completed or ignored event and its decision's outputs go to the
//! relay's destinations before the finish, so that the finish write records the
//! deliveries (no write of their own).

use std::time::Instant;

use super::outcome::{Applied, Failure};
use super::Processor;
use crate::pipeline::relay::EventDeliveries;
use crate::ports::InboxItem;

impl Processor {
    /// `None` without a relay, or when the run did not conclude the event.
    pub(super) async fn deliver(
        &self,
        item: &InboxItem,
        result: &Result<Applied, Failure>,
        deliver_until: Option<Instant>,
    ) -> Option<EventDeliveries> {
        let relay = self.relay.as_ref()?;
        let outputs = match result {
            Ok(Applied::Completed(_, _, outputs)) => outputs.as_slice(),
            Ok(Applied::Ignored(_)) => &[],
            Err(_) => return None,
        };
        Some(
            relay
                .deliver_event_until(item, outputs, deliver_until)
                .await,
        )
    }
}
