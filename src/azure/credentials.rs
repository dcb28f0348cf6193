//! TEMPORARY (replaced by the credentials branch): client-secret credential only.
use crate::config::{AuthSettings, AzureSettings, SecretSource};
use azure_core::auth::TokenCredential;
use std::sync::Arc;

/// Called with (credential kind, success) on each token fetch.
pub type CredentialHook = Arc<dyn Fn(&'static str, bool) + Send + Sync>;

/// Credential construction failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CredentialError(String);

/// Builds the credential for `azure.auth`.
pub fn build_credential(
    azure: &AzureSettings,
    http: reqwest::Client,
    _hook: Option<CredentialHook>,
) -> Result<Arc<dyn TokenCredential>, CredentialError> {
    match &azure.auth {
        AuthSettings::ClientSecret { client_id, secret } => {
            let secret = match secret {
                SecretSource::Env(v) => {
                    std::env::var(v).map_err(|_| CredentialError(format!("{v} not set")))?
                }
                SecretSource::File(p) => std::fs::read_to_string(p)
                    .map_err(|e| CredentialError(format!("{}: {e}", p.display())))?
                    .trim()
                    .to_string(),
            };
            Ok(Arc::new(azure_identity::ClientSecretCredential::new(
                Arc::new(http),
                azure.authority_host.clone(),
                azure.tenant_id.clone(),
                client_id.clone(),
                secret,
            )))
        }
        _ => Err(CredentialError("not yet".into())),
    }
}
