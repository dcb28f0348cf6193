"""Interop: Azure's official Python SDK (azure-mgmt-compute + azure-identity) against the emulator.

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
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.identity import ClientSecretCredential
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute.models import Sku, VirtualMachineScaleSet, VirtualMachineScaleSetUpdate

URL = os.environ["EMULATOR_URL"].rstrip("/")
CA = os.environ["EMULATOR_CA"]
TENANT = "11111111-1111-1111-1111-111111111111"
CLIENT_ID = "python-sdk"
SECRET = "python-secret"
SUB = "00000000-0000-0000-0000-00000000feed"
RG = "rg-interop"
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


def main():
    tests = [test_bad_secret_is_refused, test_conditional_lifecycle]
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
