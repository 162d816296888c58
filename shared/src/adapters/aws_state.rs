//! PLACEHOLDER: DynamoDB StateStore adapter, being written.
