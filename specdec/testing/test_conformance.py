"""``pytest --pyargs specdec.testing``: the conformance matrices over everything registered here.

``SPECDEC_TESTING_ONLY=name[,name]`` restricts both matrices to those selector/backend names (a
plugin author's own). Backends run on the CPU in float32; those that cannot run here are listed as
skipped with their reason by ``runnable_backends`` (they are not collected).
"""

import os

import pytest

from specdec.testing import check_backend, check_selector, drafting_selectors, runnable_backends

ONLY = {n.strip() for n in os.environ.get("SPECDEC_TESTING_ONLY", "").split(",") if n.strip()}


def _pick(names: list[str]) -> list[str]:
    return [n for n in names if not ONLY or n in ONLY]


@pytest.mark.parametrize("name", _pick(drafting_selectors()))
def test_selector_conformance(name):
    check_selector(name)


@pytest.mark.parametrize("name", _pick(runnable_backends()))
def test_backend_parity(name):
    check_backend(name)
