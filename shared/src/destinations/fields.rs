//! The fields of one `[[destination]]` table, read one by one by the common part and
//! by the kind's own parser; every problem is kept with its line and names its
//! destination. What no one took is an unknown field.

use std::collections::BTreeMap;

use toml::Value;

use crate::problems::Problem;
use crate::secret::{Secret, SecretLookup, SecretSpec};

/// The fields of one table, taken one by one; what is left at the end is unknown.
pub(crate) struct Fields {
    pub(crate) line: usize,
    pub(crate) fields: BTreeMap<String, (usize, Value)>,
    /// `destination tenant/name` (or `destination #n` while the name is unknown).
    pub(crate) label: String,
    pub(crate) problems: Vec<Problem>,
}

impl Fields {
    pub(crate) fn problem(&mut self, line: usize, message: impl std::fmt::Display) {
        self.problems.push(Problem {
            line,
            message: format!("{}: {message}", self.label),
        });
    }

    pub(crate) fn take(&mut self, name: &str) -> Option<(usize, Value)> {
        self.fields.remove(name)
    }

    pub(crate) fn string(&mut self, name: &str) -> Option<(usize, String)> {
        match self.take(name)? {
            (line, Value::String(s)) => Some((line, s)),
            (line, other) => {
                self.problem(
                    line,
                    format!("`{name}` must be a string, not {}", other.type_str()),
                );
                None
            }
        }
    }

    pub(crate) fn required_string(&mut self, name: &str) -> Option<(usize, String)> {
        if !self.fields.contains_key(name) {
            let line = self.line;
            self.problem(line, format!("missing `{name}`"));
            return None;
        }
        self.string(name)
    }

    pub(crate) fn bool(&mut self, name: &str, default: bool) -> bool {
        match self.take(name) {
            None => default,
            Some((_, Value::Boolean(b))) => b,
            Some((line, other)) => {
                self.problem(
                    line,
                    format!("`{name}` must be true or false, not {}", other.type_str()),
                );
                default
            }
        }
    }

    /// A whole number in `min..=max`.
    pub(crate) fn number(&mut self, name: &str, default: u64, min: u64, max: u64) -> u64 {
        match self.take(name) {
            None => default,
            Some((_, Value::Integer(n))) if (min as i64..=max as i64).contains(&n) => n as u64,
            Some((line, _)) => {
                self.problem(
                    line,
                    format!("`{name}` must be a whole number from {min} to {max}"),
                );
                default
            }
        }
    }

    pub(crate) fn string_list(&mut self, name: &str) -> (usize, Vec<String>) {
        let Some((line, value)) = self.take(name) else {
            return (self.line, Vec::new());
        };
        let Value::Array(items) = value else {
            self.problem(line, format!("`{name}` must be a list of strings"));
            return (line, Vec::new());
        };
        let mut out = Vec::new();
        for item in items {
            match item {
                Value::String(s) => out.push(s),
                _ => self.problem(line, format!("`{name}` must be a list of strings")),
            }
        }
        (line, out)
    }

    pub(crate) fn secret(
        &mut self,
        name: &str,
        line: usize,
        value: Value,
        lookup: SecretLookup<'_>,
    ) -> Option<Secret> {
        let spec: SecretSpec = match value.try_into() {
            Ok(spec) => spec,
            Err(_) => {
                self.problem(
                    line,
                    format!(
                        "`{name}` must be a string, {{ env = \"VARIABLE\" }} or {{ ssm = \"/parameter\" }}"
                    ),
                );
                return None;
            }
        };
        let value = match spec.resolve(lookup) {
            Ok(value) => value,
            Err(reason) => {
                self.problem(line, format!("`{name}` {reason}"));
                return None;
            }
        };
        if value.is_empty() {
            self.problem(line, format!("`{name}` is empty"));
            return None;
        }
        Some(Secret::new(value))
    }
}
