# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""examples/lora_finetune_dp.py: pre-training, then DP LoRA fine-tuning (Keras 3 only)."""

import pathlib
import sys

import pytest

from tf_tempered._compat import KERAS_MAJOR

pytestmark = pytest.mark.skipif(KERAS_MAJOR != 3, reason="LoRA (enable_lora) is Keras 3 only")

REPO = pathlib.Path(__file__).resolve().parents[1]


def _example():
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import lora_finetune_dp  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.remove(str(REPO / "examples"))
    return lora_finetune_dp


# The whole example (12 s): its engine parts are tested by test_layer_grads_lora.py and the
# conformance cases; tutorials/06 runs the same steps with --extended too.
@pytest.mark.extended
def test_lora_finetune_prints_accuracy_and_epsilon(capsys):
    from tf_tempered.privacy.accounting import compute_epsilon  # pylint: disable=import-outside-toplevel
    example = _example()
    ids, labels = example.make_corpus(200, example.PRIVATE, vocab_size=300, seq_len=16)
    assert ids.dtype == "int32" and ids.max() < 300 and set(labels) == {0, 1}
    before, after, epsilon = example.main(
        ["--num_public=512", "--pretrain_epochs=1", "--num_train=512", "--num_test=128",
         "--vocab_size=300", "--seq_len=16", "--epochs=1", "--batch_size=64"])
    assert 0.0 <= before <= 1.0 and 0.0 <= after <= 1.0
    assert epsilon == compute_epsilon(num_examples=512, batch_size=64, noise_multiplier=1.0,
                                      steps=8, delta=1e-5)
    out = capsys.readouterr().out
    assert "handlers: dense, lora_dense, lora_einsum_dense" in out
    assert "after DP LoRA fine-tuning" in out and "epsilon: " in out
