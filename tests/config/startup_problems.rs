//! Refusals a user can meet at start-up, each one line naming the object, what is wrong and the
//! fix: no Kubernetes API server, a verb RBAC does not grant (asked as `kubectl auth can-i`
//! asks), a node group Azure does not have, a pool AKS's own autoscaler scales.

use crate::support;

use std::time::Duration;
use support::{group, settings};
use vmss_capacity_controller::config::{DemandKind, KubernetesSettings, Settings};
use vmss_capacity_controller::emulator::EmulatorBuilder;
use vmss_capacity_controller::kube::access;

async fn client(kubeconfig: &std::path::Path) -> kube::Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("client config");
    kube::Client::try_from(config).expect("client")
}

fn pod_driven(base: &str, kubeconfig: &std::path::Path) -> Settings {
    let mut s = settings(base, vec![group("web", 0, 5, None)]);
    s.kubernetes = KubernetesSettings {
        enabled: true,
        kubeconfig: Some(kubeconfig.to_path_buf()),
        ..KubernetesSettings::default()
    };
    s.pod_demand.kind = DemandKind::Pods;
    s.scale_down.enabled = true;
    s
}

#[tokio::test]
async fn every_verb_rbac_refuses_is_one_line_with_the_can_i_command_and_nothing_else_is_reported() {
    let emulator = EmulatorBuilder::new()
        .kubernetes(true)
        .start()
        .await
        .unwrap();
    let kube_state = emulator.kube().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, emulator.kubeconfig().unwrap()).unwrap();
    let s = pod_driven(&emulator.base_url(), &kubeconfig);
    let client = client(&kubeconfig).await;

    let granted = access::check(&client, &s, false, Duration::from_secs(5)).await;
    assert!(granted.is_empty(), "all granted: {granted:?}");

    kube_state.forbid_reads("pods", true);
    kube_state.forbid_reads("csinodes", true);
    let lines: Vec<String> = access::check(&client, &s, false, Duration::from_secs(5))
        .await
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(lines.len(), 4, "list and watch of each: {lines:#?}");
    for verb in ["list", "watch"] {
        assert!(lines.iter().any(|l| l.starts_with(&format!(
            "kubernetes RBAC: this controller's identity may not {verb} pods cluster-wide (needed to see pending and running pods); fix: apply the ClusterRole and Role of deploy/base"
        )) && l.ends_with(&format!("`kubectl auth can-i {verb} pods -A`"))), "{lines:#?}");
        assert!(
            lines.iter().any(|l| l.contains(&format!(
                "may not {verb} csinodes.storage.k8s.io cluster-wide (needed to count volume attach limits)"
            ))),
            "{lines:#?}"
        );
    }
    assert!(lines.iter().all(|l| !l.contains('\n')), "one line each");

    // The reflectors run whenever the Kubernetes side is on, pod demand or not: the same reads
    // are needed, and a dry run needs them too.
    let mut configured = s.clone();
    configured.pod_demand.kind = DemandKind::Configured;
    for dry_run in [false, true] {
        let refused = access::check(&client, &configured, dry_run, Duration::from_secs(5)).await;
        assert_eq!(refused.len(), 4, "dry run {dry_run}: {refused:?}");
    }
}

#[tokio::test]
async fn an_api_server_that_never_answers_is_named_with_the_kubeconfig_and_the_check_to_run() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let s = pod_driven("http://127.0.0.1:9", &kubeconfig);
    let client = client(&kubeconfig).await;
    let started = std::time::Instant::now();
    let problems = access::check(&client, &s, false, Duration::from_secs(2)).await;
    assert!(started.elapsed() < Duration::from_secs(10), "bounded wait");
    assert_eq!(problems.len(), 1, "{problems:?}");
    let line = problems[0].to_string();
    assert!(
        line.starts_with(&format!(
            "kubernetes API server of {}: not reachable with these credentials (",
            kubeconfig.display()
        )),
        "{line}"
    );
    assert!(line.contains("fix: check kubernetes.kubeconfig"), "{line}");
    assert!(line.contains("`kubectl get --raw /version`"), "{line}");
}

#[tokio::test]
async fn a_dry_run_is_only_asked_for_what_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let s = pod_driven("http://127.0.0.1:9", &dir.path().join("kubeconfig"));
    let writes = access::needs(&s, false);
    let reads = access::needs(&s, true);
    assert!(writes
        .iter()
        .any(|n| n.verb == "update" && n.resource == "leases"));
    assert!(writes
        .iter()
        .any(|n| n.resource == "pods" && n.subresource == Some("eviction")));
    // A dry run takes no Lease and writes no status: not even their reads are asked for.
    assert!(reads.iter().all(|n| matches!(n.verb, "list" | "watch")));
    assert!(reads
        .iter()
        .any(|n| n.verb == "watch" && n.resource == "pods"));
    // Both status ConfigMaps, by name, as the Role's resourceNames grant them.
    for name in [
        "vmss-capacity-controller-status",
        "cluster-autoscaler-status",
        "vmss-capacity-controller-ca-status",
    ] {
        assert!(
            writes
                .iter()
                .any(|n| n.verb == "update" && n.name.as_deref() == Some(name)),
            "{name}: {writes:#?}"
        );
    }
}

#[tokio::test]
async fn the_capacity_apis_are_asked_for_only_when_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = pod_driven("http://127.0.0.1:9", &dir.path().join("kubeconfig"));
    let asks = |s: &vmss_capacity_controller::config::Settings, verb: &str, resource: &str| {
        access::needs(s, false)
            .iter()
            .any(|n| n.verb == verb && n.resource == resource)
    };
    assert!(!asks(&s, "list", "capacitybuffers"));
    assert!(!asks(&s, "list", "resourcequotas"));
    assert!(!asks(&s, "list", "provisioningrequests"));
    s.pod_demand.capacity_buffer_controller = true;
    s.pod_demand.provisioning_requests = true;
    assert!(asks(&s, "list", "capacitybuffers"));
    // The namespaces' ResourceQuotas cut buffers (LimitedByQuotas).
    assert!(asks(&s, "list", "resourcequotas"));
    assert!(asks(&s, "get", "podtemplates"));
    assert!(access::needs(&s, false).iter().any(|n| n.verb == "update"
        && n.resource == "provisioningrequests"
        && n.subresource == Some("status")));
}
