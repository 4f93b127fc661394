# syntax=docker/dockerfile:1
# hami-webhook: the admission webhook (default entrypoint) and the per-node agent
# (`python /app/agent.py ...`, see deploy/base/agent.yaml) in one image.
#
# Base pinned by exact version. Pin the digest too when building in CI, e.g.
#   docker buildx imagetools inspect python:3.11.11-slim-bookworm --format '{{json .Manifest.Digest}}'
# and write FROM python:3.11.11-slim-bookworm@sha256:<digest> (this file was written offline,
# without registry access, so no digest is recorded here rather than an unverified one).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in their own layer: code edits do not re-install them.
COPY requirements.txt /app/requirements.txt
RUN pip install --no-cache-dir -r /app/requirements.txt

# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it and runAsUser: 10001 in
# the manifests matches. No home directory, no login shell.
RUN groupadd --system --gid 10001 hami \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin hami

# Code owned by root and read-only to the app user: a compromised process cannot rewrite itself.
COPY hami /app/hami
COPY config /app/config
COPY hami_webhook.py agent.py /app/

USER 10001:10001

EXPOSE 8443 9400

# For `docker run` / compose only; Kubernetes ignores HEALTHCHECK and uses the probes in
# deploy/. slim has no curl, so Python checks /healthz; the certificate is not verified because
# it names the Service, not 127.0.0.1. (Containers started as the agent should override it.)
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import ssl, urllib.request; urllib.request.urlopen('https://127.0.0.1:8443/healthz', context=ssl._create_unverified_context(), timeout=3)"]

ENTRYPOINT ["python", "/app/hami_webhook.py", "serve"]
CMD ["--config", "/etc/hami-webhook/webhook.yaml", "--listen", "0.0.0.0:8443", "--state-dir", "/var/run/hami-webhook"]
