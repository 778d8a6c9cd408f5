"""specdec: long-context speculative decoding with sparse attention.

Importing specdec changes nothing: models are switched to specdec attention only by
:meth:`SpecdecModel.attach` (called by its constructor) and restored by :meth:`SpecdecModel.detach`.
"""

from specdec.attention.reference import ReferenceBackend
from specdec.cache import KVCache
from specdec.drafters import EarlyExitDrafter, ModelDrafter, SparseSelfDrafter
from specdec.engine import DecodeState, GenerationResult, RunStats, SpeculativeEngine
from specdec.errors import SpecdecError
from specdec.interfaces import (
    AttentionBackend,
    AttentionMetadata,
    Drafter,
    KVSelector,
    ScoreRequest,
    SparsePlan,
    Verifier,
)
from specdec.models import SpecdecModel
from specdec.presets import PipelineConfig, build_engine, method_names, register_method
from specdec.registry import BACKENDS, SELECTORS, ComponentConfig
from specdec.sampling import SamplingConfig
from specdec.selectors.base import BudgetConfig, BudgetSelector
from specdec.selectors.sliding_window import SlidingWindow
from specdec.verifiers import FullVerifier, SparseVerifier

__version__ = "0.1.0"

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "BACKENDS",
    "BudgetConfig",
    "BudgetSelector",
    "ComponentConfig",
    "DecodeState",
    "Drafter",
    "EarlyExitDrafter",
    "FullVerifier",
    "GenerationResult",
    "KVCache",
    "KVSelector",
    "ModelDrafter",
    "PipelineConfig",
    "ReferenceBackend",
    "RunStats",
    "SELECTORS",
    "SamplingConfig",
    "ScoreRequest",
    "SlidingWindow",
    "SparsePlan",
    "SparseSelfDrafter",
    "SparseVerifier",
    "SpecdecError",
    "SpecdecModel",
    "SpeculativeEngine",
    "Verifier",
    "build_engine",
    "method_names",
    "register_method",
]
