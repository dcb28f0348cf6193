"""Every kind the emulator serves, read with the newest official Python `kubernetes` client
(unpinned: 37.x and later validate every answer strictly, so a field the Go API server always
sends that is missing, such as a Node's `status.nodeInfo.bootID`, fails the read), plus the
`Table` columns and the field selectors kubectl relies on.

It runs against a real kube-apiserver first (ORACLE=1), where no scheduler or kubelet runs, so it
plays both for the Deployment's pods (a Node with a kubelet's status, bindings, Running
statuses), and writes the Table columns the real server answered to TABLES. Then against the
emulator with `--simulate-cluster`, whose Nodes and Running pods are the simulation's own, and
whose Table columns must equal the real server's. Where they differ, the emulator is wrong.

Environment: KUBECONFIG; ORACLE=1 for the real server; TABLES (the real server's columns, JSON:
written by the oracle run, compared by the emulator run); NAMES (JSON written for kube-shapes.sh's
kubectl checks: namespace, pod, node)."""

import datetime
import json
import os
import sys
import time
import uuid

from kubernetes import client, config

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
PATIENCE = 60


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def raw(method, path, body=None, accept="application/json", content_type="application/json"):
    """A request through the client's own ApiClient (auth, TLS) with a raw JSON body and answer:
    for what the typed API cannot do on both servers (policy/v1beta1 on 1.20, Tables)."""
    api = client.ApiClient()
    params = api.param_serialize(
        method, path, header_params={"Content-Type": content_type, "Accept": accept},
        body=body, auth_settings=["BearerToken"])
    resp = api.call_api(*params)
    data = resp.read()
    if resp.status >= 300:
        raise RuntimeError(f"{method} {path}: {resp.status} {data[:400]!r}")
    return json.loads(data) if data else None


def eventually(what, fn):
    deadline = time.time() + PATIENCE
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            check(False, f"gave up waiting for {what}")
        time.sleep(0.5)


def now_micro():
    return datetime.datetime.now(datetime.timezone.utc)


def play_scheduler_and_kubelet(core, ns, pods):
    """On a real server without a scheduler or kubelet: a Node whose status is a kubelet's, the
    pods bound to it and running, as kube-scheduler and the kubelet would leave them."""
    node = "shapes-node-" + uuid.uuid4().hex[:6]
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
        name=node, labels={"kubernetes.io/hostname": node, "kubernetes.io/os": "linux"})))
    stamp = now_micro().strftime("%Y-%m-%dT%H:%M:%SZ")
    raw("PATCH", f"/api/v1/nodes/{node}/status", {"status": {
        "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
        "allocatable": {"cpu": "3860m", "memory": "12Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}],
        "addresses": [{"type": "InternalIP", "address": "10.224.0.4"}, {"type": "Hostname", "address": node}],
        "nodeInfo": {"machineID": uuid.uuid4().hex, "systemUUID": str(uuid.uuid4()), "bootID": str(uuid.uuid4()),
                     "kernelVersion": "5.15.0-1074-azure", "osImage": "Ubuntu 22.04.5 LTS",
                     "containerRuntimeVersion": "containerd://1.7.22-1", "kubeletVersion": "v1.30.6",
                     "kubeProxyVersion": "v1.30.6", "operatingSystem": "linux", "architecture": "amd64"}}},
        content_type="application/merge-patch+json")
    for i, p in enumerate(pods):
        name = p.metadata.name
        raw("POST", f"/api/v1/namespaces/{ns}/pods/{name}/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        ip = f"10.244.0.{10 + i}"
        raw("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {
            "phase": "Running", "hostIP": "10.224.0.4", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": stamp,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": stamp}
                           for t in ["Initialized", "Ready", "ContainersReady", "PodScheduled"]],
            "containerStatuses": [{"name": c.name, "ready": True, "started": True, "restartCount": 0,
                                   "image": c.image, "imageID": "", "state": {"running": {"startedAt": stamp}}}
                                  for c in p.spec.containers]}},
            content_type="application/merge-patch+json")
    return node


def main():
    config.load_kube_config(config_file=os.environ["KUBECONFIG"])
    oracle = os.environ.get("ORACLE") == "1"
    where = "real API server" if oracle else "emulator"
    core = client.CoreV1Api()
    apps = client.AppsV1Api()
    coord = client.CoordinationV1Api()
    events_api = client.EventsV1Api()
    storage = client.StorageV1Api()
    ns = "shapes-" + uuid.uuid4().hex[:6]
    sfx = ns.split("-")[1]
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))

    labels = {"app": "web"}
    apps.create_namespaced_deployment(ns, client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1DeploymentSpec(
            replicas=2, selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(
                    name="web", image="nginx:1.25",
                    ports=[client.V1ContainerPort(container_port=80)],
                    resources=client.V1ResourceRequirements(requests={"cpu": "100m", "memory": "64Mi"}))])))))
    pods = eventually("the Deployment's two pods", lambda: (
        lambda items: items if len(items) == 2 else None)(core.list_namespaced_pod(ns, label_selector="app=web").items))
    made_node = None
    if oracle:
        made_node = play_scheduler_and_kubelet(core, ns, pods)
    running = eventually("two Running pods", lambda: (
        lambda items: items if len(items) == 2 else None)(
        [p for p in core.list_namespaced_pod(ns, label_selector="app=web").items if p.status.phase == "Running"]))
    pod = running[0]
    node = pod.spec.node_name
    check(bool(node), f"{where}: a Running pod of the Deployment is bound ({pod.metadata.name} on {node})")

    # Nodes: list, read and patch, every field the strict models require present.
    nodes = core.list_node().items
    check(any(n.metadata.name == node for n in nodes), f"{where}: list_node reads every Node, the pod's among them")
    n = core.read_node(node)
    info = n.status.node_info
    check(all(isinstance(getattr(info, f), str) for f in [
        "machine_id", "system_uuid", "boot_id", "kernel_version", "os_image", "container_runtime_version",
        "kubelet_version", "kube_proxy_version", "operating_system", "architecture"]),
        f"{where}: read_node has all ten status.nodeInfo fields ({info.kubelet_version}, {info.os_image})")
    check(any(c.type == "Ready" and c.status == "True" for c in n.status.conditions),
          f"{where}: the pod's Node is Ready")
    patched = core.patch_node(node, {"metadata": {"labels": {"shapes.example.com/read": sfx}}})
    check(patched.metadata.labels.get("shapes.example.com/read") == sfx, f"{where}: patch_node answers a valid Node")

    # Running pods, selected by field as kubectl and controllers select them.
    on_node = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node},status.phase=Running").items
    check(pod.metadata.name in [p.metadata.name for p in on_node],
          f"{where}: pods selected by spec.nodeName and status.phase=Running")
    p = core.read_namespaced_pod(pod.metadata.name, ns)
    cs = p.status.container_statuses or []
    check(p.status.pod_ip and p.status.host_ip and cs and all(c.ready for c in cs),
          f"{where}: a Running pod has its podIP {p.status.pod_ip}, hostIP {p.status.host_ip} and ready containers")
    by_ip = core.list_namespaced_pod(ns, field_selector=f"status.podIP={p.status.pod_ip}").items
    check([x.metadata.name for x in by_ip] == [p.metadata.name], f"{where}: a pod selected by status.podIP")

    # Workloads.
    d = eventually("the Deployment to report 2 ready replicas",
                   lambda: (lambda d: d if (d.status.ready_replicas or 0) == 2 else None)(
                       apps.read_namespaced_deployment("web", ns)))
    check(d.spec.template.spec.containers[0].name == "web", f"{where}: read_namespaced_deployment")
    check(len(apps.list_namespaced_replica_set(ns).items) == 1, f"{where}: list_namespaced_replica_set")
    apps.create_namespaced_daemon_set(ns, client.V1DaemonSet(
        metadata=client.V1ObjectMeta(name="agent"),
        spec=client.V1DaemonSetSpec(
            selector=client.V1LabelSelector(match_labels={"app": "agent"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "agent"}),
                spec=client.V1PodSpec(containers=[client.V1Container(name="agent", image="busybox")])))))
    check(any(x.metadata.name == "agent" for x in apps.list_namespaced_daemon_set(ns).items),
          f"{where}: list_namespaced_daemon_set")

    # The controller's Event about the pod (events.k8s.io/v1, as it posts them), and its core view.
    events_api.create_namespaced_event(ns, client.EventsV1Event(
        metadata=client.V1ObjectMeta(name=f"{pod.metadata.name}.scaleup"),
        event_time=now_micro(), reason="TriggeredScaleUp", type="Normal", action="ScaleUp",
        note="pod triggered scale-up: [{pool 1->2 (max: 10)}]",
        reporting_controller="vmss-capacity-controller", reporting_instance="vmss-capacity-controller-0",
        regarding=client.V1ObjectReference(kind="Pod", name=pod.metadata.name, namespace=ns,
                                           uid=pod.metadata.uid, api_version="v1")))
    describe = ",".join([f"involvedObject.name={pod.metadata.name}", f"involvedObject.namespace={ns}",
                         "involvedObject.kind=Pod", f"involvedObject.uid={pod.metadata.uid}"])
    about = core.list_namespaced_event(ns, field_selector=describe).items
    check([e.reason for e in about] == ["TriggeredScaleUp"],
          f"{where}: the pod's Events selected by involvedObject.* (kubectl describe's query)")
    check(about[0].reporting_component == "vmss-capacity-controller" and about[0].source is not None,
          f"{where}: the core view of an events.k8s.io Event")
    ours = events_api.list_namespaced_event(ns, field_selector="reportingController=vmss-capacity-controller").items
    check([e.reason for e in ours] == ["TriggeredScaleUp"], f"{where}: events.k8s.io Events by reportingController")
    check(len(core.list_namespaced_event(ns, field_selector="reason=TriggeredScaleUp,type=Normal").items) == 1,
          f"{where}: Events by reason and type")

    # The rest of the served kinds.
    coord.create_namespaced_lease(ns, client.V1Lease(metadata=client.V1ObjectMeta(name="leader"),
                                                     spec=client.V1LeaseSpec(holder_identity="a")))
    check(coord.list_namespaced_lease(ns).items[0].spec.holder_identity == "a", f"{where}: list_namespaced_lease")
    core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm"), data={"a": "1"}))
    check(core.read_namespaced_config_map("cm", ns).data == {"a": "1"}, f"{where}: read_namespaced_config_map")
    check(any(x.metadata.name == ns for x in core.list_namespace().items), f"{where}: list_namespace")
    pdb_v1 = any(g.name == "policy" and any(v.version == "v1" for v in g.versions)
                 for g in client.ApisApi().get_api_versions().groups)
    pv = "policy/v1" if pdb_v1 else "policy/v1beta1"
    raw("POST", f"/apis/{pv}/namespaces/{ns}/poddisruptionbudgets", {
        "apiVersion": pv, "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}})
    if pdb_v1:
        check(len(client.PolicyV1Api().list_namespaced_pod_disruption_budget(ns).items) == 1,
              f"{where}: list_namespaced_pod_disruption_budget")
    sc = f"shapes-{sfx}"
    storage.create_storage_class(client.V1StorageClass(metadata=client.V1ObjectMeta(name=sc),
                                                       provisioner="disk.csi.azure.com",
                                                       volume_binding_mode="WaitForFirstConsumer"))
    check(any(x.metadata.name == sc for x in storage.list_storage_class().items), f"{where}: list_storage_class")
    core.create_namespaced_persistent_volume_claim(ns, client.V1PersistentVolumeClaim(
        metadata=client.V1ObjectMeta(name="data"),
        spec=client.V1PersistentVolumeClaimSpec(access_modes=["ReadWriteOnce"], storage_class_name=sc,
                                                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}))))
    check(len(core.list_namespaced_persistent_volume_claim(ns).items) == 1, f"{where}: list_namespaced_persistent_volume_claim")
    pv_name = f"shapes-{sfx}"
    core.create_persistent_volume(client.V1PersistentVolume(
        metadata=client.V1ObjectMeta(name=pv_name),
        spec=client.V1PersistentVolumeSpec(capacity={"storage": "1Gi"}, access_modes=["ReadWriteOnce"],
                                           csi=client.V1CSIPersistentVolumeSource(driver="disk.csi.azure.com",
                                                                                  volume_handle=pv_name))))
    check(any(x.metadata.name == pv_name for x in core.list_persistent_volume().items), f"{where}: list_persistent_volume")
    if oracle:
        storage.create_csi_node(client.V1CSINode(metadata=client.V1ObjectMeta(name=node), spec=client.V1CSINodeSpec(
            drivers=[client.V1CSINodeDriver(name="disk.csi.azure.com", node_id=node,
                                            topology_keys=["topology.disk.csi.azure.com/zone"])])))
    check(any(x.metadata.name == node for x in storage.list_csi_node().items), f"{where}: list_csi_node")

    # ResourceQuotas (CapacityBuffers are cut by them): the strict client reads one, and its
    # status as the quota controller writes it (here written by the test on the emulator, which
    # has no quota controller; on the real server kube-controller-manager writes it).
    core.create_namespaced_resource_quota(ns, client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="team"), spec=client.V1ResourceQuotaSpec(hard={"requests.cpu": "5"})))
    if not oracle:
        q = core.read_namespaced_resource_quota("team", ns)
        q.status = client.V1ResourceQuotaStatus(hard={"requests.cpu": "5"}, used={"requests.cpu": "0"})
        core.replace_namespaced_resource_quota_status("team", ns, q)
    quota_hard = None
    for _ in range(50):
        quota_hard = core.read_namespaced_resource_quota("team", ns).status.hard
        if quota_hard:
            break
        time.sleep(0.2)
    check(quota_hard == {"requests.cpu": "5"}, f"{where}: read_namespaced_resource_quota and its status ({quota_hard})")

    # Jobs (the simulation runs their pods): defaulted as the Go API server defaults them, and a
    # template whose pods would restart in place refused with its 422. `parallelism: 0`: no pod
    # is made (the real server has no kubelet to run it).
    batch = client.BatchV1Api()
    job_spec = client.V1PodSpec(restart_policy="Never",
                                containers=[client.V1Container(name="main", image="registry.k8s.io/pause:3.9")])
    batch.create_namespaced_job(ns, client.V1Job(
        metadata=client.V1ObjectMeta(name="nightly"),
        spec=client.V1JobSpec(parallelism=0, template=client.V1PodTemplateSpec(spec=job_spec))))
    job = batch.read_namespaced_job("nightly", ns)
    job_uid = job.metadata.uid
    # `completions` is defaulted (to 1) only when `parallelism` is absent too: a work queue here.
    check(job.spec.backoff_limit == 6 and job.spec.completions is None and job.spec.parallelism == 0,
          f"{where}: a Job's backoffLimit 6 by default, no completions beside a parallelism "
          f"({job.spec.backoff_limit}, {job.spec.completions}, {job.spec.parallelism})")
    selector = job.spec.selector.match_labels or {}
    template_labels = job.spec.template.metadata.labels or {}
    check(any(k.endswith("controller-uid") and v == job_uid for k, v in selector.items())
          and template_labels.get("controller-uid") == job_uid and template_labels.get("job-name") == "nightly"
          and (job.metadata.labels or {}).get("job-name") == "nightly",
          f"{where}: the Job's selector, its template's and its own labels name its uid and name ({selector}, {template_labels})")
    job_spec.restart_policy = "Always"
    try:
        batch.create_namespaced_job(ns, client.V1Job(
            metadata=client.V1ObjectMeta(name="restarts"),
            spec=client.V1JobSpec(parallelism=0, template=client.V1PodTemplateSpec(spec=job_spec))))
        check(False, f"{where}: a Job whose pods restart in place is refused")
    except client.exceptions.ApiException as e:
        body = json.loads(e.body)
        cause = (body.get("details") or {}).get("causes", [{}])[0]
        details = body.get("details") or {}
        check(e.status == 422 and body.get("reason") == "Invalid"
              and cause.get("field") == "spec.template.spec.restartPolicy"
              and cause.get("reason") == "FieldValueRequired"
              and details.get("kind") == "Job" and details.get("group") == "batch"
              and body.get("message") == 'Job.batch "restarts" is invalid: spec.template.spec.restartPolicy: '
                                         'Required value: valid values: "OnFailure", "Never"',
              f"{where}: a Job whose pods restart in place is refused with 422 Invalid at "
              f"spec.template.spec.restartPolicy ({e.status}, {body.get('message')})")

    # Table answers: the columns, as the real server defines them.
    tables = {}
    for plural, path in [
        ("pods", f"/api/v1/namespaces/{ns}/pods"), ("nodes", "/api/v1/nodes"),
        ("deployments", f"/apis/apps/v1/namespaces/{ns}/deployments"),
        ("replicasets", f"/apis/apps/v1/namespaces/{ns}/replicasets"),
        ("daemonsets", f"/apis/apps/v1/namespaces/{ns}/daemonsets"),
        ("events", f"/api/v1/namespaces/{ns}/events"),
        ("events.events.k8s.io", f"/apis/events.k8s.io/v1/namespaces/{ns}/events"),
        ("leases", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"),
        ("configmaps", f"/api/v1/namespaces/{ns}/configmaps"), ("namespaces", "/api/v1/namespaces"),
        ("poddisruptionbudgets", f"/apis/{pv}/namespaces/{ns}/poddisruptionbudgets"),
        ("persistentvolumeclaims", f"/api/v1/namespaces/{ns}/persistentvolumeclaims"),
        ("persistentvolumes", "/api/v1/persistentvolumes"),
        ("storageclasses", "/apis/storage.k8s.io/v1/storageclasses"),
        ("csinodes", "/apis/storage.k8s.io/v1/csinodes"),
        ("resourcequotas", f"/api/v1/namespaces/{ns}/resourcequotas"),
        ("jobs", f"/apis/batch/v1/namespaces/{ns}/jobs"),
    ]:
        t = raw("GET", path, accept=TABLE)
        check(t["kind"] == "Table" and t["rows"], f"{where}: a Table of {plural} with rows")
        tables[plural] = t["columnDefinitions"]
    pod_row = next(r["cells"] for r in raw("GET", f"/api/v1/namespaces/{ns}/pods", accept=TABLE)["rows"]
                   if r["cells"][0] == pod.metadata.name)
    check(pod_row[1:3] == ["1/1", "Running"] and pod_row[6] == node,
          f"{where}: the pod's row reads READY 1/1, STATUS Running, NODE {node} ({pod_row})")
    node_row = next(r["cells"] for r in raw("GET", "/api/v1/nodes", accept=TABLE)["rows"] if r["cells"][0] == node)
    check(node_row[1] == "Ready" and node_row[4] == info.kubelet_version,
          f"{where}: the node's row reads Ready and its kubelet version ({node_row})")
    quota_row = raw("GET", f"/api/v1/namespaces/{ns}/resourcequotas", accept=TABLE)["rows"][0]["cells"]
    # USED is what the quota controller counted (the real server counts this test's pod).
    check(quota_row[0] == "team" and quota_row[2].startswith("requests.cpu: ")
          and quota_row[2].endswith("/5") and quota_row[3] == "",
          f"{where}: the quota's row reads REQUEST requests.cpu: <used>/5 and no LIMIT ({quota_row})")
    if oracle:
        with open(os.environ["TABLES"], "w") as f:
            json.dump(tables, f)
    elif os.environ.get("TABLES") and os.path.exists(os.environ["TABLES"]):
        with open(os.environ["TABLES"]) as f:
            real = json.load(f)
        for plural, cols in real.items():
            check(tables.get(plural) == cols,
                  f"{where}: the {plural} Table's columns equal the real server's "
                  f"({[c['name'] for c in tables.get(plural, [])]} vs {[c['name'] for c in cols]})")

    with open(os.environ["NAMES"], "w") as f:
        json.dump({"namespace": ns, "pod": pod.metadata.name, "node": node, "made_node": made_node,
                   "storage_class": sc, "pv": pv_name}, f)
    print(f"python kubernetes {client.__version__ if hasattr(client, '__version__') else ''} "
          f"shapes on the {where}: all checks passed")


if __name__ == "__main__":
    main()
