"""The age identities an app decrypts SOPS files with: from a file, an environment variable, a Secret.

Called by ``ClusterStages.spec_for`` before each render of an app (so a rotated key file or
Secret takes effect on the next pass) and by ``gitops-agent render``. The identities stay in
memory (``AgeKeys``, handed to ``sops`` through its environment); a message names where a
key should have come from, never what it holds. A configured source that yields no identity
fails the app's render (``RenderError``): an app whose keys are broken applies nothing.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable

from agent.config.types import Decryption
from agent.errors import ApiError, RenderError, RenderProblem
from agent.model import Manifest
from agent.render.sops import AgeKeys

#: Reads one Secret (namespace, name); ``None`` when it does not exist.
SecretReader = Callable[[str, str], Manifest | None]
#: Keys of a decryption Secret that hold identities (the convention of Flux's kustomize-controller).
AGE_KEY_SUFFIX = ".agekey"
_IDENTITY_PREFIX = "AGE-SECRET-KEY-1"


def _identities(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def load_keys(
    decryption: Decryption, *, read_secret: SecretReader | None, namespace: str, cluster: str = ""
) -> AgeKeys | None:
    """Every identity ``decryption`` names, or ``None`` when it names no source.

    ``namespace``: where the Secret is when ``secret_namespace`` is empty (``[agent] namespace``).
    ``read_secret`` ``None``: no cluster at hand (a Secret source is then a problem).
    """
    if not decryption.has_keys:
        return None
    found: list[str] = []
    sources: list[str] = []
    problems: list[RenderProblem] = []

    def take(where: str, key: str, text: str) -> None:
        lines = _identities(text)
        if not lines or any(not ln.startswith(_IDENTITY_PREFIX) for ln in lines):
            problems.append(
                RenderProblem(key, f"{where} holds no age identity (lines of {_IDENTITY_PREFIX}…)")
            )
            return
        found.extend(lines)
        sources.append(where)

    if decryption.age_key_file:
        where = f"file {decryption.age_key_file}"
        try:
            with open(decryption.age_key_file, encoding="utf-8") as f:
                take(where, "decryption.age_key_file", f.read())
        except (OSError, UnicodeDecodeError) as e:
            why = getattr(e, "strerror", None) or "not UTF-8 text"
            problems.append(RenderProblem("decryption.age_key_file", f"cannot read {where}: {why}"))
    if decryption.age_key_env:
        where = f"environment variable {decryption.age_key_env}"
        value = os.environ.get(decryption.age_key_env)
        if value is None:
            problems.append(RenderProblem("decryption.age_key_env", f"{where} is not set"))
        else:
            take(where, "decryption.age_key_env", value)
    if decryption.secret_name:
        ns = decryption.secret_namespace or namespace
        where = f"Secret {ns}/{decryption.secret_name}" + (f" in cluster {cluster!r}" if cluster else "")
        text, problem = _secret_identities(read_secret, ns, decryption.secret_name, where)
        if problem is not None:
            problems.append(RenderProblem("decryption.secret_name", problem))
        else:
            take(where, "decryption.secret_name", text)
    if problems:
        raise RenderError(problems, cluster=cluster)
    return AgeKeys("\n".join(found) + "\n", tuple(sources))


def _secret_identities(
    read_secret: SecretReader | None, namespace: str, name: str, where: str
) -> tuple[str, str | None]:
    """(the identities a Secret's ``*.agekey`` keys hold, or what is wrong with it)."""
    if read_secret is None:
        return "", f"{where}: no cluster to read it from here (use age_key_file or age_key_env)"
    try:
        secret = read_secret(namespace, name)
    except ApiError as e:
        if e.is_cluster_level:
            raise  # the cluster as a whole: its pass fails as such
        if e.is_denied:
            return "", f"{where}: the agent may not read it (RBAC: get secrets in {namespace})"
        return "", f"{where}: cannot be read (HTTP {e.status} {e.reason})"
    if secret is None:
        return "", f"{where} does not exist"
    data = secret.get("data") or {}
    texts = []
    for key in sorted(k for k in data if k.endswith(AGE_KEY_SUFFIX)):
        try:
            texts.append(base64.b64decode(str(data[key]), validate=True).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return "", f"{where}: key {key} is not UTF-8 text"
    if not texts:
        return "", f"{where} has no key ending in {AGE_KEY_SUFFIX}"
    return "\n".join(texts), None
