# gitops-agent container image.
# Versions live in one place: the image ARGs below must equal tools/versions.env
# (tests/test_packaging.py checks), and the tool versions are read from that file.

ARG GO_BUILDER_IMAGE=golang:1.26-bookworm
ARG PYTHON_BASE_IMAGE=python:3.11-slim-bookworm

# --- kustomize and helm, built from the Go module proxy at the pinned versions
FROM ${GO_BUILDER_IMAGE} AS tools
WORKDIR /src
COPY tools/versions.env ./
ENV CGO_ENABLED=0 GOFLAGS=-trimpath GOBIN=/out
RUN set -eu; . ./versions.env; \
    go install -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}"; \
    go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" \
      "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"

# --- the Python package as wheels (no compilers reach the final stage)
FROM ${PYTHON_BASE_IMAGE} AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# --- final image
FROM ${PYTHON_BASE_IMAGE}
# git: signature checks and SSH transport helpers; openssh-client: ssh-keygen -Y verify; gnupg: GPG keyrings.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends git openssh-client gnupg \
 && rm -rf /var/lib/apt/lists/*
COPY --from=wheels /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY --from=tools /out/kustomize /out/helm /usr/local/bin/
RUN useradd --uid 65532 --user-group --no-create-home --home-dir /tmp agent
# With a read-only root filesystem, /tmp and the cache are emptyDir volumes (see manifests/).
ENV HOME=/tmp GITOPS_AGENT_CACHE=/var/cache/gitops-agent PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["gitops-agent"]
CMD ["run", "--config", "/etc/gitops-agent/config.toml"]
