//! Where settings come from besides the YAML: the environment (cluster-autoscaler's variable
//! names), an `azure.json` cloud-config file, and the credential sources (identity flags, client
//! ids, secrets, token files). Each function here merges the layers for one group of settings
//! (environment over YAML over `azure.json` over defaults) and records where each value came
//! from, so that problems name the variable, key or field at fault.

use super::raw::{AuthMethod, RawAuth, RawAzure, RawConfig};
use super::validate::{check_endpoint, check_imds, positive, positive_sourced, required};
use super::{
    non_empty, sourced, AuthSettings, Problems, SecretSource, Sourced, DEFAULT_ARM_ENDPOINT,
    DEFAULT_AUTHORITY_HOST, DEFAULT_IMDS_ENDPOINT, DEFAULT_INSTANCE_CACHE_TTL,
    DEFAULT_VMSS_CACHE_TTL,
};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use url::Url;

/// A problem path inside `azure.json`.
fn js(field: &str) -> String {
    format!("azure.json:{field}")
}

/// Gives the problems of the `azure.json` file (`azure.json:FIELD`, or the file whole) that
/// file, so they name it as it was given.
pub(super) fn locate(problems: &mut Problems, file: &Path) {
    let whole = file.display().to_string();
    for p in problems.0.iter_mut().filter(|p| p.file.is_none()) {
        if p.path.starts_with("azure.json:") || p.path == whole {
            p.file = Some(super::FileLocation {
                path: file.to_path_buf(),
                line_column: None,
            });
        }
    }
}

/// Reads the `azure.json` cloud-config file, if one is named; problems name the file or field.
pub(super) fn read_cloud_config(path: Option<&Path>, problems: &mut Problems) -> CloudConfig {
    let Some(path) = path else {
        return CloudConfig::default();
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let mut de = serde_json::Deserializer::from_str(&text);
            match serde_path_to_error::deserialize::<_, CloudConfig>(&mut de) {
                Ok(c) => c,
                Err(e) => {
                    let inner = e.inner();
                    let at = (inner.line() > 0).then(|| (inner.line(), inner.column()));
                    let message = inner.to_string();
                    let message = match (at, message.find(" at line ")) {
                        (Some(_), Some(i)) => message[..i].to_string(),
                        _ => message,
                    };
                    problems.push_located(format!("azure.json:{}", e.path()), path, at, message);
                    CloudConfig::default()
                }
            }
        }
        Err(e) => {
            problems.push_in_file(path, None, format!("cannot read azure.json: {e}"));
            CloudConfig::default()
        }
    }
}

/// The three endpoints, checked; `None` where a problem was recorded.
pub(super) struct Endpoints {
    pub(super) arm: Option<Url>,
    pub(super) aad: Option<Url>,
    pub(super) imds: Option<Url>,
}

/// ARM, AAD and IMDS endpoints: environment, then YAML, then `azure.json` (its explicit endpoint,
/// then its named `cloud`), then Azure's public cloud.
pub(super) fn endpoints(
    env: &EnvReader,
    ya: &RawAzure,
    cc: &CloudConfig,
    problems: &mut Problems,
) -> Endpoints {
    let (cloud_arm, cloud_aad) = match non_empty(cc.cloud.clone()) {
        Some(name) => match cloud_endpoints(&name) {
            Some(e) => (Some(e.0), Some(e.1)),
            None => {
                problems.push(
                    js("cloud"),
                    format!("unknown cloud {name:?}; use AzurePublicCloud, AzureUSGovernmentCloud or AzureChinaCloud"),
                );
                (None, None)
            }
        },
        None => (None, None),
    };
    let arm = env
        .get("ARM_RESOURCE_MANAGER_ENDPOINT")
        .or_else(|| {
            non_empty(ya.resource_manager_endpoint.clone())
                .map(|v| sourced(v, "azure.resourceManagerEndpoint"))
        })
        .or_else(|| {
            non_empty(cc.resource_manager_endpoint.clone())
                .map(|v| sourced(v, js("resourceManagerEndpoint")))
        })
        .or_else(|| cloud_arm.map(|v| sourced(v.to_string(), js("cloud"))))
        .unwrap_or_else(|| {
            sourced(
                DEFAULT_ARM_ENDPOINT.to_string(),
                "azure.resourceManagerEndpoint",
            )
        });
    let aad = env
        .get("AZURE_AUTHORITY_HOST")
        .or_else(|| non_empty(ya.authority_host.clone()).map(|v| sourced(v, "azure.authorityHost")))
        .or_else(|| cloud_aad.map(|v| sourced(v.to_string(), js("cloud"))))
        .unwrap_or_else(|| sourced(DEFAULT_AUTHORITY_HOST.to_string(), "azure.authorityHost"));
    let imds = non_empty(ya.imds_endpoint.clone())
        .map(|v| sourced(v, "azure.imdsEndpoint"))
        .unwrap_or_else(|| sourced(DEFAULT_IMDS_ENDPOINT.to_string(), "azure.imdsEndpoint"));
    Endpoints {
        arm: check_endpoint(&arm, problems),
        aad: check_endpoint(&aad, problems),
        imds: check_imds(&imds, problems),
    }
}

/// Tenant, subscription and resource group as found (required-ness is checked later, since
/// the tenant is optional for some credentials).
pub(super) struct Scope {
    pub(super) tenant: Option<Sourced<String>>,
    pub(super) subscription: Option<Sourced<String>>,
    pub(super) resource_group: Option<Sourced<String>>,
}

/// Tenant, subscription and resource group: environment, then YAML, then `azure.json`.
pub(super) fn scope(env: &EnvReader, ya: &RawAzure, cc: &CloudConfig) -> Scope {
    let tenant = env
        .last_of(&["ARM_TENANT_ID", "AZURE_TENANT_ID"])
        .or_else(|| non_empty(ya.tenant_id.clone()).map(|v| sourced(v, "azure.tenantId")))
        .or_else(|| non_empty(cc.tenant_id.clone()).map(|v| sourced(v, js("tenantId"))));
    let subscription = env
        .get("ARM_SUBSCRIPTION_ID")
        .or_else(|| {
            non_empty(ya.subscription_id.clone()).map(|v| sourced(v, "azure.subscriptionId"))
        })
        .or_else(|| {
            non_empty(cc.subscription_id.clone()).map(|v| sourced(v, js("subscriptionId")))
        });
    let resource_group = env
        .get("ARM_RESOURCE_GROUP")
        .or_else(|| non_empty(ya.resource_group.clone()).map(|v| sourced(v, "azure.resourceGroup")))
        .or_else(|| non_empty(cc.resource_group.clone()).map(|v| sourced(v, js("resourceGroup"))));
    Scope {
        tenant,
        subscription,
        resource_group,
    }
}

/// The credential: which method (identity flags, `azure.auth.method`, or a client id plus a
/// secret), then what that method needs. `None` where a problem was recorded.
pub(super) fn auth(
    env: &EnvReader,
    yauth: &RawAuth,
    cc: &CloudConfig,
    cloud_config_file: Option<&Path>,
    problems: &mut Problems,
) -> Option<AuthSettings> {
    if yauth.client_secret.is_some() {
        problems.push(
            "azure.auth.clientSecret",
            "secrets never go in YAML; use clientSecretFile or the ARM_CLIENT_SECRET environment variable",
        );
    }
    let flags = identity_flags(env, cc, problems);
    let client_id = env
        .last_of(&["ARM_CLIENT_ID", "AZURE_CLIENT_ID"])
        .or_else(|| non_empty(yauth.client_id.clone()).map(|v| sourced(v, "azure.auth.clientId")))
        .or_else(|| non_empty(cc.aad_client_id.clone()).map(|v| sourced(v, js("aadClientId"))));
    let secret = client_secret_source(env, yauth, cc, cloud_config_file, problems);
    let method =
        flags.env.or(yauth.method).or(flags.json).or_else(|| {
            (client_id.is_some() && secret.is_some()).then_some(AuthMethod::ClientSecret)
        });
    let auth = credential(method, client_id, secret, env, yauth, cc, problems);
    check_unused_auth_keys(yauth, problems);
    auth
}

/// The identity method named by flags: the environment's, and `azure.json`'s.
struct IdentityFlags {
    env: Option<AuthMethod>,
    json: Option<AuthMethod>,
}

/// Reads the managed- and workload-identity flags; both set is a problem.
fn identity_flags(env: &EnvReader, cc: &CloudConfig, problems: &mut Problems) -> IdentityFlags {
    let env_msi = env.bool("ARM_USE_MANAGED_IDENTITY_EXTENSION", problems);
    let env_wi = {
        let a = env.bool("ARM_USE_FEDERATED_WORKLOAD_IDENTITY_EXTENSION", problems);
        let b = env.bool("ARM_USE_WORKLOAD_IDENTITY_EXTENSION", problems);
        match (a, b) {
            (Some(a), Some(b)) => Some(if a.value { a } else { b }),
            (a, b) => a.or(b),
        }
    };
    let json_msi = cc
        .use_managed_identity_extension
        .map(|v| sourced(v, js("useManagedIdentityExtension")));
    let json_wi = cc
        .use_workload_identity_extension
        .map(|v| sourced(v, js("useWorkloadIdentityExtension")))
        .or_else(|| {
            cc.use_federated_workload_identity_extension
                .map(|v| sourced(v, js("useFederatedWorkloadIdentityExtension")))
        });
    let msi = env_msi.clone().or(json_msi.clone()).filter(|v| v.value);
    let wi = env_wi.clone().or(json_wi.clone()).filter(|v| v.value);
    if let (Some(m), Some(w)) = (&msi, &wi) {
        problems.push(
            m.origin.clone(),
            format!(
                "you can not combine both managed identity and workload identity (also set: {})",
                w.origin
            ),
        );
    }
    let env_method = match (
        env_msi.as_ref().filter(|v| v.value),
        env_wi.as_ref().filter(|v| v.value),
    ) {
        (_, Some(_)) => Some(AuthMethod::WorkloadIdentity),
        (Some(_), None) => Some(AuthMethod::ManagedIdentity),
        _ => None,
    };
    let json_method = match (&json_msi, &json_wi) {
        (_, Some(w)) if w.value => Some(AuthMethod::WorkloadIdentity),
        (Some(m), _) if m.value => Some(AuthMethod::ManagedIdentity),
        _ => None,
    };
    IdentityFlags {
        env: env_method,
        json: json_method,
    }
}

/// Where a client secret would come from: `ARM_CLIENT_SECRET` (cluster-autoscaler's name), then
/// `AZURE_CLIENT_SECRET`, then `azure.auth.clientSecretFile`, then `azure.json`'s
/// `aadClientSecret` (read from that file when needed). An unreadable secret file is a problem.
fn client_secret_source(
    env: &EnvReader,
    yauth: &RawAuth,
    cc: &CloudConfig,
    cloud_config_file: Option<&Path>,
    problems: &mut Problems,
) -> Option<SecretSource> {
    let secret = if let Some(name) = ["ARM_CLIENT_SECRET", "AZURE_CLIENT_SECRET"]
        .into_iter()
        .find(|n| env.get(n).is_some())
    {
        Some(SecretSource::Env(name.to_string()))
    } else if let Some(f) = &yauth.client_secret_file {
        Some(SecretSource::File(f.clone()))
    } else if non_empty(cc.aad_client_secret.clone()).is_some() {
        cloud_config_file.map(|p| SecretSource::File(p.to_path_buf()))
    } else {
        None
    };
    if let Some(f) = &yauth.client_secret_file {
        if let Err(e) = std::fs::metadata(f) {
            problems.push(
                "azure.auth.clientSecretFile",
                format!("cannot read {}: {e}", f.display()),
            );
        }
    }
    secret
}

/// What the chosen method needs, each missing piece a problem naming its key.
fn credential(
    method: Option<AuthMethod>,
    client_id: Option<Sourced<String>>,
    secret: Option<SecretSource>,
    env: &EnvReader,
    yauth: &RawAuth,
    cc: &CloudConfig,
    problems: &mut Problems,
) -> Option<AuthSettings> {
    match method {
        None => {
            problems.push(
                "azure.auth",
                "no credential configured: set azure.auth.method (clientSecret, workloadIdentity, managedIdentity, azureCli) or ARM_CLIENT_ID + ARM_CLIENT_SECRET, ARM_USE_WORKLOAD_IDENTITY_EXTENSION, ARM_USE_MANAGED_IDENTITY_EXTENSION",
            );
            None
        }
        Some(AuthMethod::ClientSecret) => {
            let id = required(
                client_id,
                "azure.auth.clientId",
                "clientSecret needs the application (client) id; or set ARM_CLIENT_ID",
                problems,
            );
            match secret {
                Some(secret) => Some(AuthSettings::ClientSecret {
                    client_id: id,
                    secret,
                }),
                None => {
                    problems.push(
                        "azure.auth.clientSecretFile",
                        "clientSecret needs a secret: set clientSecretFile or the ARM_CLIENT_SECRET environment variable",
                    );
                    None
                }
            }
        }
        Some(AuthMethod::WorkloadIdentity) => {
            let id = required(
                client_id,
                "azure.auth.clientId",
                "workloadIdentity needs the application (client) id; or set AZURE_CLIENT_ID",
                problems,
            );
            let file = env
                .get("AZURE_FEDERATED_TOKEN_FILE")
                .map(|v| PathBuf::from(v.value))
                .or(yauth.token_file.clone())
                .or(cc
                    .aad_federated_token_file
                    .clone()
                    .filter(|p| !p.as_os_str().is_empty()));
            match file {
                Some(token_file) => Some(AuthSettings::WorkloadIdentity {
                    client_id: id,
                    token_file,
                }),
                None => {
                    problems.push(
                        "azure.auth.tokenFile",
                        "workloadIdentity needs the projected token file: set tokenFile or AZURE_FEDERATED_TOKEN_FILE",
                    );
                    None
                }
            }
        }
        Some(AuthMethod::ManagedIdentity) => {
            let id = env
                .get("ARM_USER_ASSIGNED_IDENTITY_ID")
                .map(|v| v.value)
                .or(non_empty(yauth.client_id.clone())
                    .filter(|_| yauth.method == Some(AuthMethod::ManagedIdentity)))
                .or(non_empty(cc.user_assigned_identity_id.clone()));
            Some(AuthSettings::ManagedIdentity { client_id: id })
        }
        Some(AuthMethod::AzureCli) => Some(AuthSettings::AzureCli),
    }
}

/// Keys of another method than the one named in `azure.auth.method` are reported, not ignored.
fn check_unused_auth_keys(yauth: &RawAuth, problems: &mut Problems) {
    let Some(m) = yauth.method else {
        return;
    };
    if m != AuthMethod::WorkloadIdentity && yauth.token_file.is_some() {
        problems.push(
            "azure.auth.tokenFile",
            format!("not used by method {}", m.name()),
        );
    }
    if m != AuthMethod::ClientSecret && yauth.client_secret_file.is_some() {
        problems.push(
            "azure.auth.clientSecretFile",
            format!("not used by method {}", m.name()),
        );
    }
}

/// `enableVMSSEtag`: `AZURE_ENABLE_VMSS_ETAG`, then YAML, then `azure.json`, default on.
pub(super) fn enable_vmss_etag(
    env: &EnvReader,
    raw: &RawConfig,
    cc: &CloudConfig,
    problems: &mut Problems,
) -> bool {
    env.bool("AZURE_ENABLE_VMSS_ETAG", problems)
        .map(|v| v.value)
        .or(raw.enable_vmss_etag)
        .or(cc.enable_vmss_etag)
        .unwrap_or(true)
}

/// The three cache timings, merged from their layers.
pub(super) struct CacheTimings {
    pub(super) vmss_cache_ttl: Duration,
    pub(super) instance_cache_ttl: Duration,
    pub(super) instance_cache_jitter: Duration,
}

/// Cache TTLs and jitter: environment (seconds), then YAML (durations), then `azure.json`
/// (seconds, under either of cloud-provider-azure's two names).
pub(super) fn cache_timings(
    env: &EnvReader,
    raw: &RawConfig,
    cc: &CloudConfig,
    problems: &mut Problems,
) -> CacheTimings {
    let json_vmss_ttl = cc
        .vmss_cache_ttl
        .map(|v| sourced(v, js("vmssCacheTTL")))
        .or(cc
            .vmss_cache_ttl_in_seconds
            .map(|v| sourced(v, js("vmssCacheTTLInSeconds"))));
    let vmss_cache_ttl = layered_ttl(
        json_vmss_ttl,
        env,
        &["AZURE_VMSS_CACHE_TTL_IN_SECONDS", "AZURE_VMSS_CACHE_TTL"],
        raw.vmss_cache_ttl,
        "vmssCacheTTL",
        DEFAULT_VMSS_CACHE_TTL,
        problems,
    );
    let json_inst_ttl = cc
        .vmss_vms_cache_ttl
        .map(|v| sourced(v, js("vmssVmsCacheTTL")))
        .or(cc
            .vmss_virtual_machines_cache_ttl_in_seconds
            .map(|v| sourced(v, js("vmssVirtualMachinesCacheTTLInSeconds"))));
    let instance_cache_ttl = layered_ttl(
        json_inst_ttl,
        env,
        &[
            "AZURE_VMSS_VMS_CACHE_TTL_IN_SECONDS",
            "AZURE_VMSS_VMS_CACHE_TTL",
        ],
        raw.instance_cache_ttl,
        "instanceCacheTTL",
        DEFAULT_INSTANCE_CACHE_TTL,
        problems,
    );
    let json_jitter = cc
        .vmss_vms_cache_jitter
        .map(|v| sourced(v, js("vmssVmsCacheJitter")))
        .and_then(|v| seconds(v, true, problems));
    let env_jitter = env
        .int(&["AZURE_VMSS_VMS_CACHE_JITTER"], problems)
        .and_then(|v| seconds(v, true, problems));
    let instance_cache_jitter = env_jitter
        .map(|v| v.value)
        .or(raw.instance_cache_jitter.map(|d| d.0))
        .or(json_jitter.map(|v| v.value))
        .unwrap_or(Duration::ZERO);
    CacheTimings {
        vmss_cache_ttl,
        instance_cache_ttl,
        instance_cache_jitter,
    }
}

/// One TTL from its three layers. The `azure.json` and environment values are checked even when
/// a higher layer wins, so a bad value there is reported rather than silently shadowed.
fn layered_ttl(
    json: Option<Sourced<i64>>,
    env: &EnvReader,
    env_names: &[&str],
    yaml: Option<super::raw::HumanDuration>,
    yaml_path: &str,
    default: Duration,
    problems: &mut Problems,
) -> Duration {
    let json = json.and_then(|v| seconds(v, false, problems));
    let from_env = env
        .int(env_names, problems)
        .and_then(|v| seconds(v, false, problems));
    match from_env {
        Some(v) => v.value,
        None => match yaml {
            Some(d) => positive(Some(d), default, yaml_path, problems),
            None => positive_sourced(json, default, problems),
        },
    }
}

/// The `azure.json` fields the controller reads. Unknown fields are ignored on purpose: the
/// file is cloud-provider-azure's, with dozens of fields that do not concern us.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CloudConfig {
    pub(super) cloud: Option<String>,
    pub(super) tenant_id: Option<String>,
    pub(super) subscription_id: Option<String>,
    pub(super) resource_group: Option<String>,
    pub(super) aad_client_id: Option<String>,
    pub(super) aad_client_secret: Option<String>,
    pub(super) use_managed_identity_extension: Option<bool>,
    #[serde(rename = "userAssignedIdentityID")]
    pub(super) user_assigned_identity_id: Option<String>,
    pub(super) use_federated_workload_identity_extension: Option<bool>,
    pub(super) use_workload_identity_extension: Option<bool>,
    pub(super) aad_federated_token_file: Option<PathBuf>,
    #[serde(rename = "vmssCacheTTLInSeconds")]
    pub(super) vmss_cache_ttl_in_seconds: Option<i64>,
    #[serde(rename = "vmssCacheTTL")]
    pub(super) vmss_cache_ttl: Option<i64>,
    #[serde(rename = "vmssVirtualMachinesCacheTTLInSeconds")]
    pub(super) vmss_virtual_machines_cache_ttl_in_seconds: Option<i64>,
    #[serde(rename = "vmssVmsCacheTTL")]
    pub(super) vmss_vms_cache_ttl: Option<i64>,
    pub(super) vmss_vms_cache_jitter: Option<i64>,
    #[serde(rename = "enableVMSSEtag")]
    pub(super) enable_vmss_etag: Option<bool>,
    pub(super) resource_manager_endpoint: Option<String>,
    pub(super) cluster_name: Option<String>,
}

/// Reads the `aadClientSecret` field of an `azure.json` file (how [`SecretSource::File`] pointing
/// at a `.json` file is resolved). `None` if the file is not JSON or has no such field.
pub fn secret_from_cloud_config(text: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let s = v.get("aadClientSecret")?.as_str()?.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// ARM and AAD endpoints of a named Azure cloud (cloud-provider-azure's `cloud` field).
fn cloud_endpoints(name: &str) -> Option<(&'static str, &'static str)> {
    match name.trim().to_ascii_lowercase().as_str() {
        "" | "azurepubliccloud" => Some((DEFAULT_ARM_ENDPOINT, DEFAULT_AUTHORITY_HOST)),
        "azureusgovernmentcloud" | "azureusgovernment" => Some((
            "https://management.usgovcloudapi.net",
            "https://login.microsoftonline.us",
        )),
        "azurechinacloud" => Some((
            "https://management.chinacloudapi.cn",
            "https://login.chinacloudapi.cn",
        )),
        _ => None,
    }
}

// --- environment ------------------------------------------------------------------------------

/// The environment as the loader reads it (blank variables count as unset).
pub(super) struct EnvReader<'a>(pub(super) &'a HashMap<String, String>);

impl EnvReader<'_> {
    /// A non-blank variable, trimmed.
    pub(super) fn get(&self, name: &str) -> Option<Sourced<String>> {
        let v = self.0.get(name)?.trim();
        (!v.is_empty()).then(|| sourced(v.to_string(), format!("env {name}")))
    }

    /// The last of `names` that is set wins (cluster-autoscaler's order of `os.Getenv` calls).
    pub(super) fn last_of(&self, names: &[&str]) -> Option<Sourced<String>> {
        names.iter().rev().find_map(|n| self.get(n))
    }

    /// Go `strconv.ParseBool` semantics; a bad value is a problem naming the variable.
    pub(super) fn bool(&self, name: &str, problems: &mut Problems) -> Option<Sourced<bool>> {
        let v = self.get(name)?;
        match parse_go_bool(&v.value) {
            Some(b) => Some(sourced(b, v.origin)),
            None => {
                problems.push(
                    v.origin,
                    format!("{:?} is not a boolean (use true or false)", v.value),
                );
                None
            }
        }
    }

    /// A base-10 int32, like cluster-autoscaler.
    pub(super) fn int(&self, names: &[&str], problems: &mut Problems) -> Option<Sourced<i64>> {
        let v = self.last_of(names)?;
        match v.value.parse::<i32>() {
            Ok(n) => Some(sourced(i64::from(n), v.origin)),
            Err(_) => {
                problems.push(v.origin, format!("{:?} is not an integer", v.value));
                None
            }
        }
    }
}

fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Seconds from azure.json or env into a duration; `allow_zero` for jitter.
pub(super) fn seconds(
    v: Sourced<i64>,
    allow_zero: bool,
    problems: &mut Problems,
) -> Option<Sourced<Duration>> {
    if v.value < 0 || (!allow_zero && v.value == 0) {
        let need = if allow_zero { ">= 0" } else { "> 0" };
        problems.push(
            v.origin,
            format!("must be a number of seconds {need}, got {}", v.value),
        );
        return None;
    }
    Some(sourced(Duration::from_secs(v.value as u64), v.origin))
}
