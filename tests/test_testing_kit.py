"""The backend half of :mod:`specdec.testing`: every backend that runs here against the reference,
through whole tiny-model forwards (ragged prefill, decode, verify with scores, sparse step); and the
kit's checks fail on a wrong backend."""

import pytest

from specdec.attention.reference import ReferenceBackend
from specdec.testing import check_backend, runnable_backends


@pytest.mark.parametrize("name", runnable_backends())
def test_backend_parity(name):
    check_backend(name)


class _OffByALittle(ReferenceBackend):
    def attend(self, q, k_cache, v_cache, meta):
        out, scores = super().attend(q, k_cache, v_cache, meta)
        return out + 1e-2, scores


class _WrongScores(ReferenceBackend):
    def attend(self, q, k_cache, v_cache, meta):
        out, scores = super().attend(q, k_cache, v_cache, meta)
        return out, None if scores is None else scores * 1.01


@pytest.mark.parametrize("backend, match", [(_OffByALittle(), "prefill.*differs"), (_WrongScores(), "scores of layer")])
def test_the_matrix_catches_broken_backends(backend, match):
    with pytest.raises(AssertionError, match=match):
        check_backend(backend)
