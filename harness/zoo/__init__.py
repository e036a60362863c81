"""A zoo of tiny real models (nanoGPT, Hugging Face GPT-2, BERT, Llama, T5, an LSTM, a GroupNorm
conv net, LoRA, activation checkpointing, a routed MLP, padded batches) with the exact noise scale
of each at fixed weights, for testing the probe (tests/probes/test_zoo.py)."""

from .cases import BUILDERS, ZooCase
from .truth import Truth, brute_force_grads, func_grads, trainable, window_b_simple

__all__ = [
    "BUILDERS",
    "Truth",
    "ZooCase",
    "brute_force_grads",
    "func_grads",
    "trainable",
    "window_b_simple",
]
