"""Interop: Azure's official Python SDKs (azure-mgmt-compute, azure-mgmt-containerservice,
azure-identity) against the emulator.

The SDK is the referee: where it disagrees with the emulator, the emulator is wrong.

Environment: EMULATOR_URL (https://127.0.0.1:PORT), EMULATOR_CA (PEM file of the emulator's CA).
Runs standalone (python test_python_sdk.py) and prints 'N passed, N failed'.
"""

import json
import os
import sys
import traceback
import urllib.request
import ssl

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceModifiedError, ResourceNotFoundError
from azure.identity import ClientSecretCredential
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute.models import Sku, VirtualMachineScaleSet, VirtualMachineScaleSetUpdate
from azure.mgmt.containerservice import ContainerServiceClient
from azure.mgmt.containerservice.models import (
    ManagedCluster,
    ManagedClusterAgentPoolProfile,
    TagsObject,
)

URL = os.environ["EMULATOR_URL"].rstrip("/")
CA = os.environ["EMULATOR_CA"]
TENANT = "11111111-1111-1111-1111-111111111111"
CLIENT_ID = "python-sdk"
SECRET = "python-secret"
SUB = "00000000-0000-0000-0000-00000000feed"
RG = "rg-interop"
LOCATION = "westeurope"
CLUSTER = "py-aks"
SCOPE = "https://management.azure.com/.default"


def control(method, path, body=None):
    """Calls the emulator's /_emulator/ API."""
    ctx = ssl.create_default_context(cafile=CA)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"{URL}/_emulator/{path}", data=data, method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, context=ctx) as resp:
        return json.loads(resp.read() or b"null")


def make_client():
    control("POST", "clients", {"client_id": CLIENT_ID, "secret": SECRET})
    cred = ClientSecretCredential(
        TENANT, CLIENT_ID, SECRET,
        authority=URL,
        disable_instance_discovery=True,
        connection_verify=CA,
    )
    client = ComputeManagementClient(
        cred, SUB, base_url=URL, credential_scopes=[SCOPE], connection_verify=CA,
        polling_interval=0,
    )
    return cred, client


def make_aks_client(cred):
    return ContainerServiceClient(
        cred, SUB, base_url=URL, credential_scopes=[SCOPE], connection_verify=CA,
        polling_interval=0,
    )


def vmss(capacity, tags=None):
    return VirtualMachineScaleSet(
        location="westeurope",
        sku=Sku(name="Standard_D2s_v5", tier="Standard", capacity=capacity),
        tags=tags,
    )


def test_bad_secret_is_refused():
    control("POST", "clients", {"client_id": CLIENT_ID, "secret": SECRET})
    bad = ClientSecretCredential(
        TENANT, CLIENT_ID, "wrong", authority=URL,
        disable_instance_discovery=True, connection_verify=CA,
    )
    try:
        bad.get_token(SCOPE)
    except Exception as e:  # ClientAuthenticationError
        assert "AADSTS7000215" in str(e) or "invalid_client" in str(e), str(e)
    else:
        raise AssertionError("a wrong secret got a token")


def test_conditional_lifecycle():
    cred, client = make_client()
    ops = client.virtual_machine_scale_sets
    # Create only if absent (If-None-Match: *), through the LRO.
    created = ops.begin_create_or_update(
        RG, "py-vmss", vmss(2, {"team": "blue"}), match_condition=MatchConditions.IfMissing
    ).result()
    assert created.sku.capacity == 2, created
    # A second create-if-absent is refused with 412.
    try:
        ops.begin_create_or_update(
            RG, "py-vmss", vmss(2), match_condition=MatchConditions.IfMissing
        ).result()
    except HttpResponseError as e:
        assert e.status_code == 412, e
    else:
        raise AssertionError("If-None-Match: * on an existing scale set succeeded")

    got = ops.get(RG, "py-vmss")
    etag = got.etag
    assert etag and etag.startswith('"'), etag
    assert got.sku.capacity == 2
    assert got.properties.provisioning_state == "Succeeded"

    # Conditional update through the LRO with the ETag just read.
    updated = ops.begin_create_or_update(
        RG, "py-vmss", vmss(4), etag=etag, match_condition=MatchConditions.IfNotModified
    ).result()
    assert updated.sku.capacity == 4, updated
    assert updated.tags.get("team") == "blue", "a PUT without tags keeps them"
    new_etag = ops.get(RG, "py-vmss").etag
    assert new_etag != etag

    # The stale ETag is the SDK's 412.
    try:
        ops.begin_create_or_update(
            RG, "py-vmss", vmss(9), etag=etag, match_condition=MatchConditions.IfNotModified
        ).result()
    except HttpResponseError as e:
        assert e.status_code == 412, e
        assert e.error is not None and e.error.code == "PreconditionFailed", e.error
    else:
        raise AssertionError("a stale If-Match succeeded")
    assert ops.get(RG, "py-vmss").sku.capacity == 4

    # LIST (paged) sees it, with the other one created blind.
    ops.begin_create_or_update(RG, "py-vmss-2", vmss(1)).result()
    names = sorted(v.name for v in ops.list(RG))
    assert names == ["py-vmss", "py-vmss-2"], names

    # PATCH with If-Match.
    patched = ops.begin_update(
        RG, "py-vmss", VirtualMachineScaleSetUpdate(sku=Sku(capacity=3)),
        etag=new_etag, match_condition=MatchConditions.IfNotModified,
    ).result()
    assert patched.sku.capacity == 3, patched

    # VM instances follow the capacity.
    vms = list(client.virtual_machine_scale_set_vms.list(RG, "py-vmss"))
    assert len(vms) == 3, vms

    # Delete with If-Match (this SDK's begin_delete has no etag keyword, so the header goes in
    # through azure-core's `headers`): stale refused, current accepted.
    try:
        ops.begin_delete(RG, "py-vmss", headers={"If-Match": new_etag}).result()
    except HttpResponseError as e:
        assert e.status_code == 412, e
    else:
        raise AssertionError("a stale delete succeeded")
    current = ops.get(RG, "py-vmss").etag
    ops.begin_delete(RG, "py-vmss", headers={"If-Match": current}).result()
    try:
        ops.get(RG, "py-vmss")
    except ResourceNotFoundError:
        pass
    else:
        raise AssertionError("deleted scale set still readable")

    requests = control("GET", "requests")
    writers = {r["writer"] for r in requests if r["path"].startswith("/subscriptions/")}
    assert writers == {CLIENT_ID}, writers
    lost = control("GET", "lost-updates")
    assert lost == [], lost


def create_cluster(aks, name):
    """Creates a cluster with a System pool `sys` (1 node) and a User pool `work` (2 nodes)."""
    cluster = ManagedCluster(
        location=LOCATION,
        agent_pool_profiles=[
            ManagedClusterAgentPoolProfile(
                name="sys", count=1, mode="System", vm_size="Standard_D2s_v5"
            ),
            ManagedClusterAgentPoolProfile(
                name="work", count=2, mode="User", vm_size="Standard_D4s_v5",
                node_labels={"team": "blue"},
            ),
        ],
    )
    created = aks.managed_clusters.begin_create_or_update(
        RG, name, cluster, match_condition=MatchConditions.IfMissing
    ).result()
    assert created.e_tag, created
    return created


def expect_412(call, what):
    try:
        call()
    except HttpResponseError as e:  # ResourceModifiedError is one
        assert e.status_code == 412, e
        return e
    raise AssertionError(f"{what} succeeded")


def test_aks_pool_read_and_conditional_count_update():
    cred, compute = make_client()
    aks = make_aks_client(cred)
    create_cluster(aks, CLUSTER)

    pool = aks.agent_pools.get(RG, CLUSTER, "work")
    etag = pool.properties.e_tag
    assert etag, pool
    assert pool.count == 2 and pool.mode == "User" and pool.vm_size == "Standard_D4s_v5", pool
    assert pool.node_labels == {"team": "blue"}, pool
    assert pool.provisioning_state == "Succeeded", pool
    names = sorted(p.name for p in aks.agent_pools.list(RG, CLUSTER))
    assert names == ["sys", "work"], names

    # Read-modify-write of the whole pool, as read, under If-Match.
    pool.count = 3
    updated = aks.agent_pools.begin_create_or_update(
        RG, CLUSTER, "work", pool, etag=etag, match_condition=MatchConditions.IfNotModified
    ).result()
    assert updated.count == 3, updated
    assert updated.node_labels == {"team": "blue"}, "the PUT kept what it sent back"
    new_etag = updated.properties.e_tag
    assert new_etag and new_etag != etag, (etag, new_etag)
    assert aks.agent_pools.get(RG, CLUSTER, "work").properties.e_tag == new_etag

    # The stale ETag is refused with 412 (the SDK's ResourceModifiedError) and changes nothing.
    pool.count = 9
    err = expect_412(
        lambda: aks.agent_pools.begin_create_or_update(
            RG, CLUSTER, "work", pool, etag=etag, match_condition=MatchConditions.IfNotModified
        ).result(),
        "a stale If-Match on an agent pool",
    )
    assert isinstance(err, ResourceModifiedError), type(err)
    assert aks.agent_pools.get(RG, CLUSTER, "work").count == 3

    # The pool's nodes are a scale set in the node resource group, read with the compute SDK.
    cluster = aks.managed_clusters.get(RG, CLUSTER)
    node_rg = cluster.node_resource_group
    assert node_rg == f"MC_{RG}_{CLUSTER}_{LOCATION}", node_rg
    sets = {s.tags.get("aks-managed-poolName"): s for s in compute.virtual_machine_scale_sets.list(node_rg)}
    assert sorted(sets) == ["sys", "work"], sorted(sets)
    work = sets["work"]
    assert work.name.startswith("aks-work-") and work.name.endswith("-vmss"), work.name
    assert work.sku.capacity == 3, work.sku
    vms = list(compute.virtual_machine_scale_set_vms.list(node_rg, work.name))
    assert len(vms) == 3, vms

    assert control("GET", "lost-updates") == []


def test_aks_cluster_update_changes_the_pool_etag():
    cred, _ = make_client()
    aks = make_aks_client(cred)
    name = CLUSTER + "-2"
    create_cluster(aks, name)
    before = aks.agent_pools.get(RG, name, "work")
    cluster_before = aks.managed_clusters.get(RG, name)
    profile = next(p for p in cluster_before.agent_pool_profiles if p.name == "work")
    assert profile.e_tag == before.properties.e_tag, (profile.e_tag, before.properties.e_tag)

    # A cluster-level write: a tag change on the managed cluster, conditional on its eTag.
    updated = aks.managed_clusters.begin_update_tags(
        RG, name, TagsObject(tags={"owner": "python"}),
        etag=cluster_before.e_tag, match_condition=MatchConditions.IfNotModified,
    ).result()
    assert updated.tags == {"owner": "python"}, updated.tags
    assert updated.e_tag != cluster_before.e_tag

    after = aks.agent_pools.get(RG, name, "work")
    assert after.properties.e_tag != before.properties.e_tag, "the cluster write changed the pool's ETag"
    assert after.count == before.count == 2

    # So a pool write holding the ETag read before the cluster write gets 412.
    before.count = 4
    expect_412(
        lambda: aks.agent_pools.begin_create_or_update(
            RG, name, "work", before,
            etag=before.properties.e_tag, match_condition=MatchConditions.IfNotModified,
        ).result(),
        "a pool write across a cluster-level write",
    )
    # Re-read and retry, as the controller does.
    fresh = aks.agent_pools.get(RG, name, "work")
    fresh.count = 4
    done = aks.agent_pools.begin_create_or_update(
        RG, name, "work", fresh,
        etag=fresh.properties.e_tag, match_condition=MatchConditions.IfNotModified,
    ).result()
    assert done.count == 4, done

    # A stale cluster ETag is refused too.
    expect_412(
        lambda: aks.managed_clusters.begin_update_tags(
            RG, name, TagsObject(tags={"owner": "late"}),
            etag=cluster_before.e_tag, match_condition=MatchConditions.IfNotModified,
        ).result(),
        "a stale If-Match on a managed cluster",
    )
    assert control("GET", "lost-updates") == []


def test_aks_throttled_answer_reads_as_a_429_throttled_with_retry_after():
    """AKS's own throttling, turned on through the control API: one write per pool."""
    cred, _ = make_client()
    # No retries: the SDK would honour Retry-After (up to a minute) and try again.
    aks = ContainerServiceClient(
        cred, SUB, base_url=URL, credential_scopes=[SCOPE], connection_verify=CA,
        polling_interval=0, retry_total=0,
    )
    name = CLUSTER + "-throttled"
    create_cluster(aks, name)
    on = control("POST", "throttling/aks", {"enabled": True, "pool_write_burst": 1})
    assert on["enabled"] and on["limits"]["pool_write_burst"] == 1, on
    try:
        pool = aks.agent_pools.get(RG, name, "work")
        pool.count = 3
        aks.agent_pools.begin_create_or_update(
            RG, name, "work", pool,
            etag=pool.properties.e_tag, match_condition=MatchConditions.IfNotModified,
        ).result()
        fresh = aks.agent_pools.get(RG, name, "work")
        fresh.count = 4
        try:
            aks.agent_pools.begin_create_or_update(
                RG, name, "work", fresh,
                etag=fresh.properties.e_tag, match_condition=MatchConditions.IfNotModified,
            ).result()
        except HttpResponseError as e:
            assert e.status_code == 429, e
            assert e.error is not None and e.error.code == "Throttled", e.error
            assert "PutAgentPoolHandler.PUT request limit has been exceeded" in e.error.message, e.error.message
            retry = e.response.headers.get("Retry-After")
            assert retry is not None and retry.isdigit() and 1 <= int(retry) <= 60, retry
            assert e.response.headers.get("x-ms-ratelimit-remaining-subscription-writes"), e.response.headers
        else:
            raise AssertionError("a second write within the pool's bucket of 1 succeeded")
        assert aks.agent_pools.get(RG, name, "work").count == 3
    finally:
        control("POST", "throttling/aks", {"enabled": False})


def main():
    tests = [
        test_bad_secret_is_refused,
        test_conditional_lifecycle,
        test_aks_pool_read_and_conditional_count_update,
        test_aks_cluster_update_changes_the_pool_etag,
        test_aks_throttled_answer_reads_as_a_429_throttled_with_retry_after,
    ]
    passed = failed = 0
    for t in tests:
        try:
            t()
            passed += 1
            print(f"PASS {t.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__}")
            traceback.print_exc()
    if failed:
        try:
            for r in control("GET", "requests"):
                print("  request:", json.dumps(r))
        except Exception:
            pass
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
