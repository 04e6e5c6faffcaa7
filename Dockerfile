# gitops-agent container image, where a container registry is reachable:
#
#   docker build -t gitops-agent .
#
# Without a registry, scripts/build-image builds the same image from Debian's packages (README,
# "Install"). Both follow tools/image/recipe.toml: the same Debian python3 and apt packages, the
# wheels pinned in tools/image/requirements.txt, the same tool binaries, user, environment and
# entrypoint; tests/test_packaging.py keeps them equal.
#
# One place for versions: tools/versions.env. The base images below are ARG defaults because
# FROM cannot read a file; tests/test_packaging.py checks they equal versions.env. The tools
# stage builds kustomize and helm exactly as scripts/install-control-plane does (helm with the
# Kubernetes version tools/helm-k8s-ldflags derives from its client-go), and every other
# tool exactly as scripts/install-go-tools does (each GO_TOOL_<name> line, each tools/go/<name>).
# The final stage holds Debian's python3, the agent in a virtualenv, the tools, ssh-keygen and
# gpg (commit signature checks); no compilers, no Go, no pip cache. It runs as uid 65532 with a
# read-only root filesystem: HOME=/tmp and the Git cache are volumes (manifests/).

ARG GO_BUILDER_IMAGE=golang:1.26-bookworm
ARG DEBIAN_BASE_IMAGE=debian:bookworm-slim

# --- kustomize, helm and the other pinned Go tools, built from the Go module proxy
FROM ${GO_BUILDER_IMAGE} AS tools
WORKDIR /src
COPY tools ./tools
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=mod -trimpath" GOBIN=/out
# Every GO_TOOL_ pin is module@version, from versions.env (hadolint cannot see inside the variable).
# hadolint ignore=DL3062
RUN set -eu; . ./tools/versions.env; \
    go install -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}"; \
    helm_k8s="$(./tools/helm-k8s-ldflags "${HELM_VERSION}")"; \
    go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} ${helm_k8s}" \
      "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"; \
    grep -E '^GO_TOOL_[A-Za-z0-9_-]+=' tools/versions.env | while IFS='=' read -r key pin; do \
      GOBIN=/tmp/tool go install -ldflags "-s -w" "${pin}"; mv /tmp/tool/* "/out/${key#GO_TOOL_}"; \
    done; \
    for dir in tools/go/*/; do \
      if [ -f "${dir}go.mod" ]; then go -C "${dir}" build -ldflags "-s -w" -o "/out/$(basename "${dir}")" .; fi; \
    done; \
    /out/kustomize version; /out/helm version --short

# --- Debian's python3 and the packages of tools/image/recipe.toml, and the user
FROM ${DEBIAN_BASE_IMAGE} AS base
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv openssh-client gnupg ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 agent \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin agent

# --- the agent and the pinned wheels in a virtualenv (binary wheels; nothing is compiled)
FROM base AS venv
WORKDIR /src
COPY tools/image/requirements.txt ./
COPY pyproject.toml README.md ./
COPY agent ./agent
# agent/dev (local control planes, the demo) is development tooling: not in the image.
RUN python3 -m venv /opt/gitops-agent \
 && /opt/gitops-agent/bin/pip install --quiet --no-cache-dir --only-binary=:all: --no-deps -r requirements.txt \
 && /opt/gitops-agent/bin/pip install --quiet --no-cache-dir --no-deps . \
 && /opt/gitops-agent/bin/pip check \
 && rm -rf /opt/gitops-agent/lib/python3*/site-packages/agent/dev \
 && /opt/gitops-agent/bin/gitops-agent --version

# --- final image
FROM base
COPY --from=venv /opt/gitops-agent /opt/gitops-agent
COPY --from=tools /out/ /usr/local/bin/
# HOME=/tmp and GITOPS_AGENT_CACHE are emptyDir volumes in manifests/ (read-only root filesystem).
ENV PATH=/opt/gitops-agent/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    GITOPS_AGENT_CACHE=/var/cache/gitops-agent \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["gitops-agent"]
CMD ["run", "--config", "/etc/gitops-agent/config.toml"]
