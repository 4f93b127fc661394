"""Quantities and GPU requests: HAMi's resource names and defaults, ours, annotations."""

from __future__ import annotations

from fractions import Fraction

import pytest

from hami.quantity import QuantityError, format_mib, parse_quantity
from hami.requests import RequestError, gpu_request
from hami.workloads import pod_templates
from tests.webhook_fixture import gpu_container, pod


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8Gi", 8 * 2**30),
        ("500m", Fraction(1, 2)),
        ("2", 2),
        ("1.5e3", 1500),
        ("0.5Gi", 2**29),
        ("1k", 1000),
        ("16M", 16 * 10**6),
        (3, 3),
        (".5", Fraction(1, 2)),
        ("1E2", 100),
    ],
)
def test_quantities(text: object, value: object) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["8GB", "", "Gi", "1..2", "--1", True, None, [1], "1e99999", float("nan"), "9" * 60])
def test_bad_quantities(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)


def test_format_mib() -> None:
    assert (format_mib(8192), format_mib(3174), format_mib(512)) == ("8Gi", "3.1Gi", "512Mi")


def _ask(*containers: dict, **annotations: str):  # type: ignore[no-untyped-def]
    return gpu_request(pod_templates(pod(containers=list(containers), annotations=annotations or None))[0])


def test_hami_defaults_memory_without_count_is_one_gpu() -> None:
    ask = _ask(gpu_container(**{"nvidia.com/gpumem": 3000}))
    assert ask is not None
    (c,) = ask.containers
    assert (c.count, c.memory_mib, c.memory_percent, c.cores) == (1, 3000, None, 0)


def test_count_without_memory_is_the_whole_card() -> None:
    (c,) = _ask(gpu_container(**{"nvidia.com/gpu": 2})).containers
    assert c.count == 2
    assert c.memory_on(40960) == 40960  # percentage 100 by default


def test_ours_and_percentages() -> None:
    (c,) = _ask(gpu_container(**{"hami.io/vgpu": 1, "hami.io/vgpu-memory": "8Gi", "hami.io/vgpu-cores": 30})).containers
    assert (c.memory_mib, c.cores) == (8192, 30)
    (p,) = _ask(gpu_container(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25})).containers
    assert p.memory_on(40960) == 10240


def test_limits_win_over_requests_and_requests_alone_count() -> None:
    container = gpu_container(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096})
    container["resources"]["requests"] = {"nvidia.com/gpumem": 1024}
    (c,) = _ask(container).containers
    assert c.memory_mib == 4096
    only_requests = {"name": "r", "image": "x", "resources": {"requests": {"nvidia.com/gpu": 1}}}
    assert _ask(only_requests).containers[0].count == 1


def test_multi_container_and_non_gpu_pods() -> None:
    ask = _ask(
        gpu_container("a", **{"nvidia.com/gpumem": 1000}),
        {"name": "side", "image": "envoy"},
        gpu_container("b", **{"nvidia.com/gpu": 2, "nvidia.com/gpumem": 2000}),
    )
    assert [(c.container, c.index, c.count) for c in ask.containers] == [("a", 0, 1), ("b", 2, 2)]
    assert ask.total_devices == 3
    assert _ask({"name": "web", "image": "nginx"}) is None


def test_constraints_and_policies_from_annotations() -> None:
    ask = _ask(
        gpu_container(**{"nvidia.com/gpumem": 1000}),
        **{
            "nvidia.com/use-gputype": "A100, H100",
            "nvidia.com/nouse-gpuuuid": "GPU-1",
            "hami.io/node-scheduler-policy": "spread",
            "hami.io/scheduling-policy": "binpack",
            "hami.io/max-gpu-util": "30",
            "hami.io/workload-type": " Inference ",
        },
    )
    assert ask.use_types == ("A100", "H100")
    assert ask.nouse_uuids == ("GPU-1",)
    assert (ask.node_policy, ask.gpu_policy) == ("spread", "binpack")
    assert ask.max_gpu_util == 30.0
    assert ask.workload_type == "inference"


def test_bad_values_name_the_field() -> None:
    with pytest.raises(RequestError, match=r"spec.containers\[0\].resources.limits\[nvidia.com/gpumem\]"):
        _ask(gpu_container(**{"nvidia.com/gpumem": "lots"}))
    with pytest.raises(RequestError, match=r"hami\.io/max-gpu-util"):
        _ask(gpu_container(**{"nvidia.com/gpumem": 1000}), **{"hami.io/max-gpu-util": "fast"})


def test_repeated_container_shapes_are_read_once_and_changes_are_never_missed() -> None:
    from hami import requests as requests_module
    from hami.content_memo import ContentMemo
    from hami.requests import DEFAULT_NAMES
    from hami.validation.resources import read_template

    requests_module._READS = memo = ContentMemo(limit=3)
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}}}
    spec = {"containers": [container]}
    first = gpu_request(pod_templates({"kind": "Pod", "metadata": {}, "spec": spec})[0])
    again = gpu_request(pod_templates({"kind": "Pod", "metadata": {}, "spec": spec})[0])
    assert first == again and (memo.hits, memo.misses) == (1, 1)
    container["resources"]["limits"]["nvidia.com/gpumem"] = 8000  # the same dict, changed in place
    changed = gpu_request(pod_templates({"kind": "Pod", "metadata": {}, "spec": spec})[0])
    assert changed is not None and changed.containers[0].memory_mib == 8000
    container["resources"]["limits"]["nvidia.com/gpumem"] = 4000.5  # not 4000: a new key, rounded up
    rounded = gpu_request(pod_templates({"kind": "Pod", "metadata": {}, "spec": spec})[0])
    assert rounded is not None and rounded.containers[0].memory_mib == 4001
    container["resources"]["limits"]["nvidia.com/gpumem"] = "lots"
    with pytest.raises(RequestError, match="gpumem"):
        gpu_request(pod_templates({"kind": "Pod", "metadata": {}, "spec": spec})[0])
    for mib in (1000, 2000, 3000):  # past the limit the memo starts over and stays correct
        container["resources"]["limits"]["nvidia.com/gpumem"] = mib
        read = gpu_request(pod_templates({"kind": "Pod", "metadata": {}, "spec": spec})[0])
        assert read is not None and read.containers[0].memory_mib == mib

    # Validation reads the same way: NaN (Python's json accepts it) is malformed, null is not given.
    nan = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1, "hami.io/vgpu-memory": float("nan")}}}
    null = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1, "hami.io/vgpu-memory": None}}}
    for shape, shown in ((nan, "nan"), (null, "None"), (nan, "nan")):  # a JSON key would confuse the two
        template = pod_templates({"kind": "Pod", "metadata": {}, "spec": {"containers": [shape]}})[0]
        gpus, findings = read_template(template, DEFAULT_NAMES)
        assert [f.params["value"] for f in findings] == [shown] and gpus[0].count == 1
    requests_module._READS = ContentMemo()


def test_content_memo_remembers_results_that_are_none() -> None:
    from hami.content_memo import ContentMemo

    memo: ContentMemo[int | None] = ContentMemo()
    computed: list[str] = []
    for _ in range(3):
        assert memo.get("no-gpu", lambda: computed.append("no-gpu")) is None
    assert computed == ["no-gpu"] and (memo.hits, memo.misses) == (2, 1)
