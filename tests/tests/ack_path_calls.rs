//! Round trips on the ack path, counted at the HTTP layer of the AWS SDK against moto:
//! a new webhook costs exactly two sequential calls (conditional put, send), a
//! duplicate of an enqueued event one.

use std::sync::Arc;

use einmal::pipeline::ingest::Ingestor;
use einmal::ports::Queue;
use einmal_tests::fixtures::{config, drain, signed, stripe_body, FailingQueue};
use einmal_tests::moto::{self, CallCounter};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_webhook_costs_two_calls_and_a_duplicate_one() {
    let counter = CallCounter::default();
    let (store, _names) = moto::aws_store(moto::shared(), Some(counter.clone())).await;
    let store = Arc::new(store);
    let ingest = Ingestor::new(config(), store.clone(), store.clone());
    let cfg = config();
    let body = stripe_body("evt_calls_1", 3000);

    let before = counter.count();
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        counter.count() - before,
        2,
        "new webhook: PutItem + SendMessage"
    );

    let before = counter.count();
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(resp.body["duplicate"], true);
    assert_eq!(
        counter.count() - before,
        1,
        "duplicate: the conditional PutItem only"
    );
    assert_eq!(drain(&*store).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_of_an_unconfirmed_enqueue_costs_put_plus_send() {
    let counter = CallCounter::default();
    let (store, _names) = moto::aws_store(moto::shared(), Some(counter.clone())).await;
    let store = Arc::new(store);
    let failing: Arc<dyn Queue> = Arc::new(FailingQueue::new(store.clone(), vec![1]));
    let ingest = Ingestor::new(config(), store.clone(), failing);
    let cfg = config();
    let body = stripe_body("evt_calls_2", 100);

    let before = counter.count();
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(resp.status, 503);
    // PutItem, the injected send failure (no call), UpdateItem marking it.
    assert_eq!(counter.count() - before, 2);

    let before = counter.count();
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(
        (resp.status, resp.body["duplicate"].as_bool()),
        (200, Some(true))
    );
    assert_eq!(
        counter.count() - before,
        2,
        "PutItem (returns the old item) + SendMessage"
    );
    assert_eq!(drain(&*store).await.len(), 1);
}
