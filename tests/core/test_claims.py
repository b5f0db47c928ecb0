"""app.core.claims: a pod's GPU device indices (and UUIDs) from its DRA claims' allocations
and the node's ResourceSlices (issue 23), as tables over plain API dicts."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.claims import (
    AllocatedDevice,
    ClaimDevicesError,
    ClaimRef,
    allocated_devices,
    held_by_index,
    pod_claims,
)
from app.core.records import HeldDevice

NVIDIA = "gpu.nvidia.com"
NODE = "gpu-1"


def claim(name: str, *results: dict[str, Any], allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {"devices": {"results": list(results)}}
    return {"metadata": {"name": name, "namespace": "ml"}, "status": status}


def result(device: str, driver: str = NVIDIA, pool: str = NODE, **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": driver, "pool": pool, "device": device, **extra}


def gpu(name: str, **attributes: Any) -> dict[str, Any]:
    return {"name": name, "attributes": attributes}


def slice_of(
    *devices: dict[str, Any],
    driver: str = NVIDIA,
    node: str = NODE,
    pool: str = NODE,
    generation: int = 1,
) -> dict[str, Any]:
    spec = {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
        "devices": list(devices),
    }
    return {"metadata": {"name": f"{node}-{driver}-{generation}"}, "spec": spec}


# NVIDIA's driver publishes index (enumeration order) and minor (/dev/nvidiaN) apart.
NVIDIA_SLICE = slice_of(
    gpu("gpu-0", index={"int": 0}, minor={"int": 2}, uuid={"string": "GPU-a"}),
    gpu("gpu-1", index={"int": 1}, minor={"int": 0}, uuid={"string": "GPU-b"}),
    gpu("gpu-2", index={"int": 2}, minor={"int": 1}),
    gpu("odd", index={"string": "3"}, minor={"bool": True}),
    gpu("bare"),
)


@pytest.mark.parametrize(
    ("claims", "slices", "attribute", "expected"),
    [
        pytest.param([claim("c", result("gpu-1"))], [NVIDIA_SLICE], "index", [1], id="one"),
        pytest.param([claim("c", result("gpu-1"))], [NVIDIA_SLICE], "minor", [0], id="minor"),
        pytest.param(
            [claim("c", result("gpu-1"))], [NVIDIA_SLICE], f"{NVIDIA}/minor", [0],
            id="qualified-attribute",
        ),
        pytest.param(
            [claim("c", result("gpu-0"))],
            [slice_of(gpu("gpu-0", **{f"{NVIDIA}/index": {"int": 5}}))],
            "index", [5], id="qualified-in-slice",
        ),
        pytest.param(
            [claim("a", result("gpu-2")), claim("b", result("gpu-0"), result("gpu-1"))],
            [NVIDIA_SLICE], "index", [2, 0, 1], id="claims-in-order",
        ),
        pytest.param(
            [claim("c", result("nic-0", driver="net.example.com"), result("gpu-0"))],
            [NVIDIA_SLICE], "index", [0], id="other-driver-left-out",
        ),
        pytest.param(
            [claim("c", result("gpu-0", adminAccess=True))],
            [NVIDIA_SLICE], "index", [], id="admin-access-left-out",
        ),
        pytest.param([], [NVIDIA_SLICE], "index", [], id="no-claims"),
        pytest.param(
            [claim("c", result("gpu-0"))],
            [
                slice_of(gpu("gpu-0", index={"int": 0}), generation=1),
                slice_of(gpu("gpu-0", index={"int": 3}), generation=2),
            ],
            "index", [3], id="newest-generation",
        ),
        pytest.param(
            [claim("c", result("gpu-0"))],
            [slice_of(gpu("gpu-0", index={"int": 7}), node="gpu-2"), NVIDIA_SLICE],
            "index", [0], id="other-nodes-slices-ignored",
        ),
    ],
)  # fmt: skip
def test_allocated_devices(
    claims: list[dict[str, Any]], slices: list[dict[str, Any]], attribute: str, expected: list[int]
) -> None:
    found = allocated_devices(claims, slices, node=NODE, drivers={NVIDIA}, attribute=attribute)
    assert [d.index for d in found] == expected


def test_an_allocated_device_names_its_claim_and_place() -> None:
    [found] = allocated_devices(
        [claim("train", result("gpu-1"))], [NVIDIA_SLICE], node=NODE, drivers={NVIDIA}
    )
    assert found == AllocatedDevice("ml/train", "gpu", NVIDIA, NODE, "gpu-1", 1, "GPU-b")


UUID = "GPU-5ad9f3ab-1c4f-4e52-9b1e-0f3c1b2d4e6a"


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        pytest.param({"uuid": {"string": UUID}}, UUID, id="uuid"),
        pytest.param({f"{NVIDIA}/uuid": {"string": UUID}}, UUID, id="qualified-in-slice"),
        pytest.param({}, "", id="missing"),
        pytest.param({"uuid": {"int": 7}}, "", id="not-a-string"),
        pytest.param({"uuid": "GPU-x"}, "", id="not-an-attribute-value"),
        pytest.param({"uuid": {"string": "x" * 129}}, "", id="too-long"),
        pytest.param({"uuid": {"string": "GPU-\n"}}, "", id="not-printable"),
        pytest.param({"other.example.com/uuid": {"string": UUID}}, "", id="other-domain"),
    ],
)  # fmt: skip
def test_a_device_uuid_is_read_when_there_and_never_an_error(
    attributes: dict[str, Any], expected: str
) -> None:
    slices = [slice_of(gpu("gpu-0", index={"int": 0}, **attributes))]
    [found] = allocated_devices([claim("c", result("gpu-0"))], slices, node=NODE, drivers={NVIDIA})
    assert (found.index, found.uuid) == (0, expected)


def test_held_devices_carry_their_uuids_by_index() -> None:
    claims = [claim("a", result("gpu-2")), claim("b", result("gpu-1"), result("gpu-0"))]
    found = allocated_devices(claims, [NVIDIA_SLICE], node=NODE, drivers={NVIDIA})
    # gpu-2 publishes no UUID
    assert held_by_index(found) == (HeldDevice(0, "GPU-a"), HeldDevice(1, "GPU-b"), HeldDevice(2))


@pytest.mark.parametrize(
    ("claims", "slices", "message", "retryable"),
    [
        pytest.param(
            [claim("c", result("gpu-0")), claim("late", allocated=False)], [NVIDIA_SLICE],
            "ResourceClaim ml/late: not allocated yet", True, id="not-allocated",
        ),
        pytest.param(
            [claim("c", result("gpu-9"))], [NVIDIA_SLICE],
            "ResourceClaim ml/c: device 'gpu-9' of driver gpu.nvidia.com (pool 'gpu-1') is "
            "not in node 'gpu-1''s ResourceSlices", True, id="device-not-in-slices",
        ),
        pytest.param(
            [claim("c", result("gpu-0", pool="other"))], [NVIDIA_SLICE],
            "not in node 'gpu-1''s ResourceSlices", True, id="other-pool",
        ),
        pytest.param(
            [claim("c", result("gpu-0"))],
            [slice_of(gpu("gpu-0", index={"int": 0}), node="gpu-2")],
            "not in node 'gpu-1''s ResourceSlices", True, id="slice-of-another-node",
        ),
        pytest.param(
            [claim("c", result("bare"))], [NVIDIA_SLICE],
            "ResourceClaim ml/c: device 'bare' of driver gpu.nvidia.com (pool 'gpu-1') has no "
            "attribute 'index'", False, id="attribute-missing",
        ),
        pytest.param(
            [claim("c", result("odd"))], [NVIDIA_SLICE],
            "attribute 'index' is {'string': '3'}, not an index", False, id="attribute-string",
        ),
        pytest.param(
            [claim("c", result("gpu-0"))],
            [slice_of(gpu("gpu-0", index={"int": -1}))],
            "attribute 'index' is {'int': -1}, not an index", False, id="attribute-negative",
        ),
    ],
)  # fmt: skip
def test_what_keeps_the_devices_from_being_known_is_an_error_naming_the_claim(
    claims: list[dict[str, Any]], slices: list[dict[str, Any]], message: str, retryable: bool
) -> None:
    with pytest.raises(ClaimDevicesError) as caught:
        allocated_devices(claims, slices, node=NODE, drivers={NVIDIA})
    assert message in str(caught.value)
    assert caught.value.retryable is retryable
    assert caught.value.code == "claim_devices"


def test_a_bool_attribute_is_not_an_index() -> None:
    with pytest.raises(ClaimDevicesError, match="not an index"):
        allocated_devices(
            [claim("c", result("odd"))], [NVIDIA_SLICE], node=NODE, drivers={NVIDIA},
            attribute="minor",
        )  # fmt: skip


def test_held_devices_are_sorted_and_one_device_twice_is_refused() -> None:
    def device(claim_name: str, index: int) -> AllocatedDevice:
        return AllocatedDevice(claim_name, "gpu", NVIDIA, NODE, f"gpu-{index}", index)

    assert held_by_index([device("ml/a", 3), device("ml/b", 1)]) == (HeldDevice(1), HeldDevice(3))
    assert held_by_index([]) == ()
    with pytest.raises(ClaimDevicesError, match="ml/b: device index 1 is also allocated to ml/a"):
        held_by_index([device("ml/a", 1), device("ml/b", 1)])


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param({"spec": {}}, [], id="no-claims"),
        pytest.param(
            {"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "train-gpu"}]}},
            [ClaimRef("gpu", "train-gpu")], id="by-name",
        ),
        pytest.param(
            {
                "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
                "status": {
                    "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]
                },
            },
            [ClaimRef("gpu", "p-gpu-x")], id="template-generated",
        ),
        pytest.param(
            {"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}},
            [ClaimRef("gpu", None)], id="template-not-generated-yet",
        ),
        pytest.param(
            {
                "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
                "status": {"resourceClaimStatuses": [{"name": "gpu"}]},
            },
            [], id="template-no-claim-needed",
        ),
    ],
)  # fmt: skip
def test_pod_claims(pod: dict[str, Any], expected: list[ClaimRef]) -> None:
    assert list(pod_claims(pod)) == expected
