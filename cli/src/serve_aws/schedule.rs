//! The EventBridge schedules: the sweeper (with its relay pass) every minute, the
//! reconciler every hour (the template's defaults), each invoked with the payload a
//! scheduled rule sends. As with a rate schedule, the first run is one period after
//! the start; a run in progress when the process stops is finished.

use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The scheduled tasks, until `stop` turns true.
pub fn spawn(
    sweep: sweeper::Sweep,
    sweep_every: Duration,
    reconcile: Option<(reconciler::Reconcile, Duration)>,
    stop: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut sweep_stop = stop.clone();
    let mut tasks = vec![tokio::spawn(async move {
        while tick(sweep_every, &mut sweep_stop).await {
            let result = sweep.handle().await;
            tracing::debug!(result = %result, "sweeper invoked");
        }
    })];
    if let Some((reconcile, period)) = reconcile {
        let mut stop = stop;
        tasks.push(tokio::spawn(async move {
            while tick(period, &mut stop).await {
                if let Err(e) = reconcile.handle(&scheduled_event()).await {
                    tracing::error!(error = %e, "reconciler invocation failed");
                }
            }
        }));
    }
    tasks
}

/// Wait one `period`: true when it is time to run, false once `stop` turned true. A
/// run is never cut short: the stop is seen between runs.
async fn tick(period: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    let stopped = tokio::select! {
        _ = tokio::time::sleep(period) => false,
        _ = stop.wait_for(|stopped| *stopped) => true,
    };
    !stopped && !*stop.borrow()
}

/// The event an EventBridge scheduled rule invokes a function with.
fn scheduled_event() -> serde_json::Value {
    json!({
        "version": "0",
        "id": format!("{:032x}", rand::random::<u128>()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "time": einmal::time::format_rfc3339(einmal::time::now_secs()),
        "resources": [],
        "detail": {}
    })
}
