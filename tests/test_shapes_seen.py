"""frag's reference mix is learned from the pods the webhook places."""

from __future__ import annotations

from hami.placement.decision import Decision, DeviceChoice
from hami.placement.frag import Shape
from hami.placement.shapes_seen import ShapeTracker
from hami.requests import ContainerGpuRequest, GpuRequest
from hami.state.model import Gpu, Node, Snapshot

SNAPSHOT = Snapshot(nodes=(Node("n", tuple(Gpu(f"G{i}", i, "L4", 20000) for i in range(4))),), version=1)


def _placed(memory_mib: int, cores: int = 0, count: int = 1) -> tuple[Decision, GpuRequest]:
    container = ContainerGpuRequest("c", "containers", 0, count, memory_mib=memory_mib, cores=cores)
    devices = tuple(DeviceChoice("c", 0, f"G{i}", i, "L4", memory_mib, cores) for i in range(count))
    return Decision("n", devices, "frag", 1.0, 1), GpuRequest((container,))


def test_mix_appears_after_enough_pods_and_reflects_their_shares() -> None:
    tracker = ShapeTracker(window=1000, minimum=50)
    for _ in range(49):
        tracker.observe(*_placed(5000), SNAPSHOT)
    assert tracker.mix(60.0) is None  # too few to say anything
    for _ in range(60):
        tracker.observe(*_placed(16200), SNAPSHOT)  # 810 milli of a 20000 MiB card
    for _ in range(11):
        tracker.observe(*_placed(1000, cores=40), SNAPSHOT)  # cores are the scarcer share: 400 milli
    tracker.observe(*_placed(20000, count=2), SNAPSHOT)
    mix = dict(tracker.mix(100.0).shapes)
    assert Shape(1, 810) in mix and Shape(1, 250) in mix and Shape(1, 400) in mix and Shape(2, 1000) in mix
    assert mix[Shape(1, 810)] > mix[Shape(1, 250)] > mix[Shape(1, 400)]
    assert abs(sum(mix.values()) - 1.0) < 1e-9


def test_window_forgets_the_old_past() -> None:
    tracker = ShapeTracker(window=100, minimum=10)
    for _ in range(100):
        tracker.observe(*_placed(5000), SNAPSHOT)
    for _ in range(100):
        tracker.observe(*_placed(10000), SNAPSHOT)
    assert [s for s, _ in tracker.mix(100.0).shapes] == [Shape(1, 500)]
