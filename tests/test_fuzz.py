"""Random and mutated AdmissionReviews never produce a 5xx, and every 200 is a valid answer."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.webhook_fixture import gpu_container, pod, review_of, running_webhook

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)

SEEDS = [
    review_of(pod()),
    review_of(pod(containers=[gpu_container(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192})])),
    review_of(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {"template": {"metadata": {}, "spec": {"containers": [{"name": "a", "image": "x"}]}}},
        }
    ),
    review_of(pod(), operation="UPDATE", old=pod()),
]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += _paths(value, (*prefix, index))
    return found


@st.composite
def mutated_reviews(draw: st.DrawFn) -> bytes:
    review = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(review) if p]
        if not paths:  # earlier mutations emptied it: nothing left to mutate
            break
        path = draw(st.sampled_from(paths))
        parent: Any = review
        for part in path[:-1]:
            parent = parent[part]
        if draw(st.booleans()) and isinstance(parent, dict):
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = draw(json_values)
    return orjson.dumps(review)


bodies = mutated_reviews() | json_values.map(orjson.dumps) | st.binary(max_size=64)


def _check(status: int, answer: Any, body: bytes) -> None:
    assert status < 500, (status, answer)
    if status == 200:
        sent = orjson.loads(body)
        assert answer["kind"] == "AdmissionReview"
        assert answer["apiVersion"] == sent["apiVersion"]
        response = answer["response"]
        assert response["uid"] == sent["request"]["uid"]
        assert isinstance(response["allowed"], bool)
        if not response["allowed"]:
            assert isinstance(response["status"]["message"], str)
    else:
        assert status == 400
        assert isinstance(answer, dict) and answer["message"]


def test_random_reviews_never_5xx(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running_webhook(tmp_path) as hook:

            @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
            @given(body=bodies, endpoint=st.sampled_from(["validate", "mutate"]))
            def inner(body: bytes, endpoint: str) -> None:
                status, answer = asyncio.run_coroutine_threadsafe(hook.post(endpoint, body), loop).result(10)
                _check(status, answer, body)

            loop = asyncio.get_running_loop()
            await asyncio.to_thread(inner)

    asyncio.run(scenario())


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=mutated_reviews())
def test_fast_and_careful_envelope_readers_agree(body: bytes) -> None:
    """The fast path must never accept what the careful one refuses, nor read it differently."""
    from hami.admission import ReviewError, _fast_request, _NotTypical, checked_request

    doc = orjson.loads(body)
    try:
        careful = checked_request(doc)
    except ReviewError:
        careful = None
    try:
        fast = _fast_request(doc) if isinstance(doc, dict) else None
    except _NotTypical:
        return
    assert fast == careful
