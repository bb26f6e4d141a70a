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


def _model(*, x_shape, num_microbatches, sigma, seed, physical_batch_size="auto", metrics=None):
    import tf_tempered
    from tf_tempered._compat import keras
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input(x_shape),
                              keras.layers.Conv2D(3, 3, activation="tanh"),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
    # Keras' own batches on both sides (fit on arrays would otherwise draw Poisson ones).
    tf_tempered.make_private(model, l2_norm_clip=2.0, noise_multiplier=sigma,
                             num_microbatches=num_microbatches, insecure_dp_seed=seed,
                             sampling="shuffle", options=tf_tempered.privacy.EngineOptions(
                                 physical_batch_size=physical_batch_size))
    model.compile(optimizer=_sgd(0.5), loss=_loss(), metrics=metrics)
    return model


def _train(strategy, *, num_microbatches, sigma, seed, data, batch_size=8, epochs=2,
           dataset=False, physical_batch_size="auto", metrics=None):
    import tf_tempered
    from tf_tempered._compat import keras
    x, y = data
    with strategy.scope():
        model = _model(x_shape=x.shape[1:], num_microbatches=num_microbatches, sigma=sigma,
                       seed=seed, physical_batch_size=physical_batch_size, metrics=metrics)
    if dataset:  # global batches, tf.distribute splits (and shards) them
        from tf_tempered._compat import tf
        history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size),
                            epochs=epochs, verbose=0)
    else:
        history = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False,
                            verbose=0)
    return {"weights": [w.tolist() for w in model.get_weights()],
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()}}


def _custom_loop(strategy, data, batch_size=16):
    """The steps of a custom loop with DPGradients inside ``strategy.run`` (σ = 0), one a
    batch of ``batch_size``: the weights, and the first step's DP metrics as replica 0
    reports them."""
    from tf_tempered._compat import keras, tf
    from tf_tempered.privacy import DPGradients
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input(data[0].shape[1:]),
                                  keras.layers.Conv2D(3, 3, activation="tanh"),
                                  keras.layers.Flatten(), keras.layers.Dense(3)])
        optimizer = _sgd(0.5)
    dp = DPGradients(model, _loss(), l2_norm_clip=4.5, noise_multiplier=0.0)
    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(data).batch(batch_size))

    @tf.function
    def step(batch):
        def replica_step(x, y):
            grads, logs = dp(x, y)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return logs
        return strategy.run(replica_step, args=batch)

    logs = [step(batch) for batch in batches][0]
    first = {k: float(strategy.experimental_local_results(v)[0]) for k, v in logs.items()}
    return {"weights": [w.tolist() for w in model.get_weights()], "logs": first}


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
    # Each replica's 4 examples in 2 chunks (EngineOptions.physical_batch_size), a compiled
    # metric updated chunk by chunk: the single-device whole-batch run's weights and logs.
    chunks = dict(num_microbatches=None, sigma=0.0, seed=3, metrics=["accuracy"])
    out["chunks"] = {"one": _train(tf.distribute.get_strategy(), data=data, **chunks),
                     "two": _train(two, data=data, physical_batch_size=2, **chunks)}
    # A tf.data pipeline's batches (sizes unknown while tracing) with "auto" and budgets
    # every batch exceeds: each replica's rows in chunks sized in its step (one example
    # each here), its own number of loop iterations; the single device's whole batches.
    from tf_tempered.privacy.step import chunk_sizes, chunks as chunks_module
    budgets = chunk_sizes.AUTO_CHUNK_BYTES, chunk_sizes.AUTO_MIN_CHUNK
    chunk_sizes.AUTO_CHUNK_BYTES, chunk_sizes.AUTO_MIN_CHUNK = 1, 1
    real_chunked, chunked_static = chunks_module._chunked, []
    chunks_module._chunked = lambda *a, **k: (chunked_static.append(isinstance(a[6], int))
                                              or real_chunked(*a, **k))
    try:
        out["auto_dynamic"] = {
            "one": _train(tf.distribute.get_strategy(), data=data, dataset=True,
                          physical_batch_size=None, **chunks),
            "two": _train(two, data=data, dataset=True, **chunks),
            "chunked_static": chunked_static}
    finally:
        chunk_sizes.AUTO_CHUNK_BYTES, chunk_sizes.AUTO_MIN_CHUNK = budgets
        chunks_module._chunked = real_chunked
    # One example (on the second replica's half of a batch) has a non-finite gradient.
    bad = (data[0].copy(), data[1])
    bad[0][13, 0, 0, 0] = np.inf
    out["nonfinite"] = {"one": _train(tf.distribute.get_strategy(), data=bad, num_microbatches=None,
                                      sigma=0.0, seed=3),
                        "two": _train(two, data=bad, num_microbatches=None, sigma=0.0, seed=3)}
    out["noise"] = {"one": _noise_updates(tf.distribute.get_strategy()),
                    "two": _noise_updates(two)}
    out["refusal"] = _refusal(two, data)
    out["clipnorm_refusal"] = _clipnorm_refusal(two, data)
    out["uneven_refusal"] = _uneven_refusal(two)
    out["one_device_refusals"] = _one_device_refusals(two, data)
    out["poisson"] = {"one": poisson_reference(2), "two": poisson_distributed(two)}
    out["dp_gradients"] = {"one": _custom_loop(tf.distribute.get_strategy(), data),
                           "two": _custom_loop(two, data)}
    # 9 rows in batches of 8: the last one's single row leaves the second replica none.
    nine = (data[0][:9], data[1][:9])
    try:
        _custom_loop(two, nine, batch_size=8)
    except Exception as e:  # pylint: disable=broad-except  (the message is what is tested)
        out["dp_gradients_empty_replica"] = str(e)
    return out


def worker(index, ports):
    """One worker of a MultiWorkerMirroredStrategy on 127.0.0.1 (one CPU replica each)."""
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports.split(",")]},
        "task": {"type": "worker", "index": int(index)}})
    from tf_tempered._compat import KERAS_MAJOR, tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(32, 5, 5, 2)).astype("float32"), rng.integers(0, 3, 32))
    if KERAS_MAJOR == 3:  # Keras 3's fit fails under MWMS (upstream): a custom loop
        with strategy.scope():
            model = _model(x_shape=data[0].shape[1:], num_microbatches=4, sigma=0.0, seed=3)
        dataset = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices(data).batch(8))
        microbatches = custom_loop(strategy, model, dataset, epochs=2)
    else:
        microbatches = _train(strategy, num_microbatches=4, sigma=0.0, seed=3, data=data,
                              dataset=True)
    return {"replicas": strategy.num_replicas_in_sync, "microbatches": microbatches,
            "poisson": poisson_distributed(strategy)}


def custom_loop(strategy, model, dataset, *, epochs, steps_per_epoch=None):
    """The engine's train step run by strategy.run on each global batch (no Model.fit).

    One iterator for the whole run; the history holds each epoch's last logs.
    """
    from tf_tempered._compat import tf
    if hasattr(model.optimizer, "build"):  # Keras 3 (Keras 2 legacy ones build lazily)
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)

    @tf.function
    def step(batch):
        logs = strategy.run(model.train_step, args=(batch,))
        return {k: strategy.reduce("MEAN", v, axis=None) for k, v in logs.items()}

    history = {}
    iterator = iter(dataset)
    for _ in range(epochs):
        model.reset_metrics()
        if steps_per_epoch is None:
            for batch in dataset:
                logs = step(batch)
        else:
            for _ in range(steps_per_epoch):
                logs = step(next(iterator))
        for key, value in logs.items():
            if key == "loss" or key.startswith("dp_"):
                history.setdefault(key, []).append(float(value))
    return {"weights": [w.tolist() for w in model.get_weights()], "history": history}


POISSON = dict(expected_batch_size=6, steps=4, max_batch_size=10, insecure_dp_seed=5)


def _poisson_model(strategy):
    import tf_tempered
    from tf_tempered._compat import keras
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh"),
                                  keras.layers.Dense(3)])
        tf_tempered.make_private(model, l2_norm_clip=1.0, noise_multiplier=0.0)
        model.compile(optimizer=_sgd(0.5), loss=_loss())
    return model


def _poisson_data():
    rng = np.random.default_rng(2)
    return rng.normal(size=(40, 5)).astype("float32"), rng.integers(0, 3, 40)


def poisson_reference(num_shards):
    """Single device on the replicas' Poisson batches concatenated (one global batch)."""
    from tf_tempered._compat import KERAS_MAJOR, tf
    from tf_tempered.privacy import poisson_batches
    x, y = _poisson_data()
    shards = [poisson_batches(x, y, num_shards=num_shards, shard_index=r, **POISSON)
              for r in range(num_shards)]

    def concat(*elements):
        xs, ys, infos = zip(*elements)
        return (tf.concat(xs, 0), tf.concat(ys, 0),
                {"mask": tf.concat([i["mask"] for i in infos], 0),
                 "expected_batch_size": infos[0]["expected_batch_size"]})

    model = _poisson_model(tf.distribute.get_strategy())
    # The first pass of each shard's sampler, as poisson_distributed trains on.
    history = model.fit(tf.data.Dataset.zip(tuple(shards)).map(concat), verbose=0)
    return {"weights": [w.tolist() for w in model.get_weights()],
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()}}


def poisson_distributed(strategy):
    """One pass of distributed_poisson_batches, in a custom loop with one iterator.

    Not Model.fit: under a strategy Keras 3's fit first draws batches from an extra
    iterator to build the model (_maybe_symbolic_build), and with prefetching how
    many of the sampler's passes that consumes varies; those draws are discarded
    (no privacy cost) but the trained pass is then not known to the reference.
    """
    from tf_tempered.privacy import distributed_poisson_batches
    x, y = _poisson_data()
    model = _poisson_model(strategy)
    data = distributed_poisson_batches(strategy, x, y, **POISSON)
    return custom_loop(strategy, model, data, epochs=1, steps_per_epoch=POISSON["steps"])

def _noise_updates(strategy, *, steps=6, batch=8, sigma=1.5, clip=0.5, lr=0.25):
    """Weight updates of SGD on zero gradients (zero input, no bias): pure DP noise."""
    import tf_tempered
    from tf_tempered._compat import keras
    with strategy.scope():
        model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(50, use_bias=False)])
        tf_tempered.make_private(model, l2_norm_clip=clip, noise_multiplier=sigma,
                                 sampling="shuffle")  # fixed batches: normaliser = batch
        model.compile(optimizer=_sgd(lr), loss=_loss())
    before = model.get_weights()[0]
    model.fit(np.zeros((steps * batch, 40), np.float32), np.zeros(steps * batch),
              batch_size=batch, shuffle=False, verbose=0)
    delta = model.get_weights()[0] - before
    return {"std": float(delta.std()), "count": int(delta.size), "steps": steps,
            "expected_per_step": lr * sigma * clip / batch}


def _uneven_refusal(strategy):
    """Replicas given 4 and 2 rows with num_microbatches=2: microbatches of 4 and 2 rows,
    not the global batch's two of 3 (one would straddle the replicas): refused."""
    from tf_tempered._compat import tf
    with strategy.scope():
        model = _model(x_shape=(5, 5, 2), num_microbatches=2, sigma=0.0, seed=None)

    def per_worker(context):
        del context
        rows = lambda n: tf.data.Dataset.from_tensors((tf.ones([n, 5, 5, 2]),
                                                       tf.zeros([n], tf.int64)))
        return rows(4).concatenate(rows(2))  # element i goes to replica i

    data = strategy.distribute_datasets_from_function(per_worker)
    try:
        custom_loop(strategy, model, data, epochs=1, steps_per_epoch=1)
    except tf.errors.InvalidArgumentError as e:
        return e.message
    return None


def _clipnorm_refusal(strategy, data):
    """Keras 3 clips each replica's gradient before the all-reduce: refused (Keras 2: None)."""
    from tf_tempered._compat import KERAS_MAJOR, keras
    if KERAS_MAJOR == 2:
        return None
    x, y = data
    with strategy.scope():
        model = _model(x_shape=x.shape[1:], num_microbatches=None, sigma=0.0, seed=None)
        model.compile(optimizer=keras.optimizers.SGD(0.5, clipnorm=1.0), loss=_loss())
    try:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    except ValueError as e:
        return str(e)
    return "not refused"


def _one_device_refusals(strategy, data):
    """What would give every replica the same rows (Keras 3's train_on_batch), or batches
    drawn for one device (poisson_batches): refused, their messages."""
    from tf_tempered._compat import KERAS_MAJOR
    from tf_tempered.privacy import poisson_batches
    x, y = data
    with strategy.scope():
        model = _model(x_shape=x.shape[1:], num_microbatches=None, sigma=1.0, seed=None)
        model.compile(optimizer=_sgd(0.5), loss=_loss())
    before = [w.copy() for w in model.get_weights()]
    messages = {}
    try:
        model.fit(poisson_batches(x, y, expected_batch_size=8, steps=2), epochs=1, verbose=0)
    except ValueError as e:
        messages["poisson_batches"] = str(e)
    if KERAS_MAJOR == 3:
        try:
            model.train_on_batch(x[:8], y[:8])
        except NotImplementedError as e:
            messages["train_on_batch"] = str(e)
    import tensorflow as tf
    info = {"mask": np.ones(8, np.float32), "expected_batch_size": np.float32(8)}
    try:  # Poisson batches built by hand
        model.fit(tf.data.Dataset.from_tensors((x[:8], y[:8], info)), epochs=1, verbose=0)
    except ValueError as e:
        messages["hand_built_poisson"] = str(e)
    if KERAS_MAJOR == 2:
        from tf_tempered.privacy import DPGradients
        dp = DPGradients(model, _loss(), l2_norm_clip=1.0, noise_multiplier=1.0)
        try:  # outside strategy.run
            dp(x[:8], y[:8])
        except ValueError as e:
            messages["cross_replica"] = str(e)
    messages["untouched"] = all((a == b).all() for a, b in zip(before, model.get_weights()))
    return messages


def _refusal(strategy, data):
    try:
        _train(strategy, num_microbatches=3, sigma=0.0, seed=None, data=data, batch_size=6,
               epochs=1)
    except ValueError as e:
        return str(e)
    return None


def killed_run(backup_dir, kill_epoch, kill_batch):
    """The train script's run with --backup_dir, SIGKILLed after a given step (mid-epoch)."""
    import signal
    from tf_tempered._compat import keras
    from tf_tempered.experiments import common, train

    class Kill(keras.callbacks.Callback):
        epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):  # after PrivacyBudget's
            if self.epoch == int(kill_epoch) and batch == int(kill_batch):
                os.kill(os.getpid(), signal.SIGKILL)

    train.run_training(common.TrainConfig(**KILLED_CONFIG), verbose=2, backup_dir=backup_dir,
                       extra_callbacks=lambda model, dataset: [Kill()])
    return {"killed": False}


KILLED_CONFIG = dict(dataset="digits", epochs=4, batch_size=128, learning_rate=0.5,
                     save_model=False)


if __name__ == "__main__":
    result = {"mirrored": mirrored, "worker": worker,
              "killed_run": killed_run}[sys.argv[1]](*sys.argv[2:])
    print("RESULT " + json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of the strategy threads
