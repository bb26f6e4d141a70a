# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""examples/: each script runs as a user would run it and prints what it promises."""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

# The examples are written for the default Keras 3; the Keras 2 suite holds the engine to the
# same references (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_digits_dp_prints_accuracy_and_epsilon():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    result = subprocess.run([sys.executable, str(REPO / "examples" / "digits_dp.py"),
                             "--epochs", "1"], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", result.stdout).group(1))
    assert 0.1 < accuracy <= 1.0  # 10 classes: better than chance after one DP epoch
    assert re.search(r"epsilon: [0-9.]+ at delta=1e-05", result.stdout)
    assert re.search(r"clipped fraction \(last epoch\): [0-9.]+", result.stdout)


def test_text_classifier_trains_with_dp_on_generated_reviews():
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import text_classifier_dp  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.remove(str(REPO / "examples"))
    from tf_tempered.privacy.accounting import compute_epsilon  # pylint: disable=import-outside-toplevel
    ids, labels = text_classifier_dp.make_reviews(500, vocab_size=300, seq_len=16)
    again, _ = text_classifier_dp.make_reviews(500, vocab_size=300, seq_len=16)
    np.testing.assert_array_equal(ids, again)  # generated, deterministic, no download
    assert ids.dtype == np.int32 and ids.max() < 300 and 0.3 < labels.mean() < 0.7
    accuracy, epsilon = text_classifier_dp.main(
        ["--num_train=512", "--num_test=128", "--vocab_size=300", "--seq_len=16", "--epochs=1",
         "--batch_size=64"])
    assert 0.0 <= accuracy <= 1.0
    assert epsilon == compute_epsilon(num_examples=512, batch_size=64, noise_multiplier=1.0,
                                      steps=8, delta=1e-5)


@pytest.mark.extended  # the rnn_rows handler: tests/test_conformance_recurrent.py
def test_text_classifier_bilstm_takes_the_recurrent_rows_handler():
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import text_classifier_dp  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.remove(str(REPO / "examples"))
    from tf_tempered import keras_bridge
    from tf_tempered.privacy import layer_grads  # pylint: disable=import-outside-toplevel
    model = text_classifier_dp.lstm_classifier(vocab_size=300, seq_len=16)
    lstms = [layer for layer in keras_bridge.flatten_layers(model)
             if type(layer).__name__ == "LSTM"]
    assert len(lstms) == 2 and {layer_grads.lookup(l)[0].name for l in lstms} == {"rnn_rows"}
    accuracy, epsilon = text_classifier_dp.main(
        ["--architecture=bilstm", "--num_train=512", "--num_test=128", "--vocab_size=300",
         "--seq_len=16", "--epochs=1", "--batch_size=64"])
    assert 0.0 <= accuracy <= 1.0 and epsilon > 0


def test_custom_loop_trains_with_dp_gradients_on_poisson_batches():
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import custom_loop_dp  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.remove(str(REPO / "examples"))
    from tf_tempered.privacy.accounting import compute_epsilon  # pylint: disable=import-outside-toplevel
    accuracy, epsilon = custom_loop_dp.main(["--epochs=1"])
    assert 0.1 < accuracy <= 1.0  # 10 classes: better than chance after one DP epoch
    # digits: 1438 training examples, batch 64: round(1438 / 64) = 22 Poisson steps.
    assert epsilon == compute_epsilon(num_examples=1438, batch_size=64, noise_multiplier=1.1,
                                      steps=22, delta=1e-5)
