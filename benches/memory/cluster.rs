//! The daemon with `demand: pods` watching a large cluster (goal under 256 MiB): 5,000 nodes in
//! 100 node groups (scale sets of 50), 50,000 pods of which 3,000 are pending, 10 DaemonSets and
//! 40 PodDisruptionBudgets, in the emulator's Kubernetes API (this process). Objects are shaped
//! as a real API server returns them, not minimal: pods with managed fields, a projected
//! service-account volume, env, probes, container statuses and five conditions; nodes with 50
//! images, node info, addresses and the usual labels. The daemon (`run --config`, the release
//! binary) lists and watches them all, makes scale-up decisions and writes capacities; its
//! `VmRSS`/`VmHWM` are read once every reflector has listed, a decision has been made, and the
//! daemon has run a while more. Quick mode: 1,000 nodes, 10,000 pods, 20 groups.

use super::common::{group_name, size_of, verdict};
use super::{mib, Daemon};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use vmss_capacity_controller::emulator::{EmulatorBuilder, ScaleSetSeed};

const SUB: &str = "00000000-0000-0000-0000-000000000000";
const RG: &str = "mc_rg_aks_westeurope";
const GOAL_MIB: f64 = 256.0;
const NAMESPACES: usize = 8;

/// The reflector's per-pod cost, parsing the same API-server JSON into k8s-openapi's `Pod` or a
/// `WirePod` and making the record: alternating rounds, medians, in this process.
fn parse_side_by_side(sample: &[String]) {
    use k8s_openapi::api::core::v1::Pod;
    use vmss_capacity_controller::pods::record::Interner;
    use vmss_capacity_controller::pods::wire::WirePod;
    let round = |wire: bool| {
        let mut interner = Interner::default();
        let t = Instant::now();
        let mut kept = 0usize;
        for text in sample {
            let pod: Pod = if wire {
                serde_json::from_str::<WirePod>(text).expect("pod").into()
            } else {
                serde_json::from_str(text).expect("pod")
            };
            kept += usize::from(interner.record(pod).node_name.is_some());
        }
        std::hint::black_box(kept);
        t.elapsed().as_secs_f64() * 1e6 / sample.len() as f64
    };
    let (mut full, mut wire) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        full.push(round(false));
        wire.push(round(true));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (f, w) = (median(&mut full), median(&mut wire));
    println!(
        "a pod off the wire into a record, {} pods, 5 alternating rounds: as k8s-openapi's Pod {f:.1} us, as a WirePod {w:.1} us ({:.2}x)",
        sample.len(),
        f / w
    );
}

fn hex(n: usize, len: usize) -> String {
    let mut s = format!("{:016x}{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15), n);
    while s.len() < len {
        s = format!("{s}{s}");
    }
    s[..len].to_string()
}

fn node_name(g: usize, i: usize) -> String {
    format!("aks-{}-12345678-vmss{i:06}", group_name(g))
}

/// A Node as the API server returns it for an AKS VMSS node.
fn node(g: usize, i: usize) -> Value {
    let (size, cpu, mem) = size_of(g);
    let name = node_name(g, i);
    let mut alloc = json!({"cpu": format!("{}m", cpu.parse::<u32>().unwrap_or(4) * 1000 - 140),
        "memory": mem, "pods": "110", "ephemeral-storage": "119703055367", "hugepages-1Gi": "0", "hugepages-2Mi": "0"});
    if g.is_multiple_of(4) {
        alloc["nvidia.com/gpu"] = json!("1");
    }
    let images: Vec<Value> = (0..50)
        .map(|k| {
            json!({"names": [
                format!("mcr.microsoft.com/oss/kubernetes/image-{k}@sha256:{}", hex(k, 64)),
                format!("mcr.microsoft.com/oss/kubernetes/image-{k}:v1.{k}.3"),
            ], "sizeBytes": 10_000_000 + k * 1_234_567})
        })
        .collect();
    let now = "2026-11-24T06:00:00Z";
    let cond = |t: &str, status: &str, reason: &str, msg: &str| json!({"type": t, "status": status, "lastHeartbeatTime": now, "lastTransitionTime": now, "reason": reason, "message": msg});
    json!({
        "metadata": {
            "name": name,
            "uid": format!("{}-{}-{}-{}-{}", hex(g * 100_000 + i, 8), hex(i, 4), hex(g, 4), hex(i + 7, 4), hex(g + i, 12)),
            "labels": {
                "agentpool": group_name(g), "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/instance-type": size, "beta.kubernetes.io/os": "linux",
                "failure-domain.beta.kubernetes.io/region": "westeurope",
                "failure-domain.beta.kubernetes.io/zone": format!("westeurope-{}", 1 + i % 3),
                "kubernetes.azure.com/agentpool": group_name(g), "kubernetes.azure.com/cluster": RG,
                "kubernetes.azure.com/consolidated-additional-properties": hex(i, 36),
                "kubernetes.azure.com/kubelet-identity-client-id": hex(g, 36),
                "kubernetes.azure.com/mode": "user", "kubernetes.azure.com/node-image-version": "AKSUbuntu-2204gen2containerd-202411.12.0",
                "kubernetes.azure.com/nodepool-type": "VirtualMachineScaleSets", "kubernetes.azure.com/os-sku": "Ubuntu",
                "kubernetes.azure.com/role": "agent", "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": size,
                "topology.kubernetes.io/region": "westeurope", "topology.kubernetes.io/zone": format!("westeurope-{}", 1 + i % 3),
                "pool": group_name(g),
            },
            "annotations": {
                "csi.volume.kubernetes.io/nodeid": format!("{{\"disk.csi.azure.com\":\"{name}\",\"file.csi.azure.com\":\"{name}\"}}"),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": [
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": now, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:volumes.kubernetes.io/controller-managed-attach-detach": {}}, "f:labels": {".": {}, "f:agentpool": {}, "f:kubernetes.io/hostname": {}}}, "f:spec": {"f:providerID": {}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": now, "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:allocatable": {"f:cpu": {}, "f:memory": {}}, "f:conditions": {"k:{\"type\":\"Ready\"}": {"f:lastHeartbeatTime": {}, "f:reason": {}}}, "f:images": {}, "f:nodeInfo": {"f:bootID": {}}}}},
            ],
        },
        "spec": {
            "providerID": format!("azure:///subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/{}/virtualMachines/{i}", group_name(g)),
            "podCIDR": format!("10.244.{}.0/24", i % 250),
            "podCIDRs": [format!("10.244.{}.0/24", i % 250)],
            "taints": if g.is_multiple_of(4) { json!([{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]) } else { json!(null) },
        },
        "status": {
            "capacity": {"cpu": cpu, "memory": mem, "pods": "110", "ephemeral-storage": "129886128Ki"},
            "allocatable": alloc,
            "conditions": [
                cond("KernelDeadlock", "False", "KernelHasNoDeadlock", "kernel has no deadlock"),
                cond("FilesystemCorruptionProblem", "False", "FilesystemIsOK", "Filesystem is healthy"),
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status. AppArmor enabled"),
            ],
            "addresses": [{"type": "InternalIP", "address": format!("10.224.{}.{}", i / 250, i % 250)}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": hex(i, 32), "systemUUID": hex(g + i, 36), "bootID": hex(i * 3, 36),
                "kernelVersion": "5.15.0-1074-azure", "osImage": "Ubuntu 22.04.5 LTS", "containerRuntimeVersion": "containerd://1.7.23-1",
                "kubeletVersion": "v1.30.6", "kubeProxyVersion": "v1.30.6", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        },
    })
}

/// Deployment `d`'s pod `i`, as the API server returns a running (or pending) pod.
fn pod(d: usize, i: usize, node: Option<&str>, groups: usize) -> Value {
    let cpu = ["100m", "250m", "500m", "1", "2"][d % 5];
    let mem = ["128Mi", "512Mi", "1Gi", "2Gi", "4Gi"][(d / 5) % 5];
    let ns = format!("team{}", d % NAMESPACES);
    let app = format!("deploy{d:02}");
    let hash = hex(d, 10);
    let name = format!("{app}-{hash}-{}", &hex(i, 5));
    let now = "2026-11-24T06:00:00Z";
    let volume = format!("kube-api-access-{}", &hex(i + 3, 5));
    let mut spec = json!({
        "volumes": [{"name": volume, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]}}],
        "containers": [{
            "name": "app", "image": format!("contoso.azurecr.io/{ns}/{app}:1.4.{}", d % 9),
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
            "env": [
                {"name": "ASPNETCORE_URLS", "value": "http://+:8080"},
                {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.observability:4317"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
                {"name": "FEATURE_FLAGS", "value": "checkout-v2,search-rerank,cart-cache"},
            ],
            "resources": {"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}},
            "volumeMounts": [{"name": volume, "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"}, "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"}, "timeoutSeconds": 1, "periodSeconds": 5, "successThreshold": 1, "failureThreshold": 3},
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
        }],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
        "schedulerName": "default-scheduler", "priority": 0, "enableServiceLinks": true,
        "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        ],
    });
    if d.is_multiple_of(6) {
        spec["nodeSelector"] = json!({"pool": group_name(((d * 7) % groups) | 1)});
    }
    if d % 10 == 4 {
        if let Some(t) = spec["tolerations"].as_array_mut() {
            t.push(
                json!({"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}),
            );
        }
        spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = json!("1");
        spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("1");
    }
    let cond = |t: &str, status: &str| json!({"type": t, "status": status, "lastProbeTime": null, "lastTransitionTime": now});
    let status = match node {
        Some(n) => {
            spec["nodeName"] = json!(n);
            json!({
                "phase": "Running",
                "conditions": [cond("PodReadyToStartContainers", "True"), cond("Initialized", "True"), cond("Ready", "True"), cond("ContainersReady", "True"), cond("PodScheduled", "True")],
                "hostIP": "10.224.0.17", "hostIPs": [{"ip": "10.224.0.17"}],
                "podIP": format!("10.244.{}.{}", i % 250, i % 200), "podIPs": [{"ip": format!("10.244.{}.{}", i % 250, i % 200)}],
                "startTime": now,
                "containerStatuses": [{"name": "app", "state": {"running": {"startedAt": now}}, "lastState": {}, "ready": true,
                    "restartCount": 0, "image": format!("contoso.azurecr.io/{ns}/{app}:1.4.{}", d % 9),
                    "imageID": format!("contoso.azurecr.io/{ns}/{app}@sha256:{}", hex(d, 64)),
                    "containerID": format!("containerd://{}", hex(i, 64)), "started": true}],
                "qosClass": "Burstable",
            })
        }
        None => json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "lastProbeTime": null, "lastTransitionTime": now,
                "reason": "Unschedulable", "message": "0/5000 nodes are available: 5000 Insufficient cpu. preemption: 0/5000 nodes are available: 5000 No preemption victims found for incoming pod."}],
            "qosClass": "Burstable",
        }),
    };
    json!({
        "metadata": {
            "name": name, "generateName": format!("{app}-{hash}-"), "namespace": ns,
            "labels": {"app": app, "pod-template-hash": hash, "app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "shop"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": now, "prometheus.io/scrape": "true", "prometheus.io/port": "8080"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-{hash}"),
                "uid": format!("{}-{}-4{}-8{}-{}", hex(d, 8), hex(d + 1, 4), hex(d + 2, 3), hex(d + 3, 3), hex(d + 4, 12)),
                "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": now, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                    "f:ownerReferences": {".": {}, "k:{\"uid\":\"x\"}": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:env": {".": {}}, "f:image": {}, "f:imagePullPolicy": {},
                        "f:livenessProbe": {".": {}}, "f:name": {}, "f:ports": {".": {}}, "f:readinessProbe": {".": {}}, "f:resources": {".": {}}}},
                        "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {}, "f:securityContext": {}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": now, "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"ContainersReady\"}": {".": {}, "f:status": {}},
                    "k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}}}, "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:startTime": {}}}},
            ],
        },
        "spec": spec,
        "status": status,
    })
}

fn daemonset(k: usize) -> Value {
    json!({
        "metadata": {"name": format!("ds{k}"), "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"ds": format!("ds{k}")}},
            "template": {
                "metadata": {"labels": {"ds": format!("ds{k}")}},
                "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "agent", "image": "agent",
                        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}],
                },
            },
        },
    })
}

/// One GET on loopback; the status code, if it answered.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, out))
}

/// The value of an unlabelled (or summed) metric in a Prometheus text page.
fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn run(quick: bool, bin: &Path) {
    let (groups, per_group, pods_n, pending) = if quick {
        (20, 50, 10_000, 600)
    } else {
        (100, 50, 50_000, 3_000)
    };
    let nodes_n = groups * per_group;
    println!(
        "== memory: the daemon watching a cluster ({} mode) ==",
        if quick { "QUICK" } else { "full" }
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let emulator = rt
        .block_on(EmulatorBuilder::new().kubernetes(true).start())
        .expect("emulator starts");
    let state = emulator.state();
    let kube = emulator.kube().expect("kubernetes side");
    let seeded = Instant::now();
    for g in 0..groups {
        let mut seed = ScaleSetSeed::new(SUB, RG, &group_name(g), per_group as i64);
        seed.sku_name = size_of(g).0.to_string();
        if g.is_multiple_of(4) {
            seed.tags.insert(
                "k8s.io_cluster-autoscaler_node-template_taint_sku".into(),
                "gpu:NoSchedule".into(),
            );
        }
        state.seed_scale_set(seed);
    }
    for n in 0..NAMESPACES {
        kube.create(
            "v1",
            "namespaces",
            "",
            json!({"metadata": {"name": format!("team{n}")}}),
        )
        .expect("namespace");
    }
    let mut plain = Vec::new();
    let mut bytes = 0usize;
    for g in 0..groups {
        for i in 0..per_group {
            let n = node(g, i);
            bytes += n.to_string().len();
            kube.create("v1", "nodes", "", n).expect("node");
            if !g.is_multiple_of(4) {
                plain.push(node_name(g, i));
            }
        }
    }
    let node_bytes = bytes;
    bytes = 0;
    let mut sample = Vec::new();
    for i in 0..pods_n {
        let p = if i < pods_n - pending {
            // Small pods spread over the non-GPU nodes, about 12 per node.
            pod(1 + (i % 3) * 5, i, Some(&plain[i % plain.len()]), groups)
        } else {
            pod(i % 60, i, None, groups)
        };
        let text = p.to_string();
        bytes += text.len();
        if i % 10 == 0 {
            sample.push(text);
        }
        let ns = p["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        kube.create("v1", "pods", &ns, p).expect("pod");
    }
    let pod_bytes = bytes;
    for k in 0..10 {
        kube.create("apps/v1", "daemonsets", "kube-system", daemonset(k))
            .expect("daemonset");
    }
    for d in 0..40 {
        let ns = format!("team{}", d % NAMESPACES);
        kube.create(
            "policy/v1",
            "poddisruptionbudgets",
            &ns,
            json!({"metadata": {"name": format!("deploy{d:02}")},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": format!("deploy{d:02}")}}}}),
        )
        .expect("pdb");
    }
    println!(
        "seeded {nodes_n} nodes ({:.0} KiB of JSON each on average), {pods_n} pods ({pending} pending; {:.1} KiB each), 10 DaemonSets, 40 budgets, {groups} scale sets in {:.1} s",
        node_bytes as f64 / nodes_n as f64 / 1024.0,
        pod_bytes as f64 / pods_n as f64 / 1024.0,
        seeded.elapsed().as_secs_f64()
    );

    parse_side_by_side(&sample);

    let base = emulator.base_url();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, emulator.kubeconfig().expect("kubeconfig")).expect("kubeconfig");
    let mut yaml = format!(
        "azure:\n  resourceManagerEndpoint: {base}\n  authorityHost: {base}\n  tenantId: tenant\n  \
         subscriptionId: \"{SUB}\"\n  resourceGroup: {RG}\n  auth:\n    method: clientSecret\n    clientId: controller\n\
         enableVMSSEtag: true\nscanInterval: 10s\nmetricsListen: 127.0.0.1:{port}\ndemand: pods\n\
         kubernetes:\n  enabled: true\n  kubeconfig: {}\n  namespace: kube-system\nnodeGroups:\n",
        kubeconfig.display()
    );
    for g in 0..groups {
        yaml.push_str(&format!(
            "  - {{name: {}, minSize: 0, maxSize: 200}}\n",
            group_name(g)
        ));
    }
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, yaml).expect("write config");
    let mut daemon = Daemon::spawn(bin, &cfg);
    let t0 = daemon.started;
    let mut ready = false;
    let mut decided_at: Option<Instant> = None;
    daemon.sample_until(
        Duration::from_secs(if quick { 180 } else { 600 }),
        "listing the cluster and a first decision",
        |r| {
            if !ready && http_get(port, "/readyz").is_some_and(|(c, _)| c == 200) {
                ready = true;
                println!(
                    "every reflector listed (/readyz 200) after {:.1} s; RSS then {:.1} MiB",
                    t0.elapsed().as_secs_f64(),
                    mib(r)
                );
            }
            if ready && decided_at.is_none() {
                let page = http_get(port, "/metrics").map(|p| p.1).unwrap_or_default();
                if metric(&page, "vmss_capacity_scale_up_decisions_total") >= 1.0 {
                    decided_at = Some(Instant::now());
                    println!(
                        "first scale-up decision after {:.1} s (pending pods seen: {}); RSS then {:.1} MiB",
                        t0.elapsed().as_secs_f64(),
                        metric(&page, "vmss_capacity_unschedulable_pods_count{type=\"pending\"}"),
                        mib(r)
                    );
                }
            }
            decided_at.is_some_and(|t| t.elapsed() >= Duration::from_secs(15))
        },
    );
    if let Some(at) = decided_at {
        let secs = at.duration_since(t0).as_secs_f64();
        println!(
            "goal: first decision under 10 s after start at this size (issue 17): {secs:.1} s {}{}",
            verdict(secs < 10.0),
            if quick { " (QUICK size)" } else { "" }
        );
    }
    let puts = state
        .request_log()
        .iter()
        .filter(|r| r.method == "PUT")
        .count();
    daemon.report(
        &format!(
            "{nodes_n} nodes, {pods_n} pods, {groups} node groups, 15 s after the first decision ({puts} capacity PUTs): "
        ),
        GOAL_MIB,
    );
    if quick {
        println!("(QUICK mode: {nodes_n} nodes and {pods_n} pods, not the 5,000 and 50,000 the goal names)");
    }
    drop(daemon);
    drop(emulator);
}
