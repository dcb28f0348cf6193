"""The official Python Kubernetes client (PyPI `kubernetes`, written by nobody here) against the
emulator's Kubernetes side. Where the client and the emulator disagree, the emulator is wrong.

Environment: KUBECONFIG (written by `emulator --kubeconfig-out`)."""

import os
import sys
import uuid

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


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

    core.delete_namespace(ns)
    core.delete_node(node)
    print("python kubernetes client interop: all checks passed")


if __name__ == "__main__":
    main()
