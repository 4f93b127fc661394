"""`hami_webhook.py review`: offline verdicts and placements, as a CI gate (exit code)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from hami.state import snapshot_io
from hami.state.model import Gpu, Node, Snapshot

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "hami_webhook.py"), "review", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def _gpu_pod(name: str, mib: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "containers": [
                {"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mib}}}
            ]
        },
    }


def _snapshot(tmp_path: Path) -> Path:
    snapshot = Snapshot(
        nodes=(Node("only", (Gpu("GPU-only", 0, "NVIDIA L4", 10240, memory_used_mib=512),)),), taken_at=1.0, version=1
    )
    path = tmp_path / "snap.json"
    snapshot_io.save(snapshot, path)
    assert snapshot_io.load(path) == snapshot
    return path


def test_json_output_against_a_saved_snapshot_consumes_capacity_in_order(tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        yaml.safe_dump_all(
            [
                _gpu_pod("first", 6144),
                _gpu_pod("second", 6144),
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
            ]
        )
    )
    result = _run("--state", str(_snapshot(tmp_path)), "--output", "json", str(manifest))
    assert result.returncode == 1, result.stderr  # the second pod does not fit any more
    entries = json.loads(result.stdout)
    assert [(e["kind"], e["name"], e["allowed"]) for e in entries] == [
        ("Pod", "first", True),
        ("Pod", "second", False),
        ("ConfigMap", "c", True),
    ]
    first, second, _ = entries
    assert first["decision"]["node"] == "only" and first["decision"]["devices"] == ["GPU-only"]
    assert any(op["path"] == "/metadata/annotations" for op in first["patch"])
    assert "no node fits" in second["message"] and "only" in second["message"]
    for key in ("kind", "namespace", "name", "allowed", "message", "warnings", "patch", "decision"):
        assert key in second


def test_text_output_on_the_embedded_inventory_and_exit_zero(tmp_path: Path) -> None:
    result = _run("-", stdin=yaml.safe_dump(_gpu_pod("fine", 2048)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Pod ml/fine: ALLOWED (patched)" in result.stdout
    assert "placement: node=" in result.stdout
    assert "1 objects: 1 allowed, 0 denied" in result.stdout


def test_denied_controller_lists_every_violation(tmp_path: Path) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "bad", "namespace": "ml"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {
                    "hostPID": True,
                    "containers": [
                        {
                            "name": "x",
                            "image": "x",
                            "securityContext": {"privileged": True},
                            "resources": {"limits": {"nvidia.com/gpu": 8}},
                        }
                    ],
                },
            },
        },
    }
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(deployment))
    result = _run("--output", "json", str(path))
    assert result.returncode == 1
    (entry,) = json.loads(result.stdout)
    assert {v["rule"] for v in entry["violations"]} == {"privileged", "gpu-count", "host-pid"}
    assert "2 policy violations" in entry["message"]
    assert entry["warnings"]  # hostPID warns by default


def test_unreadable_input_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    assert _run(str(bad)).returncode == 2
    assert _run(str(tmp_path / "missing.yaml")).returncode == 2
    not_snapshot = tmp_path / "s.json"
    not_snapshot.write_text("{}")
    assert _run("--state", str(not_snapshot), str(bad)).returncode == 2
