//! What `einmal serve --backend aws` checks before it serves: every table, queue and
//! parameter the functions will use exists and answers. It only reads: nothing is
//! created (`einmal setup --backend aws` does that), so a failed start leaves nothing
//! half-made. A missing resource is "not found" (exit 3) naming it and its variable;
//! an endpoint that does not answer or refuses the credentials is a failure (exit 4).
//! A throttle or a 5xx is an outage, not an answer: the checks wait it out (logged,
//! retried with backoff up to 10 s apart) as the functions would, and start after.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::QueueAttributeName;
use einmal::adapters::aws::{
    AwsNames, AUDIT_TABLE_ENV, CONFIG_PARAMETER_ENV, DLQ_URL_ENV, QUEUE_URL_ENV, STATE_TABLE_ENV,
    TABLE_ENV,
};

use crate::error::CliError;

/// What the checks learnt that the event source needs.
#[derive(Debug, Clone)]
pub struct Found {
    pub queue_arn: String,
    /// The queue's own visibility timeout (what every receive gets, as Lambda's pollers).
    pub visibility_timeout_secs: u32,
}

const FIX: &str = "`einmal setup --backend aws` creates it";

/// The error codes with which AWS (and moto, LocalStack) refuse the caller.
const CREDENTIAL_CODES: &[&str] = &[
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "InvalidSignatureException",
    "SignatureDoesNotMatch",
    "ExpiredTokenException",
    "InvalidAccessKeyId",
    "AccessDeniedException",
    "AccessDenied",
];

/// Why a check did not pass.
enum Refusal {
    /// What the operator must fix; the start fails with it.
    Final(CliError),
    /// Throttled or a server error: try again.
    Transient(String),
}

impl From<CliError> for Refusal {
    fn from(e: CliError) -> Self {
        Refusal::Final(e)
    }
}

/// The codes and statuses with which AWS says "not now" rather than "no".
const TRANSIENT_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "Throttling",
    "RequestThrottled",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "InternalServerError",
    "InternalFailure",
    "ServiceUnavailable",
    "ServiceUnavailableException",
];

/// Check the tables, the queues and the configuration parameter the environment names;
/// an outage (throttling, 5xx) is waited out.
pub async fn check(sdk: &aws_config::SdkConfig, names: &AwsNames) -> Result<Found, CliError> {
    let mut pause = std::time::Duration::from_millis(500);
    loop {
        match check_once(sdk, names).await {
            Ok(found) => return Ok(found),
            Err(Refusal::Final(e)) => return Err(e),
            Err(Refusal::Transient(why)) => {
                eprintln!(
                    "einmal: AWS is not answering normally ({why}); checking again in {:.1} s",
                    pause.as_secs_f64()
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(10));
            }
        }
    }
}

async fn check_once(sdk: &aws_config::SdkConfig, names: &AwsNames) -> Result<Found, Refusal> {
    let state = std::env::var(STATE_TABLE_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| {
            CliError::Usage(format!("environment variable {STATE_TABLE_ENV} is not set"))
        })?;
    let optional = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
    let sqs = aws_sdk_sqs::Client::new(sdk);

    // The first call also shows whether the endpoint answers and takes the credentials.
    table(&dynamodb, "inbox table", &names.table, TABLE_ENV).await?;
    table(&dynamodb, "state table", &state, STATE_TABLE_ENV).await?;
    if let Some(audit) = optional(AUDIT_TABLE_ENV) {
        table(&dynamodb, "audit table", &audit, AUDIT_TABLE_ENV).await?;
    }
    let found = queue(&sqs, "queue", &names.queue_url, QUEUE_URL_ENV).await?;
    if let Some(dlq) = &names.dlq_url {
        queue(&sqs, "dead-letter queue", dlq, DLQ_URL_ENV).await?;
    }
    if let Some(parameter) = optional(CONFIG_PARAMETER_ENV) {
        let ssm = aws_sdk_ssm::Client::new(sdk);
        let parameter = parameter.trim();
        // Only that it exists: the functions read and parse it (never printed).
        if let Err(e) = ssm.get_parameter().name(parameter).send().await {
            return Err(classify(
                "SSM",
                "configuration parameter",
                parameter,
                CONFIG_PARAMETER_ENV,
                &["ParameterNotFound"],
                &e,
            ));
        }
    }
    Ok(found)
}

async fn table(
    dynamodb: &aws_sdk_dynamodb::Client,
    what: &str,
    name: &str,
    var: &str,
) -> Result<(), Refusal> {
    match dynamodb.describe_table().table_name(name).send().await {
        Ok(_) => Ok(()),
        Err(e) => Err(classify(
            "DynamoDB",
            what,
            name,
            var,
            &["ResourceNotFoundException"],
            &e,
        )),
    }
}

async fn queue(
    sqs: &aws_sdk_sqs::Client,
    what: &str,
    url: &str,
    var: &str,
) -> Result<Found, Refusal> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .attribute_names(QueueAttributeName::VisibilityTimeout)
        .send()
        .await
        .map_err(|e| {
            classify(
                "SQS",
                what,
                url,
                var,
                &[
                    "QueueDoesNotExist",
                    "AWS.SimpleQueueService.NonExistentQueue",
                ],
                &e,
            )
        })?;
    let attributes = out.attributes.unwrap_or_default();
    Ok(Found {
        queue_arn: attributes
            .get(&QueueAttributeName::QueueArn)
            .cloned()
            .unwrap_or_default(),
        visibility_timeout_secs: attributes
            .get(&QueueAttributeName::VisibilityTimeout)
            .and_then(|v| v.parse().ok())
            .unwrap_or(30),
    })
}

/// The error of a check, by what went wrong: the resource is missing (`not_found`
/// codes), the endpoint does not answer, the credentials are refused, or else AWS's
/// own message.
fn classify<E>(
    service: &str,
    what: &str,
    name: &str,
    var: &str,
    not_found: &[&str],
    err: &SdkError<E, HttpResponse>,
) -> Refusal
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let code = err.code().unwrap_or_default();
    let server_error = err
        .raw_response()
        .is_some_and(|r| r.status().is_server_error());
    if TRANSIENT_CODES.iter().any(|c| code.ends_with(c)) || server_error {
        return Refusal::Transient(format!("{service} {code} checking the {what} {name}"));
    }
    Refusal::Final(final_error(service, what, name, var, not_found, err))
}

fn final_error<E, R>(
    service: &str,
    what: &str,
    name: &str,
    var: &str,
    not_found: &[&str],
    err: &SdkError<E, R>,
) -> CliError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let endpoint = std::env::var("AWS_ENDPOINT_URL")
        .ok()
        .filter(|v| !v.trim().is_empty());
    match err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => {
            let at = match &endpoint {
                Some(url) => format!("at {url} (AWS_ENDPOINT_URL)"),
                None => "at its default endpoint (AWS_ENDPOINT_URL is not set)".to_string(),
            };
            return CliError::Failure(format!(
                "{service} does not answer {at}: {} (is moto or LocalStack running?)",
                DisplayErrorContext(err)
            ));
        }
        _ => {}
    }
    let code = err.code().unwrap_or_default();
    if not_found.contains(&code) {
        return CliError::NotFound(format!("the {what} {name} ({var}) does not exist: {FIX}"));
    }
    if CREDENTIAL_CODES.contains(&code) {
        return CliError::Failure(format!(
            "{service} refused the credentials ({code}) checking the {what} {name} ({var}): check AWS_ACCESS_KEY_ID / AWS_PROFILE and the region"
        ));
    }
    CliError::Failure(format!(
        "{service}: cannot check the {what} {name} ({var}): {}",
        DisplayErrorContext(err)
    ))
}
