"""The official Python Kubernetes client (PyPI `kubernetes`, written by nobody here) against the
emulator's Kubernetes side. Where the client and the emulator disagree, the emulator is wrong.

The same script runs against a real API server first (kube.sh with ORACLE_KUBECONFIG), so every
check is known to describe real Kubernetes; it tolerates what a real cluster's controllers add
(the kube-root-ca.crt ConfigMap in every namespace) and picks policy/v1 or policy/v1beta1 (1.20)
by discovery.

Environment: KUBECONFIG (written by `emulator --kubeconfig-out`, or a real server's)."""

import os
import sys
import time
import uuid

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def policy_version():
    """policy/v1 where served (1.21+ and the emulator), else policy/v1beta1 (a 1.20 server)."""
    for g in client.ApisApi().get_api_versions().groups:
        if g.name == "policy":
            return "policy/v1" if any(v.version == "v1" for v in g.versions) else "policy/v1beta1"
    raise RuntimeError("the server serves no policy API group")


def raw(method, path, body=None):
    """A request through the client's own ApiClient (auth, TLS) with a raw JSON body: the typed
    calls of this client send policy/v1 bodies, which a 1.20 server refuses."""
    return client.ApiClient().call_api(
        path, method, body=body, response_type="object", auth_settings=["BearerToken"],
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        _return_http_data_only=True)


def evict_refused_by_pdb(core, ns, node):
    """A Running+Ready pod under a PDB with minAvailable 1: its eviction is refused with 429."""
    pv = policy_version()
    core.create_namespaced_pod(ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name="guarded", labels={"app": "guarded"}),
        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name="c", image="pause")])))
    core.patch_namespaced_pod_status("guarded", ns, {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    raw("POST", f"/apis/{pv}/namespaces/{ns}/poddisruptionbudgets", {
        "apiVersion": pv, "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    status = {}
    for _ in range(300):
        status = raw("GET", f"/apis/{pv}/namespaces/{ns}/poddisruptionbudgets/guarded").get("status") or {}
        if status.get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 0:
            break
        time.sleep(0.1)
    check(status.get("currentHealthy") == 1 and status.get("desiredHealthy") == 1
          and status.get("disruptionsAllowed") == 0 and status.get("expectedPods") == 1,
          f"the {pv} PDB's status counts the guarded pod and allows no disruption ({status})")
    try:
        raw("POST", f"/api/v1/namespaces/{ns}/pods/guarded/eviction", {
            "apiVersion": pv, "kind": "Eviction", "metadata": {"name": "guarded", "namespace": ns}})
        check(False, "the eviction of a pod its PDB protects fails")
    except ApiException as e:
        check(e.status == 429 and "TooManyRequests" in e.body and "disruption budget" in e.body,
              f"the {pv} eviction of a pod its PDB protects is refused with 429 TooManyRequests")
    pod = core.read_namespaced_pod("guarded", ns)
    check(pod.metadata.deletion_timestamp is None, "the refused eviction leaves the pod alone")


def main():
    config.load_kube_config(config_file=os.environ["KUBECONFIG"])
    core = client.CoreV1Api()
    coord = client.CoordinationV1Api()
    ns = "interop-" + uuid.uuid4().hex[:6]

    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    check(any(n.metadata.name == ns for n in core.list_namespace().items), "a created namespace is listed")

    lease = coord.create_namespaced_lease(ns, client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15)))
    rv = lease.metadata.resource_version
    check(rv is not None and rv.isdigit(), f"a created Lease has a resourceVersion ({rv})")

    try:
        coord.create_namespaced_lease(ns, client.V1Lease(metadata=client.V1ObjectMeta(name="leader")))
        check(False, "creating an existing name fails")
    except ApiException as e:
        check(e.status == 409 and "AlreadyExists" in e.body, "creating an existing name is 409 AlreadyExists")

    first = coord.read_namespaced_lease("leader", ns)
    first.spec.holder_identity = "b"
    updated = coord.replace_namespaced_lease("leader", ns, first)
    check(int(updated.metadata.resource_version) > int(rv), "an update moves the resourceVersion up")

    stale = coord.read_namespaced_lease("leader", ns)
    stale.metadata.resource_version = rv
    stale.spec.holder_identity = "c"
    try:
        coord.replace_namespaced_lease("leader", ns, stale)
        check(False, "an update from a stale read fails")
    except ApiException as e:
        check(e.status == 409 and "Conflict" in e.body, "an update from a stale read is 409 Conflict")
    check(coord.read_namespaced_lease("leader", ns).spec.holder_identity == "b",
          "the stale update changed nothing")

    for i in range(5):
        core.create_namespaced_config_map(ns, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=f"cm-{i}", labels={"set": "x" if i % 2 else "y"}),
            data={"i": str(i)}))
    page = core.list_namespaced_config_map(ns, limit=2)
    seen = [c.metadata.name for c in page.items]
    while page.metadata._continue:
        page = core.list_namespaced_config_map(ns, limit=2, _continue=page.metadata._continue)
        seen += [c.metadata.name for c in page.items]
    # A real cluster's controller-manager adds kube-root-ca.crt to every namespace.
    seen = [n for n in seen if n.startswith("cm-")]
    check(sorted(seen) == [f"cm-{i}" for i in range(5)], "limit and continue page through every ConfigMap once")
    xs = core.list_namespaced_config_map(ns, label_selector="set=x").items
    check(sorted(c.metadata.name for c in xs) == ["cm-1", "cm-3"], "a label selector filters")

    core.patch_namespaced_config_map("cm-0", ns, {"metadata": {"annotations": {"k": "v"}}, "data": {"extra": "1"}})
    cm = core.read_namespaced_config_map("cm-0", ns)
    check(cm.metadata.annotations.get("k") == "v" and cm.data == {"i": "0", "extra": "1"},
          "a strategic merge patch (the client's default for dicts) merges data and annotations")

    node = "interop-node-" + uuid.uuid4().hex[:6]
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
    for phase, name in [("Running", "p-run"), ("Succeeded", "p-done")]:
        core.create_namespaced_pod(ns, client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name="c", image="pause")])))
        if phase != "Running":
            core.patch_namespaced_pod_status(name, ns, {"status": {"phase": phase}})
    created = core.read_namespaced_pod("p-run", ns)
    tolerated = {(t.key, t.effect, t.toleration_seconds) for t in created.spec.tolerations or []}
    check(created.status.phase == "Pending" and created.status.qos_class == "BestEffort"
          and created.spec.dns_policy == "ClusterFirst" and created.spec.restart_policy == "Always"
          and created.spec.scheduler_name == "default-scheduler" and created.spec.priority == 0
          and created.spec.termination_grace_period_seconds == 30 and created.spec.enable_service_links
          and {("node.kubernetes.io/not-ready", "NoExecute", 300),
               ("node.kubernetes.io/unreachable", "NoExecute", 300)} <= tolerated
          and created.spec.containers[0].image_pull_policy == "Always"
          and created.spec.containers[0].termination_message_policy == "File",
          "a created pod reads back with the server's defaults (spec, tolerations, qosClass, Pending)")
    running = core.list_namespaced_pod(ns, field_selector="status.phase!=Succeeded,status.phase!=Failed").items
    check([p.metadata.name for p in running] == ["p-run"], "a field selector on status.phase filters pods")
    on_node = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    check(len(on_node) == 2, "a field selector on spec.nodeName finds the node's pods")

    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.delete_namespaced_config_map("cm-4", ns)
    events = []
    for ev in watch.Watch().stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=2):
        events.append((ev["type"], ev["object"].metadata.name))
        if ev["type"] == "DELETED":
            break
    check(("DELETED", "cm-4") in events, "a watch from a resourceVersion streams the later delete")

    evict_refused_by_pdb(core, ns, node)

    for p in core.list_namespaced_pod(ns).items:
        # No kubelet confirms a graceful delete on a real server without one: delete at once.
        core.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)
    core.delete_namespace(ns)
    core.delete_node(node)
    print("python kubernetes client interop: all checks passed")


if __name__ == "__main__":
    main()
