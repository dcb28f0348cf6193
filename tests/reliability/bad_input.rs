//! Bad input never panics. Random YAML is covered by `config_fuzz.rs`; here: mutations of a
//! valid config (every error names a path), random CLI arguments, and random bytes and mutated
//! JSON into the ARM response parsers (scale-set model, and a real emulator answer cut short
//! for the long-running-operation status).

use crate::support;

use proptest::prelude::*;
use std::collections::HashMap;
use support::*;
use vmss_capacity_controller::azure::arm::scale_set_from_model;
use vmss_capacity_controller::config::{load, ConfigSources};
use vmss_capacity_controller::emulator::FaultKind;

const VALID: &str = r#"azure:
  resourceManagerEndpoint: http://127.0.0.1:8443
  authorityHost: http://127.0.0.1:8443
  tenantId: tenant
  subscriptionId: "00000000-0000-0000-0000-000000000000"
  resourceGroup: rg-demo
  auth: {method: clientSecret, clientId: controller}
enableVMSSEtag: true
scanInterval: 10s
nodeGroups:
  - {name: pool-a, minSize: 1, maxSize: 10, desiredCapacity: 3}
  - name: pool-b
    minSize: 0
    maxSize: 4
"#;

/// A scale set as ARM returns it.
const VMSS_JSON: &str = r#"{"name":"pool-a","id":"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool-a","type":"Microsoft.Compute/virtualMachineScaleSets","location":"westeurope","etag":"\"3\"","tags":{"a":"b"},"sku":{"name":"Standard_D2s_v5","tier":"Standard","capacity":3},"properties":{"provisioningState":"Succeeded","uniqueId":"u","orchestrationMode":"Uniform"}}"#;

#[derive(Debug, Clone)]
enum Mutation {
    DeleteLine(usize),
    DuplicateLine(usize),
    ReplaceChar(usize, char),
    InsertText(usize, String),
    Truncate(usize),
}

fn mutate(text: &str, m: &Mutation) -> String {
    if text.is_empty() {
        return String::new();
    }
    let lines: Vec<&str> = text.split('\n').collect();
    match m {
        Mutation::DeleteLine(i) => {
            let i = i % lines.len();
            lines
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, l)| *l)
                .collect::<Vec<_>>()
                .join("\n")
        }
        Mutation::DuplicateLine(i) => {
            let i = i % lines.len();
            let mut v = lines.clone();
            v.insert(i, lines[i]);
            v.join("\n")
        }
        Mutation::ReplaceChar(i, c) => {
            let n = text.chars().count();
            text.chars()
                .enumerate()
                .map(|(j, x)| if j == i % n { *c } else { x })
                .collect()
        }
        Mutation::InsertText(i, s) => {
            let mut t: Vec<char> = text.chars().collect();
            let at = i % (t.len() + 1);
            for (k, c) in s.chars().enumerate() {
                t.insert(at + k, c);
            }
            t.into_iter().collect()
        }
        Mutation::Truncate(i) => text.chars().take(i % text.chars().count()).collect(),
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::DeleteLine),
        any::<usize>().prop_map(Mutation::DuplicateLine),
        (
            any::<usize>(),
            prop::sample::select(vec![
                ':', '-', ' ', '"', '{', '\t', '9', 'x', '\n', '#', '&', '*', '!'
            ])
        )
            .prop_map(|(i, c)| Mutation::ReplaceChar(i, c)),
        (
            any::<usize>(),
            prop::sample::select(vec![
                "maxSize: -1",
                "minSize: 99999999999",
                "\n  bogusKey: 1",
                "http://example.com",
                " !!binary x",
                "[",
                "}",
                "*a",
                "&a ",
                "\u{0}",
                "é",
                "- ",
                ": :",
                "desiredCapacity: 1e9",
                "scanInterval: -5s",
            ])
        )
            .prop_map(|(i, s)| Mutation::InsertText(i, s.to_string())),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn load_text(text: &str) -> Result<(), Vec<(String, String)>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).unwrap();
    load(&ConfigSources {
        config_file: Some(path),
        env: HashMap::from([("ARM_CLIENT_SECRET".to_string(), "s".to_string())]),
        ..Default::default()
    })
    .map(|_| ())
    .map_err(|e| e.0.into_iter().map(|p| (p.path, p.message)).collect())
}

#[test]
fn the_unmutated_config_is_valid_so_mutations_start_from_good_input() {
    assert_eq!(load_text(VALID), Ok(()));
}

#[test]
fn the_unmutated_scale_set_parses_so_mutations_start_from_good_input() {
    let model = serde_json::from_str(VMSS_JSON).expect("valid model");
    let s = scale_set_from_model(model, None).expect("converts");
    assert_eq!(s.capacity, Some(3));
    assert_eq!(s.etag.as_deref(), Some("\"3\""));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn mutated_valid_configs_never_panic_and_every_problem_names_its_path(
        ms in prop::collection::vec(mutation(), 1..4)
    ) {
        let text = ms.iter().fold(VALID.to_string(), |t, m| mutate(&t, m));
        if let Err(problems) = load_text(&text) {
            prop_assert!(!problems.is_empty());
            for (path, message) in problems {
                prop_assert!(!path.trim().is_empty(), "problem without a path: {message}");
                prop_assert!(!message.trim().is_empty(), "problem without a message at {path}");
            }
        }
    }

    #[test]
    fn random_cli_arguments_never_panic(
        args in prop::collection::vec(
            prop_oneof![
                prop::sample::select(vec![
                    "run", "demo", "emulator", "get", "scale", "check-config", "--config",
                    "--once", "--dry-run", "--to", "--if-match", "--if-none-match", "*", "--nodes",
                    "1:5:pool-a", "--help", "-h", "--version", "--log-format", "json", "--no-etag",
                    "--", "=", "-", "--to=-1", "--nodes=::", "--listen", "127.0.0.1:0",
                ]).prop_map(str::to_string),
                any::<String>(),
            ],
            0..8,
        )
    ) {
        use clap::Parser;
        let argv = std::iter::once("vmss-capacity-controller".to_string()).chain(args);
        // Ok or a clap error (which includes --help and --version): never a panic.
        let _ = vmss_capacity_controller::cli::Cli::try_parse_from(argv);
    }

    #[test]
    fn random_bytes_into_the_scale_set_parser_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(model) = serde_json::from_slice(&bytes) {
            let _ = scale_set_from_model(model, None);
        }
    }

    #[test]
    fn mutated_scale_set_json_never_panics(
        cut in 0..VMSS_JSON.len(),
        at in 0..VMSS_JSON.len(),
        insert in prop::sample::select(vec![
            "", "null", "-1", "1e400", "\"\"", "[]", "{}", "9223372036854775808", "true", "\"x\":",
        ]),
        etag in proptest::option::of(".{0,8}"),
    ) {
        let mut text = VMSS_JSON.to_string();
        if text.is_char_boundary(at) {
            text.insert_str(at, insert);
        }
        let text: String = if cut % 3 == 0 { text.chars().take(cut).collect() } else { text };
        if let Ok(model) = serde_json::from_str(&text) {
            let _ = scale_set_from_model(model, etag);
        }
        // The same text as a generic value with pieces replaced by wrong types.
        if let Ok(serde_json::Value::Object(mut map)) = serde_json::from_str::<serde_json::Value>(VMSS_JSON) {
            let key = ["name", "sku", "tags", "etag", "properties", "location"][at % 6];
            map.insert(key.to_string(), serde_json::from_str(insert).unwrap_or(serde_json::Value::Null));
            if let Ok(model) = serde_json::from_value(serde_json::Value::Object(map)) {
                let _ = scale_set_from_model(model, None);
            }
        }
    }
}

#[tokio::test]
async fn a_truncated_operation_status_is_an_error_not_a_panic() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(4))],
        |_| {},
    )
    .await;
    let current = h
        .arm
        .get_scale_set("pool-a")
        .await
        .unwrap()
        .expect("exists");
    let acc = h
        .arm
        .put_capacity(
            &current,
            4,
            &vmss_capacity_controller::azure::Precondition::IfMatch(current.etag.clone().unwrap()),
        )
        .await
        .unwrap();
    let url = acc
        .async_operation
        .expect("the write returns an operation URL");
    assert!(
        h.arm.poll_operation(&url).await.is_ok(),
        "a whole answer parses"
    );
    h.state.inject_fault(fault(
        Some("GET"),
        Some("operations"),
        FaultKind::Truncate,
        Some(1),
    ));
    let err = h
        .arm
        .poll_operation(&url)
        .await
        .expect_err("half an answer is an error");
    assert!(error_chain(&err).contains("poll"), "{}", error_chain(&err));
}
