"""Policies and tokenizers: what samples tokens, and what turns text into them.

Below both the agents and the gateway (each calls a :class:`Policy`; neither knows which engine
serves it):

* :class:`Policy`, :class:`StreamingPolicy` — token ids in, sampled ids and their log-probs out
  (:class:`PolicyOutput`); sampling parameters in SGLang's names.
* :class:`SGLangPolicy` — SGLang's ``/generate``; :class:`VLLMPolicy` — vLLM's token-in/token-out
  route (``/inference/v1/generate``) or ``/v1/completions`` with prompt ids; :func:`open_policy`
  picks one by name (``SWE_POLICY_API``).
* :class:`Tokenizer` — the protocol any Hugging Face tokenizer fits; :class:`ByteTokenizer`
  (one id per byte, no files) and :class:`RawTextTokenizer` (a Hugging Face tokenizer, whole
  vocabulary valid). A checkpoint's chat template lives in :mod:`trio_swe.models`.
"""

from __future__ import annotations

from .._errors import PolicyError
from ._open import POLICY_APIS, SamplingOptions, open_policy
from ._sglang import SGLangPolicy
from ._tokenizer import ByteTokenizer, RawTextTokenizer, Tokenizer, vocabulary_size
from ._types import Policy, PolicyOutput, PolicyStatistics, StreamingPolicy
from ._vllm import VLLMPolicy

__all__ = [
    "POLICY_APIS",
    "ByteTokenizer",
    "Policy",
    "PolicyError",
    "PolicyOutput",
    "PolicyStatistics",
    "RawTextTokenizer",
    "SGLangPolicy",
    "SamplingOptions",
    "StreamingPolicy",
    "Tokenizer",
    "VLLMPolicy",
    "open_policy",
    "vocabulary_size",
]
