//! The AWS credentials a `--backend aws` command will use, resolved once before its
//! first call: without any, every call would fail with the SDK's own error, which names
//! neither what is missing nor how to set it.

use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::ProvideCredentials;

use crate::error::CliError;

/// What a `--backend aws` command says when the SDK finds no credentials anywhere: a
/// usage error (exit 2), like an unset `EINMAL_*` variable.
pub const NO_CREDENTIALS: &str = "no AWS credentials: set AWS_ACCESS_KEY_ID and \
     AWS_SECRET_ACCESS_KEY (moto accepts any), or AWS_PROFILE";

/// Resolve the credentials `config` provides: none at all is [`NO_CREDENTIALS`]
/// ([`CliError::Usage`]); a source that fails (an expired SSO session, a broken
/// profile, an unreachable metadata service) is a failure naming its error.
pub async fn check(config: &aws_config::SdkConfig) -> Result<(), CliError> {
    let Some(provider) = config.credentials_provider() else {
        return Err(CliError::Usage(NO_CREDENTIALS.into()));
    };
    match provider.provide_credentials().await {
        Ok(_) => Ok(()),
        Err(CredentialsError::CredentialsNotLoaded(_)) => {
            Err(CliError::Usage(NO_CREDENTIALS.into()))
        }
        Err(e) => {
            let mut message = format!("cannot load AWS credentials: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            Err(CliError::Failure(message))
        }
    }
}
