# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""One DP-SGD step (noise 0) of a named model, run in the Keras this process selected.

Used by tests/test_keras_versions.py, which runs it once on Keras 3 and once on
Keras 2 (TF_USE_LEGACY_KERAS=1) in fresh processes, on the same weights and batch:

    python tests/one_dp_step.py WORK_DIR engine|tf_privacy MODEL [MODEL ...]

for each MODEL reads WORK_DIR/MODEL/batch.npz (x, y) and, if present,
WORK_DIR/MODEL/weights.npz (the initial weights in get_weights() order; written
by the first run), and writes WORK_DIR/MODEL/update-<keras major>-<path>.npz:
weights after − before.
"""

import os
import sys

import numpy as np

import tf_tempered
from tf_tempered._compat import KERAS_MAJOR, keras, require_tensorflow_privacy
from tf_tempered.layers import TemperedSigmoid

CLIP = 0.05


def learnable_tempered_model():
    return keras.Sequential([
        keras.Input((10, 10, 1)),
        keras.layers.Conv2D(4, 3, strides=2, padding="same"),
        TemperedSigmoid(learnable=True),
        keras.layers.Flatten(),
        keras.layers.Dense(8, activation=TemperedSigmoid(learnable=True)),
        keras.layers.Dense(10),
    ])


MODELS = {
    "mnist_cnn": lambda: tf_tempered.mnist_cnn("tanh"),
    "cifar10_cnn": lambda: tf_tempered.cifar10_cnn("tanh"),
    "learnable_tempered": learnable_tempered_model,
}


def main(work_dir, path, *model_names):
    for model_name in model_names:
        one_step(model_name, os.path.join(work_dir, model_name), path)


def one_step(model_name, work_dir, path):
    keras.utils.set_random_seed(0)
    model = MODELS[model_name]()
    batch = np.load(os.path.join(work_dir, "batch.npz"))
    model(batch["x"][:1])  # Keras 3 builds a Dense's activation layer at its first call
    weights_file = os.path.join(work_dir, "weights.npz")
    if os.path.exists(weights_file):
        stored = np.load(weights_file)
        model.set_weights([stored[f"w{i}"] for i in range(len(stored.files))])
    else:
        np.savez(weights_file, **{f"w{i}": w for i, w in enumerate(model.get_weights())})
    settings = dict(l2_norm_clip=CLIP, noise_multiplier=0.0, learning_rate=1.0)
    if path == "tf_privacy":
        optimizer = require_tensorflow_privacy("The reference").DPKerasSGDOptimizer(**settings)
    else:
        tf_tempered.make_private(model)
        optimizer = tf_tempered.DPKerasSGDOptimizer(**settings)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none"))
    before = model.get_weights()
    model.fit(batch["x"], batch["y"], batch_size=len(batch["x"]), shuffle=False, verbose=0)
    np.savez(os.path.join(work_dir, f"update-{KERAS_MAJOR}-{path}.npz"),
             **{f"w{i}": a - b for i, (a, b) in enumerate(zip(model.get_weights(), before))})


if __name__ == "__main__":
    main(*sys.argv[1:])
