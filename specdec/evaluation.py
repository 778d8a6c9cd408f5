"""``specdec eval``: task quality of any method against dense decoding, offline.

Two kinds of evidence, both paired with dense decoding on the same engine and prompts:

* **RULER-style synthetic tasks** built with the model's own tokenizer from text that ships with Python
  (haystack: ``pydoc_data`` prose; key words: words of that prose): ``passkey``, ``niah_single``,
  ``niah_multikey``, ``niah_multivalue``, ``variable_tracking``, ``common_words``. A sample scores the
  share of expected answers found in the greedy output (RULER's ``string_match_all``).
* **Real documents**: greedy token agreement with dense decoding, two ways: *teacher-forced* (the method
  runs on dense's trajectory; share of positions where its greedy token equals dense's given the same
  prefix: :class:`DenseTwin` with ``forced``) and *free-running* (share of equal positions of the two
  outputs, and the first divergence) and the total-variation distance ``½ Σ_v |p(v) − p_dense(v)|`` between the method's verify
  distribution and a dense pass on the same rows, averaged over the emitted rows.

Per task and method: mean score, the paired difference to dense with a sign test (exact two-sided
binomial p) and a bootstrap 95 % interval. Lossless methods score exactly dense (equal outputs).
Any registered method runs, plugins included (:func:`specdec.presets.build_engine` by name).
"""

from __future__ import annotations

import json
import math
import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from specdec.errors import SpecdecError
from specdec.interfaces import ScoreRequest, Verifier
from specdec.prompts import check_positions

TASKS = ("passkey", "niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "common_words")
#: the new tokens each task's samples ask for (the answer's room)
TASK_NEW_TOKENS = {"passkey": 8, "niah_single": 12, "niah_multikey": 12, "niah_multivalue": 48,
                   "variable_tracking": 32, "common_words": 48}
#: held-out documents for agreement (never trained on by ``specdec train-draft``): prose and code
DOCUMENTS = ("pydoc", "stdlib:argparse", "stdlib:typing", "stdlib:inspect", "stdlib:tarfile")
INTRO = ("There is an important piece of information hidden inside a lot of irrelevant text. "
         "Find it and memorize it. I will quiz you about it.\n\n")


# ---------------------------------------------------------------------------------------------------
# synthetic tasks
# ---------------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _words() -> tuple[str, ...]:
    """Distinct lower-case words (5-10 letters) of the pydoc prose: needle keys and the word lists."""
    from specdec.data import load_document

    return tuple(sorted(set(re.findall(r"\b[a-z]{5,10}\b", load_document("pydoc")))))


def task_source() -> dict[str, str]:
    """What fixes the synthetic tasks' text besides task, index and seed: the Python that runs (its ``pydoc_data``
    is the haystack and the word list) and a digest of that text. Recorded in ``specdec eval``'s settings: two runs
    whose digests differ have other samples (e.g. Python 3.11 against 3.12)."""
    import hashlib
    import platform

    from specdec.data import load_document

    digest = hashlib.sha256(load_document("pydoc").encode()).hexdigest()[:12]
    return dict(python=platform.python_version(), pydoc_sha256=digest)


def _haystack_insert(enc, room: int, needles: list[list[int]], rng: random.Random) -> list[int]:
    """``room`` tokens of pydoc prose from a random offset with the needles inserted at spread depths."""
    from specdec.data import load_document

    body_len = room - sum(len(n) for n in needles)
    if body_len < 16:
        raise SpecdecError(f"the context is too short for this task's needles; use --context-tokens >= 256.")
    ids = _pydoc_ids(enc)
    start = rng.randrange(0, len(ids) - body_len)
    body = ids[start : start + body_len]
    cuts = sorted(int(body_len * (i + rng.random()) / len(needles)) for i in range(len(needles)))
    out, prev = [], 0
    for c, n in zip(cuts, needles):
        out += body[prev:c] + n
        prev = c
    return out + body[prev:]


_IDS_CACHE: dict[int, list[int]] = {}


def _pydoc_ids(enc) -> list[int]:
    from specdec.data import load_document

    key = id(enc.__self__) if hasattr(enc, "__self__") else 0
    if key not in _IDS_CACHE:
        _IDS_CACHE[key] = enc(load_document("pydoc"))
    return _IDS_CACHE[key]


def make_sample(task: str, tokenizer, context: int, seed: int) -> dict[str, Any]:
    """One sample of ``task``: ``prompt`` (exactly ``context`` token ids), ``answers`` (strings) and
    ``max_new_tokens``."""
    if task not in TASKS:
        raise SpecdecError(f"unknown task {task!r}; known: {', '.join(TASKS)}.")
    rng = random.Random(f"{task}:{seed}")
    tok_fn = tokenizer.__call__

    def enc(s: str) -> list[int]:
        return tok_fn(s, add_special_tokens=False).input_ids

    enc.__self__ = tokenizer  # cache key of the pydoc token ids
    words = _words()
    num = lambda n: str(rng.randint(10 ** (n - 1), 10**n - 1))  # noqa: E731
    if task == "common_words":
        common = rng.sample(words, 10)
        rare = [w for w in rng.sample(words, 400) if w not in common]
        q = enc("\nWhat are the 10 most common words in the above list? Answer: The top 10 words that appear "
                "most often in the list are:")
        room = context - len(q)
        items, n_tok, i = [], 0, 0
        pool = [w for w in common for _ in range(6)] + rare
        while True:
            rng.shuffle(pool)
            for w in pool:
                piece = enc(f" {i + 1}. {w}")
                if n_tok + len(piece) > room:
                    break
                items.append(piece)
                n_tok += len(piece)
                i += 1
            else:
                continue
            break
        body = [t for p in items for t in p]
        body += enc(" ") * (room - len(body)) if room > len(body) else []
        return dict(prompt=(body + q)[-context:], answers=common, max_new_tokens=TASK_NEW_TOKENS[task])
    if task == "passkey":
        key = num(5)
        needles = [f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n"]
        question, answers, new = "\n\nWhat is the pass key? The pass key is", [key], TASK_NEW_TOKENS[task]
    elif task == "niah_single":
        w, v = rng.choice(words), num(7)
        needles = [f"\nOne of the special magic numbers for {w} is: {v}.\n"]
        question = (f"\n\nWhat is the special magic number for {w} mentioned in the provided text? "
                    f"The special magic number for {w} mentioned in the provided text is")
        answers, new = [v], TASK_NEW_TOKENS[task]
    elif task == "niah_multikey":
        keys = rng.sample(words, 4)
        vals = [num(7) for _ in keys]
        needles = [f"\nOne of the special magic numbers for {w} is: {v}.\n" for w, v in zip(keys, vals)]
        rng.shuffle(needles)
        w, v = keys[0], vals[0]
        question = (f"\n\nWhat is the special magic number for {w} mentioned in the provided text? "
                    f"The special magic number for {w} mentioned in the provided text is")
        answers, new = [v], TASK_NEW_TOKENS[task]
    elif task == "niah_multivalue":
        w = rng.choice(words)
        vals = [num(7) for _ in range(4)]
        needles = [f"\nOne of the special magic numbers for {w} is: {v}.\n" for v in vals]
        question = (f"\n\nWhat are all the special magic numbers for {w} mentioned in the provided text? "
                    f"The special magic numbers for {w} mentioned in the provided text are")
        answers, new = vals, TASK_NEW_TOKENS[task]
    else:  # variable_tracking
        names = ["".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)) for _ in range(5)]
        v = num(5)
        needles = [f"\nVAR {names[0]} = {v}.\n"] + [f"\nVAR {b} = VAR {a}.\n" for a, b in zip(names, names[1:])]
        question = (f"\n\nFind all variables that are assigned the value {v} in the text above. Answer: According to "
                    f"the chain(s) of variable assignment in the text above, 5 variables are assigned the value {v}, "
                    "they are:")
        answers, new = names, TASK_NEW_TOKENS[task]
    intro, q = enc(INTRO), enc(question)
    hay = _haystack_insert(enc, context - len(intro) - len(q), [enc(n) for n in needles], rng)
    return dict(prompt=intro + hay + q, answers=answers, max_new_tokens=new)


def score(text: str, answers: Sequence[str]) -> float:
    """Share of ``answers`` found in ``text`` (case-insensitive)."""
    t = text.lower()
    return sum(a.lower() in t for a in answers) / len(answers)


# ---------------------------------------------------------------------------------------------------
# paired statistics
# ---------------------------------------------------------------------------------------------------
def sign_test(diffs: Sequence[float]) -> float:
    """Exact two-sided sign-test p-value of paired differences (ties dropped; 1.0 when all tie)."""
    pos = sum(d > 0 for d in diffs)
    neg = sum(d < 0 for d in diffs)
    n = pos + neg
    if n == 0:
        return 1.0
    k = min(pos, neg)
    p = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * p)


def bootstrap_ci(diffs: Sequence[float], n: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``diffs``."""
    if not diffs:
        return (0.0, 0.0)
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(n))
    lo = means[int((1 - level) / 2 * n)]
    hi = means[min(n - 1, int((1 + level) / 2 * n))]
    return (lo, hi)


# ---------------------------------------------------------------------------------------------------
# TV distance of verify distributions against a dense twin pass (any verifier)
# ---------------------------------------------------------------------------------------------------
class DenseTwin(Verifier):
    """Wraps any verifier: a dense pass on the same rows before each verification, then the TV distance
    between the two distributions on the emitted rows. The dense pass writes the rows' K/V first and the
    wrapped pass overwrites them, so the run itself is the method's own run.

    With ``forced`` (per sequence: the prompt followed by dense decoding's greedy tokens) the run is
    **teacher-forced on the dense trajectory**: the engine is handed logits whose greedy choice is dense's
    next token, so it accepts exactly the drafts that match dense and then emits dense's token. Every
    emitted row was thus computed by the wrapped verifier (its own sparse plan, its own K/V and history
    signals) on dense's prefix, and :meth:`summary` reports the share of those rows whose greedy token
    equals dense's (``tf_agreement``): the per-position fidelity, which one early divergence cannot
    sink as it sinks the free-running comparison."""

    def __init__(self, inner, forced: list[list[int]] | None = None) -> None:
        self.inner = inner
        self.lossless = inner.lossless
        self.model = inner.model
        self.forced = forced
        self.tv_sum, self.tv_max, self.rows = 0.0, 0.0, 0
        self.tf_equal, self.tf_rows = 0, 0
        self._pending = None

    def __getattr__(self, name: str):  # stats/report/last_plan ... of the wrapped verifier
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def verify(self, state, tokens: torch.Tensor, scores: ScoreRequest | None) -> torch.Tensor:
        dense = self.model.forward(tokens, state.cache, state.lengths)  # (B, T, V)
        out = self.inner.verify(state, tokens, scores)
        tv = 0.5 * (torch.softmax(out.float(), -1) - torch.softmax(dense.float(), -1)).abs().sum(-1)  # (B, T)
        B, T, V = out.shape
        want = None
        if self.forced is not None:
            # row j predicts the token after the pending one (the last of state.tokens) + j; -1 past dense's end
            want = torch.full((B, T), -1, dtype=torch.long)
            for b in range(B):
                start = len(state.tokens[b])
                ref = self.forced[b][start : start + T]
                want[b, : len(ref)] = torch.tensor(ref, dtype=torch.long)
            want = want.to(out.device)
        self._pending = ([len(t) for t in state.tokens], state.active.clone(), tv, out.argmax(-1), want)
        if want is None:
            return out
        # dense's token wins every row (the sparse choice where dense has ended): the trajectory is dense's
        choice = torch.where(want >= 0, want, out.argmax(-1))
        return torch.zeros_like(out).scatter_(-1, choice.unsqueeze(-1), 1.0)

    def on_verify(self, state) -> None:
        self.inner.on_verify(state)
        old, act, tv, mine, want = self._pending
        for b in range(tv.shape[0]):
            if bool(act[b]):
                k = min(max(len(state.tokens[b]) - old[b], 1), tv.shape[1])  # rows whose token was emitted
                self.tv_sum += float(tv[b, :k].sum())
                self.tv_max = max(self.tv_max, float(tv[b, :k].max()))
                self.rows += k
                if want is not None:
                    ok = want[b, :k] >= 0
                    self.tf_rows += int(ok.sum())
                    self.tf_equal += int(((mine[b, :k] == want[b, :k]) & ok).sum())

    def summary(self) -> dict[str, float]:
        out = dict(tv_mean=self.tv_sum / max(self.rows, 1), tv_max=self.tv_max, tv_rows=self.rows)
        if self.forced is not None:
            out.update(tf_agreement=self.tf_equal / max(self.tf_rows, 1), tf_rows=self.tf_rows)
        return out


# ---------------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------------
def parse_methods(spec: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """``"vegas,dustin:draft=early-exit:dense_every=8"`` → ``{label: (method, options)}`` (checked names; each entry:
    :func:`specdec.loading.method_spec`)."""
    from specdec.loading import method_spec

    items = [s.strip() for s in spec.split(",") if s.strip()]
    twice = sorted({i for i in items if items.count(i) > 1})
    if twice:  # one column each: "vegas,vegas" ran one
        raise SpecdecError(f"--methods names {', '.join(twice)} more than once; name each method once.")
    out = {item: method_spec(item) for item in items}
    if not out:
        raise SpecdecError("--methods is empty; name at least one method, e.g. --methods dustin.")
    return out


def check_eval_args(tasks: Sequence[str], context: int, samples: int, budget: int | None, budget_ratio: float | None,
                    cli: bool = False, gamma: int = 4, documents: Sequence[str] = ("pydoc",)) -> None:
    """One line for a bad task name, context, sample count, budget or γ, or nothing to evaluate; ``cli``: named by
    their ``specdec eval`` flags, else by :func:`run_eval`'s arguments."""
    f = (lambda flag, arg: flag if cli else arg)  # noqa: E731
    if not 1 <= gamma <= 64:  # the pipeline config's bound, named as the user wrote it (it failed after the model load)
        raise SpecdecError(f"{f('--gamma', 'gamma')} must be between 1 and 64 (got {gamma}).")
    if not tasks and not documents:  # it loaded the model and wrote an empty report
        raise SpecdecError(f"nothing to evaluate: {f('--tasks', 'tasks')} and {f('--documents', 'documents')} are "
                           "both empty; give a task or a document.")
    ctx, smp, bud, rat = f("--context-tokens", "context"), f("--samples", "samples"), f("--budget", "budget"), \
        f("--budget-ratio", "budget_ratio")
    if budget is not None and budget_ratio is not None:
        raise SpecdecError(f"{bud} {budget} and {rat} {budget_ratio} were both given; pass only one.")
    if budget_ratio is not None and not 0 < budget_ratio <= 1:
        raise SpecdecError(f"{rat} must be in (0, 1] (got {budget_ratio}).")
    if budget is not None and budget < 1:
        raise SpecdecError(f"{bud} must be >= 1 (got {budget}).")
    for t in tasks:
        if t not in TASKS:
            raise SpecdecError(f"unknown task {t!r}; known: {', '.join(TASKS)}.")
    if context < 256 or samples < 1:
        raise SpecdecError(f"{ctx} must be >= 256 and {smp} >= 1 (got {context}, {samples}).")
    if budget is not None and budget > context:
        raise SpecdecError(f"{bud} {budget} exceeds {ctx} {context}; use a budget <= {context}.")


def run_eval(model, methods: dict[str, tuple[str, dict[str, Any]]], tasks: Sequence[str] = TASKS, context: int = 1024,
             samples: int = 2, budget: int | None = None, budget_ratio: float | None = None, gamma: int = 4,
             documents: Sequence[str] = DOCUMENTS[:2], doc_context: int | None = None, doc_tokens: int = 64,
             seed: int = 0, tokenizer=None, log=print, max_new_tokens: int | None = None,
             adaptive: bool | None = None) -> dict[str, Any]:
    """Every method (and dense, the reference) on ``samples`` samples per task and on the documents.

    ``max_new_tokens`` caps every task's answer length (``None``: each task's own, 8–48 tokens).
    ``adaptive``: adaptive γ / dense fall-back of the lossless methods (:mod:`specdec.adaptive`; ``None``: its
    default, ``ADAPTIVE_DEFAULT``); it changes their τ and speed, never their tokens.

    Returns ``{"tasks": [...per sample...], "documents": [...], "summary": {...}, "task_text": {...}}``
    (``task_text``: :func:`task_source`, the Python whose ``pydoc_data`` made the samples).
    """
    from specdec.data import context_ids, load_document
    from specdec.engine import SpeculativeEngine
    from specdec.presets import PipelineConfig, build_engine

    tok = tokenizer or model.tokenizer
    if tok is None:
        raise SpecdecError("specdec eval needs a tokenizer (the model has none); pass tokenizer=.")
    if not isinstance(methods, dict) or not all(isinstance(v, tuple) and len(v) == 2 for v in methods.values()):
        raise SpecdecError(f"methods must be a dict {{label: (method, options)}}, got {type(methods).__name__}; build "
                           "it with specdec.evaluation.parse_methods('vegas,dustin:draft=early-exit').")
    for name, value in (("tasks", tasks), ("documents", documents)):
        if isinstance(value, str):  # iterated per character: "unknown task 'p'"
            raise SpecdecError(f"{name} must be a list of names, not the string {value!r}; e.g. {name}=[{value!r}].")
    check_eval_args(tasks, context, samples, budget, budget_ratio, gamma=gamma, documents=documents)
    # before any prefill: a context past the model's positions would run for minutes before failing
    task_new = max((TASK_NEW_TOKENS[t] for t in tasks), default=0)
    task_new = task_new if max_new_tokens is None else min(task_new, max_new_tokens)
    if tasks:
        check_positions(context, task_new, model.dims.max_positions, "--context-tokens")
    if documents:
        check_positions(doc_context or context, doc_tokens, model.dims.max_positions, "--context-tokens")

    dctx = doc_context or context
    # every document before any prefill (a short or unknown last one failed after the tasks had run)
    doc_ids = {doc: context_ids(tok, load_document(doc), dctx, offset=doc_tokens + 16, name=doc) for doc in documents}
    dense = SpeculativeEngine(model, method="dense", eos_token_id=-1)

    def engine(method, opts):
        kw = dict(method=method, gamma=gamma, options=dict(opts))
        if adaptive is not None:
            kw["adaptive"] = adaptive
        if budget is not None:
            kw["budget"] = budget
        elif budget_ratio is not None:
            kw["budget_ratio"] = budget_ratio
        eng = build_engine(model, PipelineConfig.make(**kw), eos_token_id=-1)
        if getattr(eng, "verifier", None) is not None:
            eng.verifier = DenseTwin(eng.verifier)
        return eng

    for method, opts in methods.values():  # a method that cannot be built fails before any run, not after dense's
        engine(method, opts)
    task_rows = []
    for task in tasks:
        for i in range(samples):
            s = make_sample(task, tok, context, seed * 1000 + i)
            if max_new_tokens is not None:
                s["max_new_tokens"] = min(s["max_new_tokens"], max_new_tokens)
            pre = dense.prefill([s["prompt"]])
            ref = dense.generate([s["prompt"]], s["max_new_tokens"], prefilled=pre)
            ref_text = tok.decode(ref.tokens[0])
            row = dict(task=task, sample=i, answers=s["answers"], dense=score(ref_text, s["answers"]),
                       dense_text=ref_text, methods={})
            for label, (method, opts) in methods.items():
                res = engine(method, opts).generate([s["prompt"]], s["max_new_tokens"], prefilled=pre)
                text = tok.decode(res.tokens[0])
                row["methods"][label] = dict(score=score(text, s["answers"]), text=text,
                                             identical=res.tokens[0] == ref.tokens[0], tau=res.stats.mean_accepted_length)
            task_rows.append(row)
            log(f"{task} #{i}: dense {row['dense']:.2f} " + " ".join(f"{k} {v['score']:.2f}" for k, v in row["methods"].items()))
    doc_rows = []
    for doc in documents:
        ids = doc_ids[doc]
        pre = dense.prefill([ids])
        ref = dense.generate([ids], doc_tokens, prefilled=pre)
        row = dict(document=doc, context=dctx, new_tokens=doc_tokens, methods={})
        for label, (method, opts) in methods.items():
            eng = engine(method, opts)
            res = eng.generate([ids], doc_tokens, prefilled=pre)
            a, b = res.tokens[0], ref.tokens[0]
            n = min(len(a), len(b))
            first = next((j for j in range(n) if a[j] != b[j]), n)
            twin = isinstance(getattr(eng, "verifier", None), DenseTwin)
            tv = eng.verifier.summary() if twin else dict(tv_mean=0.0, tv_max=0.0, tv_rows=0)
            tf = dict(tf_agreement=1.0 if a == b else float("nan"), tf_rows=0, tf_tv_mean=0.0)
            if twin:  # teacher-forced on dense's trajectory: the per-position fidelity
                forced = engine(method, opts)
                forced.verifier.forced = [list(ids) + list(b)]
                got = forced.generate([ids], doc_tokens, prefilled=pre).tokens[0]
                if got != b:
                    raise SpecdecError(f"the teacher-forced run of {label} left dense's trajectory; this is a bug in specdec eval.")
                fs = forced.verifier.summary()
                tf = dict(tf_agreement=fs["tf_agreement"], tf_rows=fs["tf_rows"], tf_tv_mean=fs["tv_mean"])
            rep = getattr(getattr(eng, "verifier", None), "report", None)
            kv = (rep() if callable(rep) else {}).get("kv_read_vs_dense")  # a sparse verifier's cost (valve re-runs included)
            row["methods"][label] = dict(agreement=sum(x == y for x, y in zip(a, b)) / max(n, 1), first_divergence=first,
                                         kv_read_vs_dense=kv,
                                         identical=a == b, tau=res.stats.mean_accepted_length,
                                         tokens_per_second=res.stats.tokens_per_second, **tv, **tf)
        doc_rows.append(row)
        log(f"{doc}: " + " ".join(f"{k} agreement teacher-forced {v['tf_agreement']:.3f} free-running {v['agreement']:.3f} "
                                  f"TV {v['tv_mean']:.4f}" for k, v in row["methods"].items()))
    result = dict(tasks=task_rows, documents=doc_rows)
    result["summary"] = summarize(result, list(methods))
    result["task_text"] = task_source()  # the samples follow the running Python's pydoc_data (see task_source)
    return result


def summarize(result: dict[str, Any], labels: Sequence[str]) -> dict[str, Any]:
    """Per method: per task mean score vs dense, paired sign test and bootstrap interval; document agreement."""
    out: dict[str, Any] = {}
    tasks = sorted({r["task"] for r in result["tasks"]}, key=lambda t: TASKS.index(t))
    for label in labels:
        per_task = {}
        all_diffs = []
        for t in tasks:
            rows = [r for r in result["tasks"] if r["task"] == t]
            diffs = [r["methods"][label]["score"] - r["dense"] for r in rows]
            all_diffs += diffs
            per_task[t] = dict(n=len(rows), score=sum(r["methods"][label]["score"] for r in rows) / len(rows),
                               dense=sum(r["dense"] for r in rows) / len(rows), diff=sum(diffs) / len(diffs),
                               sign_p=sign_test(diffs), ci95=bootstrap_ci(diffs),
                               identical=sum(r["methods"][label]["identical"] for r in rows))
        docs = [r["methods"][label] for r in result["documents"]]
        out[label] = dict(
            tasks=per_task,
            all_tasks=dict(n=len(all_diffs), diff=sum(all_diffs) / max(len(all_diffs), 1), sign_p=sign_test(all_diffs),
                           ci95=bootstrap_ci(all_diffs)),
            agreement=sum(d["agreement"] for d in docs) / max(len(docs), 1) if docs else None,
            tf_agreement=(sum(d["tf_agreement"] * d["tf_rows"] for d in docs) / max(sum(d["tf_rows"] for d in docs), 1)
                          if docs and all(d["tf_rows"] for d in docs) else
                          (sum(d["tf_agreement"] for d in docs) / len(docs) if docs else None)),
            tv_mean=sum(d["tv_mean"] for d in docs) / max(len(docs), 1) if docs else None,
            tau=sum(d["tau"] for d in docs) / max(len(docs), 1) if docs else None,
            kv_read_vs_dense=(sum(d["kv_read_vs_dense"] for d in docs) / len(docs)
                              if docs and all(d.get("kv_read_vs_dense") is not None for d in docs) else None),
        )
    return out


def _pct(v: float | None) -> str:
    """``0.257`` → ``25.7%``; ``None`` (a verifier that does not count its KV reads, e.g. a dense one) → ``–``."""
    return "–" if v is None else f"{v:.1%}"


def markdown(result: dict[str, Any], meta: dict[str, Any]) -> str:
    """The eval table (tasks × methods, dense alongside) and the per-document agreement table."""
    summ = result["summary"]
    labels = list(summ)
    tasks = list(next(iter(summ.values()))["tasks"]) if summ else []
    lines = [f"# specdec eval — {meta.get('date', '')}", "", f"- command: `{meta.get('command', '')}`",
             f"- settings: {json.dumps({k: v for k, v in meta.items() if k not in ('date', 'command')})}", "",
             "## Synthetic tasks (score = share of answers found; Δ = method − dense, sign-test p, bootstrap 95 % CI)", "",
             "| task | n | dense | " + " | ".join(f"{l} | Δ {l} (p; CI)" for l in labels) + " |",
             "|---|---|---|" + "---|---|" * len(labels)]
    for t in tasks:
        first = summ[labels[0]]["tasks"][t]
        cells = []
        for l in labels:
            s = summ[l]["tasks"][t]
            cells += [f"{s['score']:.2f}", f"{s['diff']:+.2f} (p={s['sign_p']:.2f}; [{s['ci95'][0]:+.2f}, {s['ci95'][1]:+.2f}])"]
        lines.append(f"| {t} | {first['n']} | {first['dense']:.2f} | " + " | ".join(cells) + " |")
    if tasks:
        cells = []
        for l in labels:
            a = summ[l]["all_tasks"]
            cells += ["", f"{a['diff']:+.3f} (p={a['sign_p']:.2f}; [{a['ci95'][0]:+.3f}, {a['ci95'][1]:+.3f}])"]
        lines.append(f"| **all** | {summ[labels[0]]['all_tasks']['n']} | | " + " | ".join(cells) + " |")
    if result["documents"]:
        lines += ["", "## Real documents (greedy token agreement with dense, TV distance of verify distributions)", "",
                  "*Teacher-forced*: share of positions where the method's greedy token equals dense's given dense's "
                  "prefix (the method runs on dense's trajectory; rows = positions scored). *Free-running*: share of "
                  "equal positions when the method follows its own output (one early divergence shifts the rest). "
                  "*First divergence*: the first generated token that differs from dense's (— : none).", "",
                  "| document | method | agreement, teacher-forced (rows) | agreement, free-running | first divergence | "
                  "TV mean | TV max | τ | KV read vs dense |", "|---|---|---|---|---|---|---|---|---|"]
        for r in result["documents"]:
            for l, m in r["methods"].items():
                lines.append(f"| {r['document']} | {l} | {m['tf_agreement']:.2%} ({m['tf_rows']}) | {m['agreement']:.2%} | "
                             f"{'—' if m.get('identical') else m['first_divergence']} | {m['tv_mean']:.4f} | "
                             f"{m['tv_max']:.4f} | {m['tau']:.2f} | "
                             f"{_pct(m.get('kv_read_vs_dense'))} |")
        lines += ["", "| method | agreement, teacher-forced (all rows) | agreement, free-running (mean) | KV read vs dense |",
                  "|---|---|---|---|"]
        for l in labels:
            lines.append(f"| {l} | {summ[l]['tf_agreement']:.2%} | {summ[l]['agreement']:.2%} | "
                         f"{_pct(summ[l].get('kv_read_vs_dense'))} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Bars: per task, dense and each method's mean score; last group: teacher-forced document agreement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = result["summary"]
    labels = list(summ)
    tasks = list(next(iter(summ.values()))["tasks"]) if summ else []
    groups = tasks + (["agreement\n(teacher-forced)"] if result["documents"] else [])
    series = {"dense": [summ[labels[0]]["tasks"][t]["dense"] for t in tasks] + ([1.0] if result["documents"] else [])}
    for l in labels:
        series[l] = [summ[l]["tasks"][t]["score"] for t in tasks] + ([summ[l]["tf_agreement"]] if result["documents"] else [])
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(groups) * (len(series) / 2 + 0.5)), 3.6))
    w = 0.8 / len(series)
    for i, (name, vals) in enumerate(series.items()):
        bars = ax.bar([g + i * w for g in range(len(groups))], vals, w, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)  # a zero score is a label, not an invisible bar
    ax.set_xticks([g + 0.4 - w / 2 for g in range(len(groups))], groups, rotation=20, ha="right")
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("score / agreement")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def register(app) -> None:
    """Add ``specdec eval``."""
    import typer

    from specdec.friendly import friendly
    from specdec.loading import load_model

    @app.command("eval")
    @friendly
    def eval_cmd(
        methods: str = typer.Option("dustin", "--methods", help="comma-separated methods, options as name:key=value:..."),
        output_json: Path = typer.Option(..., "--output-json", help="where to write the full results as JSON"),
        output_md: Optional[Path] = typer.Option(None, "--output-md", help="also write the Markdown tables here"),
        output_plot: Optional[Path] = typer.Option(None, "--output-plot", help="also write a PNG bar chart here"),
        model: str = typer.Option("smollm2-135m", "--model", help="embedded name, local dir, .gguf file or cached hub id"),
        tasks: str = typer.Option(",".join(TASKS), "--tasks", show_default=False,
                                  help=f"comma-separated synthetic tasks (default: all six: {', '.join(TASKS)})"),
        context: int = typer.Option(1024, "--context-tokens", help="prompt length of every task and document, in tokens"),
        samples: int = typer.Option(2, "--samples", help="samples per task"),
        budget: Optional[int] = typer.Option(None, "--budget", help="KV entries a sparse step sees (default: the method's)"),
        budget_ratio: Optional[float] = typer.Option(None, "--budget-ratio", help="the budget as a share of the context"),
        gamma: int = typer.Option(4, "--gamma", min=1, help="draft length γ"),
        documents: str = typer.Option(",".join(DOCUMENTS[:2]), "--documents", help="documents for agreement ('' = none)"),
        doc_tokens: int = typer.Option(64, "--doc-tokens", min=1, help="tokens generated per document"),
        seed: int = typer.Option(0, "--seed", help="seed of the task generator"),
        device: str = typer.Option("auto", "--device", help="cpu, cuda or auto"),
        adaptive: Optional[bool] = typer.Option(
            None, "--adaptive/--no-adaptive",
            help="adaptive γ and dense fall-back of lossless methods (default: on)"),
    ) -> None:
        """Quality of methods vs dense decoding: RULER-style tasks + agreement and TV distance on documents."""
        import datetime as dt
        import shlex
        import sys

        from specdec.outputs import check_outputs, write_bytes, write_text

        mspec = parse_methods(methods)
        from specdec.loading import unused_budget

        for line in unused_budget(mspec, budget, budget_ratio):  # as generate notes it
            typer.echo(f"note: {line}", err=True)
        tl = [t.strip() for t in tasks.split(",") if t.strip()]
        docs = [d.strip() for d in documents.split(",") if d.strip()]
        check_eval_args(tl, context, samples, budget, budget_ratio, cli=True, gamma=gamma, documents=docs)
        from specdec.data import check_documents

        # an unknown last document failed after every task had run; one named twice was evaluated once
        for line in check_documents(docs):
            typer.echo(f"note: {line}", err=True)
        check_outputs([(output_json, "--output-json"), (output_md, "--output-md"), (output_plot, "--output-plot")])
        m = load_model(model, "float32", device, "reference")
        res = run_eval(m, mspec, tl, context, samples, budget, budget_ratio, gamma,
                       docs, None, doc_tokens, seed,
                       log=lambda s: typer.echo(s, err=True), adaptive=adaptive)
        from specdec.adaptive import ADAPTIVE_DEFAULT

        meta = dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    command=" ".join(shlex.quote(a) for a in ["specdec", *sys.argv[1:]]), model=model, context=context,
                    samples=samples, budget=budget, budget_ratio=budget_ratio, gamma=gamma,
                    adaptive=ADAPTIVE_DEFAULT if adaptive is None else adaptive,
                    task_text=res.pop("task_text", None) or task_source())  # in the settings, not twice
        write_text(output_json, json.dumps(dict(meta=meta, **res), indent=1), "--output-json")
        md = markdown(res, meta)
        if output_md is not None:
            write_text(output_md, md, "--output-md")
        if output_plot is not None:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                png = plot(res, Path(tmp) / "plot.png")
                write_bytes(output_plot, png.read_bytes(), "--output-plot")
        typer.echo(md)
