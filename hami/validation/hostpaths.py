"""Does a hostPath expose a container runtime socket?

Compared after normalisation, since the kubelet mounts whatever the path resolves to: `//`, `.`,
`..` and trailing slashes are folded, and `/var/run` is read as `/run` (a symlink on every current
distribution). A directory above a socket exposes it as well (`/run/containerd`, `/var/run`, `/`).
"""

from __future__ import annotations

import posixpath
import re

# Canonical (/run-based) locations of the runtimes' API sockets.
RUNTIME_SOCKETS: tuple[str, ...] = (
    "/run/docker.sock",
    "/run/dockershim.sock",
    "/run/cri-dockerd.sock",
    "/run/containerd/containerd.sock",
    "/run/containerd/containerd.sock.ttrpc",
    "/run/docker/containerd/containerd.sock",
    "/run/crio/crio.sock",
    "/run/k3s/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/var/snap/docker/common/run/docker.sock",
    "/var/snap/microk8s/common/run/containerd.sock",
)
# A socket of one of these names is a runtime socket wherever it lives (custom --data-root setups).
SOCKET_NAMES = frozenset(posixpath.basename(p) for p in RUNTIME_SOCKETS) | {"docker.sock", "containerd.sock"}

# Windows runtimes listen on named pipes, which a Windows pod can mount as a hostPath.
RUNTIME_PIPES = frozenset({"docker_engine", "containerd-containerd", "dockershim", "cri-dockerd"})
_PIPE = re.compile(r"^[\\/]{2}\.[\\/]pipe[\\/](.+)$", re.IGNORECASE)
_SLASHES = re.compile(r"/+")


def normalise(path: str) -> str:
    """Lexical normal form with `/var/run` folded onto `/run`; relative paths are taken from `/`.

    Windows named pipes are returned as written (they are not POSIX paths).
    """
    if _PIPE.match(path.strip()):
        return path.strip()
    folded = _SLASHES.sub("/", "/" + path)
    normal = posixpath.normpath(folded)
    if normal == "/var/run" or normal.startswith("/var/run/"):
        normal = "/run" + normal[len("/var/run") :]
    return normal


def _ancestors(path: str) -> set[str]:
    found = set()
    while path != "/":
        path = posixpath.dirname(path)
        found.add(path)
    return found


def _exposed(sockets: tuple[str, ...]) -> frozenset[str]:
    """Every path whose mount exposes one of `sockets`: the sockets and each directory above them.

    `/var` is above `/var/run`, so the /var/run spelling of each /run socket counts for ancestors too.
    """
    paths: set[str] = set()
    for socket in sockets:
        canonical = normalise(socket)
        spellings = {canonical}
        if canonical.startswith("/run/"):
            spellings.add("/var" + canonical)
        for spelling in spellings:
            paths.add(spelling)
            paths |= _ancestors(spelling)
    # /var/run itself folds to /run; keep the folded forms only, plus the unfoldable ancestor /var.
    return frozenset(normalise(p) for p in paths)


_DEFAULT_EXPOSED = _exposed(RUNTIME_SOCKETS)


def exposes_runtime_socket(path: str, extra_sockets: tuple[str, ...] = ()) -> bool:
    """True when mounting hostPath `path` puts a container runtime socket inside the container."""
    pipe = _PIPE.match(path.strip())
    if pipe:
        return pipe.group(1).lower() in RUNTIME_PIPES
    exposed = _DEFAULT_EXPOSED if not extra_sockets else _DEFAULT_EXPOSED | _exposed(extra_sockets)
    normal = normalise(path)
    return normal in exposed or posixpath.basename(normal) in SOCKET_NAMES
