"""Host time of one prompt-lookup draft round (`specdec.lookup.LookupDrafter.draft` with ``keep``) at a batch's shape.

The inner drafter is a stub (its draft costs nothing), so what is timed is the lookup's own work per round: the
n-gram index update and look-ups for every sequence, the replaced drafts, and ``keep_copied``'s lookahead mass. The
sequences continue a text file's token stand-ins (character codes; code repeats itself as a tokenised file does).

    python benchmarks/lookup_host_cpu.py --batch 64 --context 8000 --rounds 60    # prints the median ms per round

To compare two checkouts, run it from each (``PYTHONPATH=<checkout>``) one after the other.
"""

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--keep", type=int, default=16)
    ap.add_argument("--file", default=str(Path(__file__).resolve().parents[1] / "specdec" / "engine.py"))
    a = ap.parse_args(argv)
    import torch

    from specdec.interfaces import Drafter
    from specdec.lookup import LookupDrafter

    torch.set_num_threads(1)
    text = Path(a.file).read_text()
    ids = [ord(c) % 5000 for c in text]
    if len(ids) < a.context + 3 * a.rounds:
        raise SystemExit(f"{a.file} has {len(ids)} characters; give a longer --file or a smaller --context/--rounds.")
    B, L = a.batch, a.context

    class Stub(Drafter):  # the inner drafter: free drafts, a lookahead signal to write to
        lookahead = torch.zeros(B, L + 4 * a.rounds)

        def prefill(self, state):
            pass

        def draft(self, state, gamma):
            return torch.zeros(B, gamma, dtype=torch.long), None

        def drafts_replaced(self, state, drafts, mask):
            pass

    look = LookupDrafter(Stub(), keep=a.keep)
    state = SimpleNamespace(tokens=[ids[:L] for _ in range(B)], sampling=SimpleNamespace(greedy=True))
    look.prefill(state)
    times = []
    for r in range(a.rounds):
        for b in range(B):
            state.tokens[b] = state.tokens[b] + ids[L + 3 * r: L + 3 * r + 3]
        t = time.perf_counter()
        look.draft(state, a.gamma)
        times.append(time.perf_counter() - t)
    times.sort()
    print(f"lookup draft round, B {B} x {L}, gamma {a.gamma}, keep {a.keep}: median {1e3 * times[len(times) // 2]:.3f} ms "
          f"(min {1e3 * times[0]:.3f}) over {a.rounds} rounds; matched share {look.stats()['matched_share']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
