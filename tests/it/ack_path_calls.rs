//! Round trips on the ack path, counted at the HTTP layer of the AWS SDK against moto:
//! a new webhook costs exactly three sequential calls (conditional put, the body's put,
//! send), a duplicate of an event still `received` two (its rejected put, and the
//! body's put if missing, rejected: a first request that died between the two puts
//! left no body); a duplicate of a processed event costs one (the capacity test); a
//! put whose response was lost (the SDK retries it) still sends its message in the
//! same request.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use aws_sdk_dynamodb::config::interceptors::{
    BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use einmal::adapters::aws::{create_queues, create_tables, AwsStore};
use einmal::pipeline::ingest::Ingestor;
use einmal::ports::{Inbox, InboxState, Queue};
use einmal_tests::fixtures::{config, drain, signed, stripe_body, FailingQueue};
use einmal_tests::moto::{self, CallCounter, OperationLog, MAX_RECEIVE_COUNT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_webhook_costs_three_calls_and_a_duplicate_two() {
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
        3,
        "new webhook: PutItem + PutItem (body) + SendMessage"
    );

    let before = counter.count();
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(resp.body["duplicate"], true);
    assert_eq!(
        counter.count() - before,
        2,
        "duplicate of a received event: the conditional PutItem + the body's, both rejected"
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
    // PutItem, the body's PutItem, the injected send failure (no call), UpdateItem
    // marking it.
    assert_eq!(counter.count() - before, 3);

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
        3,
        "PutItem (returns the old item) + the body's PutItem (rejected: there) + SendMessage"
    );
    assert_eq!(drain(&*store).await.len(), 1);
}

/// Fault injection at the SDK's HTTP layer: the first `PutItem` reaches moto, which
/// stores the item, but the client sees HTTP 500 instead of moto's answer (DynamoDB's
/// "may have succeeded"; a timeout takes the same retry path). The SDK retries it.
/// For one client making one call at a time (the request has left the context by the
/// time the response arrives, so the attempt's operation is noted before it is sent).
#[derive(Debug, Default)]
struct LoseFirstPutResponse {
    puts: AtomicUsize,
    attempt_is_put: AtomicBool,
}

impl Intercept for LoseFirstPutResponse {
    fn name(&self) -> &'static str {
        "einmal-lose-first-put-response"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let is_put = moto::operation_of(context) == "PutItem";
        self.attempt_is_put.store(is_put, Ordering::SeqCst);
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let is_put = self.attempt_is_put.load(Ordering::SeqCst);
        if is_put && self.puts.fetch_add(1, Ordering::SeqCst) == 0 {
            let response = context.response_mut();
            *response.status_mut() = 500u16.try_into().expect("500 is a status code");
            *response.body_mut() = r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected: the response was lost"}"#.into();
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_put_response_is_retried_and_the_pointer_sent_in_that_request() {
    let moto = moto::shared();
    let sdk = moto.sdk_config().await;
    let name = moto::unique_name("einmal-lost-put");
    create_tables(&aws_sdk_dynamodb::Client::new(&sdk), &name)
        .await
        .expect("tables on moto");
    let names = create_queues(&aws_sdk_sqs::Client::new(&sdk), &name, MAX_RECEIVE_COUNT)
        .await
        .expect("queues on moto");
    let operations = OperationLog::new();
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .interceptor(LoseFirstPutResponse::default())
            .interceptor(operations.clone())
            .build(),
    );
    let store = Arc::new(AwsStore::new(
        dynamodb,
        aws_sdk_sqs::Client::new(&sdk),
        names,
    ));
    let ingest = Ingestor::new(config(), store.clone(), store.clone());
    let cfg = config();
    let body = stripe_body("evt_lost_put", 4200);

    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        resp.body["duplicate"], false,
        "the retry found our own insert, not another request's"
    );
    assert_eq!(
        operations.operations(),
        ["PutItem", "PutItem", "PutItem"],
        "the first attempt's response was lost, the SDK retried; then the body's put"
    );
    let sent = drain(&*store).await;
    assert_eq!(sent.len(), 1, "the pointer went out in that request");
    let item = store
        .get(&sent[0].message.pk)
        .await
        .expect("get")
        .expect("stored once");
    assert_eq!(
        (item.state, item.envelope.event_id.as_str()),
        (InboxState::Received, "evt_lost_put")
    );

    // A real duplicate (the provider's retry, a new request) is still one.
    let again = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(
        (again.status, again.body["duplicate"].as_bool()),
        (200, Some(true))
    );
    assert!(drain(&*store).await.is_empty(), "no second pointer");
}
