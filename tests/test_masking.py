"""Secret masking (agent/masking.py): which keys changed is shown, values never are."""

from __future__ import annotations

import json
from typing import Any

from agent.masking import LAST_APPLIED, MASK, MASK_AFTER, MASK_BEFORE, mask_pair, mask_secret, mask_value

SECRET: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "db", "annotations": {LAST_APPLIED: '{"data":{"p":"c2VjcmV0"}}', "note": "kept"}},
    "data": {"p": "c2VjcmV0", "u": "YWRtaW4="},
}


def test_masks_every_value_and_the_last_applied_annotation() -> None:
    masked = mask_secret(SECRET)
    assert masked["data"] == {"p": MASK, "u": MASK}
    assert masked["metadata"]["annotations"] == {LAST_APPLIED: MASK, "note": "kept"}
    assert SECRET["data"]["p"] == "c2VjcmV0", "the input is not modified"


def test_a_pair_says_which_keys_changed_without_their_values() -> None:
    after = json.loads(json.dumps(SECRET))
    after["data"]["p"] = "bmV3"
    after["data"]["n"] = "YWRkZWQ="
    del after["data"]["u"]
    before_m, after_m = mask_pair(SECRET, after)
    assert before_m["data"] == {"p": MASK_BEFORE, "u": MASK}
    assert after_m["data"] == {"p": MASK_AFTER, "n": MASK}
    text = json.dumps([before_m, after_m])
    assert "c2VjcmV0" not in text and "bmV3" not in text and "YWRtaW4=" not in text


def test_other_kinds_and_paths_are_left_alone() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}}
    assert mask_secret(cm) is cm
    assert mask_value(("f:data", "f:a"), "b", secret=False) == "b"
    assert mask_value(("f:data", "f:a"), "b", secret=True) == MASK
    assert mask_value(("f:type",), "Opaque", secret=True) == "Opaque"
