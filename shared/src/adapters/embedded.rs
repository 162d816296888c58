//! PLACEHOLDER: SQLite adapter, being written.
