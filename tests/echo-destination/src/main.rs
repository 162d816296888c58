//! A Lambda destination for the tests of the Lambda sink (`destination_aws`), run by
//! `cargo lambda watch`: it answers with the payload it was given and, when
//! `EINMAL_ECHO_DIR` is set, writes the payload to `DIR/<key>.json` so the test can see
//! what arrived. It fails (a function error) for every key listed, comma-separated, in
//! `EINMAL_ECHO_FAIL_KEYS`.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;

async fn echo(event: LambdaEvent<Value>) -> Result<Value, Error> {
    let payload = event.payload;
    let key = payload["key"].as_str().unwrap_or_default().to_string();
    let failing = std::env::var("EINMAL_ECHO_FAIL_KEYS").unwrap_or_default();
    if !key.is_empty() && failing.split(',').any(|k| k == key) {
        return Err(Error::from(format!("echo-destination refuses {key}")));
    }
    if let Some(dir) = std::env::var_os("EINMAL_ECHO_DIR").filter(|d| !d.is_empty()) {
        // Keys are `msg_` + hex: safe as file names; anything else is not recorded.
        if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            let path = std::path::Path::new(&dir).join(format!("{key}.json"));
            std::fs::write(path, serde_json::to_vec(&payload)?)?;
        }
    }
    Ok(payload)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(echo)).await
}
