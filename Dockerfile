# gitops-agent container image.
#
#   docker build -t gitops-agent .
#
# One place for versions: tools/versions.env. The base images below are ARG defaults
# because FROM cannot read a file; tests/test_packaging.py checks they equal versions.env,
# and the tools stage reads KUSTOMIZE_VERSION and HELM_VERSION from that file, building
# them exactly as scripts/install-control-plane does (the test compares the commands), and
# sops from its GO_TOOL_sops pin as scripts/install-go-tools does.
# The final stage holds Python, the agent in a virtualenv, kustomize, helm, sops (encrypted
# manifests), ssh-keygen and gpg (commit signature checks); no compilers, no Go, no pip cache. It runs as uid 65532
# with a read-only root filesystem: HOME=/tmp and the Git cache are volumes (manifests/).

ARG GO_BUILDER_IMAGE=golang:1.26-bookworm
ARG PYTHON_BASE_IMAGE=python:3.11-slim-bookworm

# --- kustomize, helm and sops, built from the Go module proxy at the pinned versions
FROM ${GO_BUILDER_IMAGE} AS tools
WORKDIR /src
COPY tools/versions.env ./
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=mod -trimpath" GOBIN=/out
# GO_TOOL_sops is <package>@<version> from versions.env (the linters cannot see either in it).
# hadolint ignore=DL3062,SC2154
RUN set -eu; . ./versions.env; \
    go install -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}"; \
    go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" \
      "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"; \
    go install -ldflags "-s -w" "${GO_TOOL_sops}"; \
    /out/kustomize version; /out/helm version --short; /out/sops --version --disable-version-check

# --- the agent and its dependencies in a virtualenv (binary wheels; nothing is compiled)
FROM ${PYTHON_BASE_IMAGE} AS venv
WORKDIR /src
RUN python -m venv /opt/gitops-agent
COPY pyproject.toml README.md ./
COPY agent ./agent
# agent/dev (local control planes, the demo) is development tooling: not in the image.
RUN /opt/gitops-agent/bin/pip install --no-cache-dir --only-binary=:all: --no-binary=gitops-agent . \
 && rm -rf /opt/gitops-agent/lib/python3*/site-packages/agent/dev \
 && /opt/gitops-agent/bin/gitops-agent --version

# --- final image
FROM ${PYTHON_BASE_IMAGE}
# openssh-client: `ssh-keygen -Y verify` (SSH-signed commits); gnupg: GPG-signed commits.
# Git itself is libgit2 inside the pygit2 wheel: no git binary is needed.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-client gnupg \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 65532 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin agent
COPY --from=venv /opt/gitops-agent /opt/gitops-agent
COPY --from=tools /out/kustomize /out/helm /out/sops /usr/local/bin/
# HOME=/tmp and GITOPS_AGENT_CACHE are emptyDir volumes in manifests/ (read-only root filesystem).
ENV PATH=/opt/gitops-agent/bin:$PATH \
    HOME=/tmp \
    GITOPS_AGENT_CACHE=/var/cache/gitops-agent \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["gitops-agent"]
CMD ["run", "--config", "/etc/gitops-agent/config.toml"]
