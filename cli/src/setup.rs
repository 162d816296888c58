//! `einmal setup`: create the stores the code expects, for a local moto or LocalStack
//! and for teams not using SAM. On AWS it reads the names from the environment
//! variables the Lambdas read and creates each resource with the library's own
//! definitions (the ones the tests use); embedded, it creates the --data-dir store.
//! Idempotent: what exists is reported as `exists` and left alone.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use einmal::adapters::aws::{
    create_audit_table, create_queues, create_state_table, create_tables, AUDIT_TABLE_ENV,
    DLQ_URL_ENV, QUEUE_URL_ENV, STATE_TABLE_ENV, TABLE_ENV,
};
use einmal::adapters::embedded::{
    EmbeddedAuditLog, EmbeddedOptions, EmbeddedStateStore, EmbeddedStore,
};
use einmal::pipeline::process::ProcessSettings;
use einmal_cli::error::CliError;
use serde_json::json;

use crate::store::Backend;

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Where: `aws` creates the inbox table (EINMAL_INBOX_TABLE) with its indexes, the
    /// queue named by EINMAL_QUEUE_URL with its dead-letter queue `<queue>-dlq`, the
    /// state table (EINMAL_STATE_TABLE) and, when set, the audit table
    /// (EINMAL_AUDIT_TABLE); the redrive threshold is EINMAL_MAX_RECEIVE_COUNT.
    #[arg(long, value_enum, default_value_t = Backend::Embedded)]
    backend: Backend,
    /// Directory of the embedded store (created with its parents).
    #[arg(long, default_value = ".einmal")]
    data_dir: PathBuf,
}

/// One resource and whether this run created it.
struct Step {
    kind: &'static str,
    name: String,
    created: bool,
}

pub async fn run(args: SetupArgs, json: bool) -> Result<ExitCode, CliError> {
    let steps = match args.backend {
        Backend::Embedded => setup_embedded(&args.data_dir)?,
        Backend::Aws => setup_aws().await?,
    };
    if json {
        let steps: Vec<_> = steps
            .iter()
            .map(|s| json!({"kind": s.kind, "name": s.name, "status": status(s)}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&steps).map_err(|e| e.to_string())?
        );
    } else {
        for s in &steps {
            println!("{:<7} {:<16} {}", status(s), s.kind, s.name);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn status(step: &Step) -> &'static str {
    if step.created {
        "created"
    } else {
        "exists"
    }
}

fn setup_embedded(dir: &std::path::Path) -> Result<Vec<Step>, CliError> {
    let existed = dir.is_dir();
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let failed =
        |e: &dyn std::fmt::Display| format!("cannot create the store in {}: {e}", dir.display());
    EmbeddedStore::open(dir, EmbeddedOptions::default()).map_err(|e| failed(&e))?;
    EmbeddedStateStore::open(dir).map_err(|e| failed(&e))?;
    EmbeddedAuditLog::open(dir).map_err(|e| failed(&e))?;
    Ok(vec![Step {
        kind: "embedded store",
        name: dir.display().to_string(),
        created: !existed,
    }])
}

/// A required environment variable, naming it when it is missing.
fn required(name: &'static str) -> Result<String, CliError> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| CliError::Usage(format!("environment variable {name} is not set")))
}

/// The queue's name: the last path segment of its URL (`.../123456789012/name`).
fn queue_name(var: &'static str, url: &str) -> Result<String, CliError> {
    url.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|name| !name.is_empty() && !name.contains(':'))
        .map(str::to_string)
        .ok_or_else(|| CliError::Usage(format!("{var}={url:?} does not end in a queue name")))
}

async fn setup_aws() -> Result<Vec<Step>, CliError> {
    // Every name first: a missing variable fails before any AWS call.
    let inbox = required(TABLE_ENV)?;
    let queue_url = required(QUEUE_URL_ENV)?;
    let queue = queue_name(QUEUE_URL_ENV, &queue_url)?;
    let dlq = format!("{queue}-dlq");
    if let Some(url) = std::env::var(DLQ_URL_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        let named = queue_name(DLQ_URL_ENV, &url)?;
        if named != dlq {
            return Err(CliError::Usage(format!(
                "{DLQ_URL_ENV} names the queue {named:?}; setup creates the dead-letter queue of {queue:?} as {dlq:?}"
            )));
        }
    }
    let state = required(STATE_TABLE_ENV)?;
    let audit = std::env::var(AUDIT_TABLE_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty());
    let max_receive_count = ProcessSettings::from_env()
        .map_err(|e| CliError::Usage(e.to_string()))?
        .max_receive_count;

    let sdk = crate::store::sdk_config().await?;
    let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let mut steps = Vec::new();

    let existed = table_exists(&dynamodb, &inbox).await?;
    create_tables(&dynamodb, &inbox)
        .await
        .map_err(|e| e.to_string())?;
    steps.push(Step {
        kind: "inbox table",
        name: inbox,
        created: !existed,
    });
    let existed = table_exists(&dynamodb, &state).await?;
    create_state_table(&dynamodb, &state)
        .await
        .map_err(|e| e.to_string())?;
    steps.push(Step {
        kind: "state table",
        name: state,
        created: !existed,
    });
    if let Some(audit) = audit {
        let existed = table_exists(&dynamodb, &audit).await?;
        create_audit_table(&dynamodb, &audit)
            .await
            .map_err(|e| e.to_string())?;
        steps.push(Step {
            kind: "audit table",
            name: audit,
            created: !existed,
        });
    }
    let queue_existed = queue_exists(&sqs, &queue).await?;
    let dlq_existed = queue_exists(&sqs, &dlq).await?;
    let names = create_queues(&sqs, &queue, max_receive_count)
        .await
        .map_err(|e| e.to_string())?;
    steps.push(Step {
        kind: "dead-letter queue",
        name: names.dlq_url.clone().unwrap_or(dlq),
        created: !dlq_existed,
    });
    steps.push(Step {
        kind: "queue",
        name: names.queue_url.clone(),
        created: !queue_existed,
    });
    if names.queue_url != queue_url {
        eprintln!(
            "einmal: the queue's URL is {}; set {QUEUE_URL_ENV} to it",
            names.queue_url
        );
    }
    Ok(steps)
}

async fn table_exists(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> Result<bool, CliError> {
    use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
    match dynamodb.describe_table().table_name(table).send().await {
        Ok(_) => Ok(true),
        Err(e)
            if matches!(
                e.as_service_error(),
                Some(DescribeTableError::ResourceNotFoundException(_))
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(CliError::Failure(format!(
            "DynamoDB DescribeTable {table}: {}",
            aws_sdk_dynamodb::error::DisplayErrorContext(&e)
        ))),
    }
}

async fn queue_exists(sqs: &aws_sdk_sqs::Client, queue: &str) -> Result<bool, CliError> {
    use aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError;
    match sqs.get_queue_url().queue_name(queue).send().await {
        Ok(_) => Ok(true),
        Err(e)
            if matches!(
                e.as_service_error(),
                Some(GetQueueUrlError::QueueDoesNotExist(_))
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(CliError::Failure(format!(
            "SQS GetQueueUrl {queue}: {}",
            aws_sdk_sqs::error::DisplayErrorContext(&e)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_name_is_the_urls_last_segment() {
        let name = |url| queue_name(QUEUE_URL_ENV, url).map_err(|e| e.to_string());
        assert_eq!(
            name("https://sqs.eu-west-1.amazonaws.com/123456789012/einmal-work").as_deref(),
            Ok("einmal-work")
        );
        assert_eq!(
            name("http://127.0.0.1:5000/123456789012/q/").as_deref(),
            Ok("q")
        );
        assert!(name("").unwrap_err().contains(QUEUE_URL_ENV));
    }
}
