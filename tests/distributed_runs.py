# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Runs for tests/test_distribute.py, each in a fresh process (logical devices, TF_CONFIG).

``python tests/distributed_runs.py mirrored`` prints one ``RESULT <json>`` line with,
for each configuration, the weights and DP history of a plain single-device run and
of a 2-replica MirroredStrategy run on the same global batches.
"""

import json
import os
import sys

import numpy as np


def _setup_two_cpus():
    from tf_tempered._compat import tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


def _sgd(lr):
    from tf_tempered._compat import KERAS_MAJOR, keras
    return keras.optimizers.SGD(lr) if KERAS_MAJOR == 3 else keras.optimizers.legacy.SGD(lr)


def _loss():
    from tf_tempered._compat import keras
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def _train(strategy, *, num_microbatches, sigma, seed, data, batch_size=8, epochs=2):
    import tf_tempered
    from tf_tempered._compat import keras
    x, y = data
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input(x.shape[1:]),
                                  keras.layers.Conv2D(3, 3, activation="tanh"),
                                  keras.layers.Flatten(), keras.layers.Dense(3)])
        tf_tempered.make_private(model, l2_norm_clip=2.0, noise_multiplier=sigma,
                                 num_microbatches=num_microbatches, insecure_dp_seed=seed)
        model.compile(optimizer=_sgd(0.5), loss=_loss())
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return {"weights": [w.tolist() for w in model.get_weights()],
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()}}


def mirrored():
    """Exactness: plain vs 2 replicas for several settings; then the noise statistics."""
    _setup_two_cpus()
    from tf_tempered._compat import tf
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(32, 5, 5, 2)).astype("float32"), rng.integers(0, 3, 32))
    two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    out = {}
    for name, kwargs in {"per_example": dict(num_microbatches=None, sigma=0.0, seed=3),
                         "microbatches": dict(num_microbatches=4, sigma=0.0, seed=3),
                         "noisy_seeded": dict(num_microbatches=None, sigma=1.3, seed=3)}.items():
        out[name] = {"one": _train(tf.distribute.get_strategy(), data=data, **kwargs),
                     "two": _train(two, data=data, **kwargs)}
    out["noise"] = {"one": _noise_updates(tf.distribute.get_strategy()),
                    "two": _noise_updates(two)}
    out["refusal"] = _refusal(two, data)
    return out


def _noise_updates(strategy, *, steps=6, batch=8, sigma=1.5, clip=0.5, lr=0.25):
    """Weight updates of SGD on zero gradients (zero input, no bias): pure DP noise."""
    import tf_tempered
    from tf_tempered._compat import keras
    with strategy.scope():
        model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(50, use_bias=False)])
        tf_tempered.make_private(model, l2_norm_clip=clip, noise_multiplier=sigma)
        model.compile(optimizer=_sgd(lr), loss=_loss())
    before = model.get_weights()[0]
    model.fit(np.zeros((steps * batch, 40), np.float32), np.zeros(steps * batch),
              batch_size=batch, shuffle=False, verbose=0)
    delta = model.get_weights()[0] - before
    return {"std": float(delta.std()), "count": int(delta.size), "steps": steps,
            "expected_per_step": lr * sigma * clip / batch}


def _refusal(strategy, data):
    try:
        _train(strategy, num_microbatches=3, sigma=0.0, seed=None, data=data, batch_size=6,
               epochs=1)
    except ValueError as e:
        return str(e)
    return None


if __name__ == "__main__":
    result = {"mirrored": mirrored}[sys.argv[1]]()
    print("RESULT " + json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of the strategy threads
