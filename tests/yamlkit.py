"""Kubernetes' own reading of YAML, for tests that compare the agent's with it: the oracle is
sigs.k8s.io/yaml's YAMLToJSONStrict in a small Go program (tools/go/yamljson, built into the cache
by ``scripts/install-go-tools``). Used by tests/test_yaml_oracle.py and tests/test_corpus.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.render.binaries import go_tool


def oracle() -> Path:
    found = go_tool("yamljson")
    if found is None:
        pytest.fail(
            "the YAML oracle is not built: run scripts/bootstrap (or scripts/install-go-tools yamljson)"
        )
    return found


def kubernetes_reads(text: str) -> list[dict[str, Any]]:
    """The oracle's verdict per document: ``{"doc": value}`` or ``{"error": why}``."""
    out = subprocess.run([str(oracle())], input=text.encode(), capture_output=True, timeout=120, check=True)
    return [json.loads(line) for line in out.stdout.decode().splitlines()]
