"""The workload the GPU A/B scripts share (``sync_timing.py``, ``code_ab.py``): per document an ``ctx``-token window
prefilled once as a batch of ``B``, then per method an engine on it, and for a near-lossless method also the same
engine replaying the acceptance it reaches on dense's text (:func:`specdec.bench.dense_text_replay`).

It imports whichever ``specdec`` is first on ``sys.path`` (``code_ab.py`` runs older checkouts) and changes nothing
there."""

from __future__ import annotations


def engines(model, documents: str, methods: str, budget_ratio: float, ctx: int, B: int, new: int):
    """Yields ``(document, method, label, engine, prefilled)``; ``engine.replay`` is set for the label's rows (dense's
    text: a replay) and cleared after them."""
    from specdec.bench import _prefilled, dense_text_replay
    from specdec.data import context_windows, load_document
    from specdec.engine import cache_positions
    from specdec.loading import pipeline_config
    from specdec.presets import build_engine

    for doc in documents.split(","):
        ids = context_windows(model.tokenizer, load_document(doc), ctx, 1, new + 16, 1000)[0]
        model.release_cache()
        model.new_cache(B, cache_positions(len(ids), new, 4), reuse=True)
        pre = None
        for name in methods.split(","):
            eng = build_engine(model, pipeline_config(name, 4, None, None if name == "dense" else budget_ratio,
                                                      0.0, 1.0, 0, None), eos_token_id=-1)
            if pre is None:
                pre = _prefilled(eng, model, [ids], B, random_cache=False)
            variants = [(name, None)]
            if not eng.lossless:
                variants.append((f"{name} (dense's text)", dense_text_replay(eng, pre, new)[0]))
            for label, replay in variants:
                eng.replay = replay
                yield doc, name, label, eng, pre
            eng.replay = None
