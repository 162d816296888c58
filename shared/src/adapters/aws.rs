//! PLACEHOLDER: DynamoDB + SQS adapter, being written.
