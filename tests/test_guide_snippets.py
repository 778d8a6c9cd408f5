"""The code of ``docs/guides/selector-plugin.md`` runs as printed: its verifier-attention selector passes the
selector kit (which changes the batch size between ``generate`` calls; the snippet once kept the last call's scores
and failed there with a raw "Sizes of tensors must match")."""

from __future__ import annotations

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "selector-plugin.md"


def _block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"{marker!r} in {len(found)} python blocks of {GUIDE.name}"
    return found[0]


def test_the_verifier_attention_selector_of_the_guide_passes_the_kit():
    from specdec.registry import SELECTORS
    from specdec.testing import check_selector

    ns: dict = {}
    exec(compile(_block("class MySelector"), str(GUIDE), "exec"), ns)  # noqa: S102 - the guide's own code
    SELECTORS.register("guide-mysel")(ns["MySelector"])
    try:
        check_selector("guide-mysel")
    finally:
        SELECTORS._entries.pop("guide-mysel", None)  # do not leak into other tests' selector matrices
