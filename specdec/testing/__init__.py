"""``specdec.testing``: the conformance kit a plugin author runs from the installed package.

Two matrices, each a plain function that raises ``AssertionError`` naming what broke:

* :func:`check_selector` — a drafting :class:`~specdec.interfaces.KVSelector` (built-in or plugin):
  what the draft attention actually reads, per layer, sequence, KV head and draft step, stays inside
  the verified tokens, holds no position twice, holds exactly the budget, keeps the sinks and the
  recent window; and end to end the greedy speculative output equals dense decoding (a ragged batch
  equal to each prompt alone; a budget covering the context accepts every draft).
* :func:`check_backend` — an :class:`~specdec.interfaces.AttentionBackend` against the reference
  backend through whole tiny-model forwards: ragged prefill, one-row decode, a (γ+1)-row verify with
  scores (logits and softmax, per KV group), and a sparse step over a per-KV-head plan.

Run them on every registered selector and backend (entry-point plugins included)::

    pytest --pyargs specdec.testing                       # everything registered here
    SPECDEC_TESTING_ONLY=knorm pytest --pyargs specdec.testing   # only your plugin

or call them yourself (``check_selector(lambda: MySelector(MyConfig(budget=b, sinks=2, recent=4)))``).
The project's own tests run the same functions (``tests/test_testing_kit.py``). Needs ``pytest`` only
for the ``pytest --pyargs`` form (``pip install specdec[test]``).
"""

from specdec.testing.backends import check_backend, runnable_backends
from specdec.testing.models import tiny_config, tiny_model
from specdec.testing.selectors import check_selector, drafting_selectors, record_visible_sets

__all__ = [
    "check_backend",
    "check_selector",
    "drafting_selectors",
    "record_visible_sets",
    "runnable_backends",
    "tiny_config",
    "tiny_model",
]
