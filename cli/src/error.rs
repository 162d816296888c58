//! How `einmal` fails: one exit code per kind of failure, and with `--json` the error
//! as a JSON object on stderr, so scripts tell "no such event" from "AWS is down".

use std::process::ExitCode;

use thiserror::Error;

/// The command ran and its answer is "no": `config check` found problems, a replay
/// left events failed, missing or busy, `send` got a non-2xx answer.
pub const EXIT_NEGATIVE: u8 = 1;
/// Bad command line: an unknown flag, a missing or invalid value (clap's code too).
pub const EXIT_USAGE: u8 = 2;
/// What was asked for does not exist: an event, an order, a SKU, the data directory.
pub const EXIT_NOT_FOUND: u8 = 3;
/// The command could not do its work: a store, AWS, the network, a file, a server.
pub const EXIT_FAILURE: u8 = 4;

/// The exit codes as `einmal --help` and the README list them.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  the command ran and the answer is no (config check found problems, a replay left
     events failed, missing or busy, send got a non-2xx answer)
  2  usage error (unknown flag, missing or invalid value, an unset EINMAL_* variable)
  3  not found (event, order, SKU, the --data-dir store, or an AWS table, queue or
     parameter `serve --backend aws` needs)
  4  failure (store, AWS, network, file, server)

With --json, data goes to stdout as JSON and an error to stderr as
{\"error\": {\"code\": \"usage|not_found|failure\", \"message\": \"...\"}}.";

#[derive(Debug, Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Failure(String),
}

impl CliError {
    /// The `code` of the JSON error object.
    pub fn code(&self) -> &'static str {
        match self {
            CliError::Usage(_) => "usage",
            CliError::NotFound(_) => "not_found",
            CliError::Failure(_) => "failure",
        }
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::NotFound(_) => EXIT_NOT_FOUND,
            CliError::Failure(_) => EXIT_FAILURE,
        }
    }

    /// Print the error on stderr (a line, or with `json` one JSON object) and give its
    /// exit code.
    pub fn report(&self, json: bool) -> ExitCode {
        eprintln!("{}", self.rendered(json));
        ExitCode::from(self.exit_code())
    }

    /// What [`CliError::report`] prints. A message may quote stored data (an event
    /// key, a destination's answer): each of its lines is escaped
    /// (`einmal::text::terminal_safe`), the JSON form too.
    pub fn rendered(&self, json: bool) -> String {
        let message = self.to_string();
        if json {
            let text = error_json(self.code(), &message).to_string();
            einmal::text::json_terminal_safe(&text).into_owned()
        } else {
            let lines: Vec<_> = message.lines().map(einmal::text::terminal_safe).collect();
            format!("einmal: {}", lines.join("\n"))
        }
    }
}

/// The JSON error object: `{"error": {"code": ..., "message": ...}}`.
pub fn error_json(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({ "error": { "code": code, "message": message } })
}

/// Most failures come from the library as a message: a failure, not a usage error.
impl From<String> for CliError {
    fn from(message: String) -> Self {
        CliError::Failure(message)
    }
}

impl From<&str> for CliError {
    fn from(message: &str) -> Self {
        CliError::Failure(message.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_code_and_exit_code() {
        let all = [
            (CliError::Usage("u".into()), "usage", EXIT_USAGE),
            (CliError::NotFound("n".into()), "not_found", EXIT_NOT_FOUND),
            (CliError::from("f"), "failure", EXIT_FAILURE),
        ];
        for (err, code, exit) in all {
            assert_eq!((err.code(), err.exit_code()), (code, exit));
            assert_eq!(
                error_json(err.code(), &err.to_string())["error"]["code"],
                code
            );
        }
    }

    #[test]
    fn messages_quoting_stored_data_are_escaped() {
        let err = CliError::NotFound("no event stripe#demo#evt_\u{1b}[2J\u{202e}1".into());
        assert_eq!(
            err.rendered(false),
            "einmal: no event stripe#demo#evt_\\u{1b}[2J\\u{202e}1"
        );
        let json = err.rendered(true);
        assert!(!json.chars().any(einmal::text::is_unsafe), "{json}");
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            value["error"]["message"],
            "no event stripe#demo#evt_\u{1b}[2J\u{202e}1"
        );
        // A message of several lines keeps them.
        let err = CliError::Usage("first\nsecond\u{7}".into());
        assert_eq!(err.rendered(false), "einmal: first\nsecond\\u{7}");
    }
}
