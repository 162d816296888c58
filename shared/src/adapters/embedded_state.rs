//! PLACEHOLDER: SQLite StateStore adapter, being written.
