# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""DP-SGD under tf.distribute: R replicas give the single-device update (distribute.py).

Logical devices and TF_CONFIG must be set before TensorFlow starts, so the runs are
in fresh processes (tests/distributed_runs.py), each bounded in time.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from once_per_session import once_per_session

from tf_tempered._compat import KERAS_MAJOR

RUNS = pathlib.Path(__file__).with_name("distributed_runs.py")
ROOT = RUNS.parents[1]


def _run(*args, timeout=240):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, str(RUNS), *args], capture_output=True, text=True,
                            timeout=timeout, env=env)
    lines = [l for l in result.stdout.splitlines() if l.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


# Whole train-script runs (20-35 s each): in the Keras 2 suite by default, on Keras 3 with
# --extended (the Keras 3 suite checks the replicas' update and accounting in-process above and
# below; its time budget is the tighter one).
_KERAS2_SUITE = pytest.mark.extended if KERAS_MAJOR == 3 else (lambda test: test)


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    return once_per_session(tmp_path_factory, "distribute_mirrored", lambda: _run("mirrored"))


def _assert_same_run(one, two):
    for a, b in zip(one["weights"], two["weights"]):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-6 * max(1.0, np.abs(a).max()))
    # fit logs epsilon and delta; a custom loop (the Poisson shards, Keras 3's workers) does
    # not: the training values are compared, the accounting is tested on its own.
    accounting = {"epsilon", "delta"}
    assert set(one["history"]) - accounting == set(two["history"]) - accounting
    for key, values in one["history"].items():
        if key in two["history"]:
            np.testing.assert_allclose(two["history"][key], values, rtol=2e-5, atol=1e-6,
                                       err_msg=key)


@pytest.mark.parametrize("config", ["per_example", "microbatches", "noisy_seeded"])
def test_two_replicas_give_the_single_device_run(mirrored, config):
    # Same global batches, noise 0 (or the same insecure seed: replica 0 draws the one
    # N(0, σ²C²) of the step at the counter a single device would use): the same weights
    # and the same global DP metrics (clipped fraction, gradient norm, loss).
    run = mirrored[config]
    _assert_same_run(run["one"], run["two"])
    assert any(0 < f < 1 for f in run["two"]["history"]["dp_clipped_fraction"])  # clipping acts
    changed = max(np.abs(np.asarray(a) - np.asarray(b)).max()
                  for a, b in zip(run["one"]["weights"], mirrored["per_example"]["one"]["weights"]))
    assert (changed > 1e-3) == (config != "per_example")  # the configurations differ


def test_two_replicas_in_chunks_give_the_single_device_run(mirrored):
    # EngineOptions(physical_batch_size=2): each replica's half of a batch of 8 in two
    # chunks, with its compiled metrics updated chunk by chunk inside the replica's loop.
    run = mirrored["chunks"]
    _assert_same_run(run["one"], run["two"])
    assert "accuracy" in run["two"]["history"]


def test_two_replicas_in_auto_chunks_of_unknown_size_give_the_single_device_run(mirrored):
    # "auto" on a tf.data pipeline's batches (unknown sizes), budgets every batch exceeds:
    # each replica runs its rows in chunks sized in its step, the one device whole.
    run = mirrored["auto_dynamic"]
    assert run["chunked_static"] and not any(run["chunked_static"])  # sizes from the step
    _assert_same_run(run["one"], run["two"])
    assert "accuracy" in run["two"]["history"]


def test_dp_gradients_under_strategy_run_gives_the_single_device_update(mirrored):
    # A custom loop (DPGradients inside strategy.run, a Keras optimizer applying the
    # gradients in the replica function): the replicas' parts are summed once, as in fit.
    run = mirrored["dp_gradients"]
    for a, b in zip(run["one"]["weights"], run["two"]["weights"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert 0 < run["one"]["logs"]["dp_clipped_fraction"] < 1  # clipping acts
    for name, value in run["one"]["logs"].items():  # replica 0 reports the global metrics
        np.testing.assert_allclose(run["two"]["logs"][name], value, rtol=1e-5, atol=1e-6)


def test_nonfinite_count_is_global(mirrored):
    # One example with an infinite input: dropped (zero contribution) once per epoch,
    # counted once, not once per replica nor 1/R times.
    run = mirrored["nonfinite"]
    assert run["one"]["history"]["dp_nonfinite"] == [1.0, 1.0]
    _assert_same_run(run["one"], run["two"])


@pytest.mark.parametrize("replicas", ["one", "two"])
def test_noise_std_is_sigma_clip_once_per_step(mirrored, replicas):
    # Zero gradients: each SGD step moves every weight by -lr·Z/B, Z ~ N(0, (σC)²) with a
    # secret key. Over `steps` steps the std is √steps·lr·σ·C/B. Per-replica full noise
    # would give √2 times that, noise averaged over replicas 1/√2 times.
    noise = mirrored["noise"][replicas]
    expected = np.sqrt(noise["steps"]) * noise["expected_per_step"]
    # std estimate from n = 2000 normals: relative standard error 1/√(2n) = 1.6%.
    assert abs(noise["std"] / expected - 1) < 0.08, (noise, expected)


def test_an_uneven_split_with_microbatches_is_refused(mirrored):
    message = mirrored["uneven_refusal"]
    assert message is not None and "straddles two replicas" in message
    assert "drop_remainder=True" in message


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="Keras 2 clips after the all-reduce: allowed")
def test_keras3_optimizer_clipnorm_is_refused_on_two_replicas(mirrored):
    message = mirrored["clipnorm_refusal"]
    assert "clipnorm=1.0" in message and "Drop clipnorm" in message


def test_what_would_give_replicas_one_devices_batches_is_refused(mirrored):
    # Keras 3's train_on_batch gave each replica the whole batch: every example summed
    # twice against noise added once (measured: half the noise std). poisson_batches
    # failed deep in tf.distribute (an IndexError).
    messages = mirrored["one_device_refusals"]
    assert messages["untouched"]
    assert "Fix: tf_tempered.privacy.distributed_poisson_batches(" in messages["poisson_batches"]
    if KERAS_MAJOR == 3:
        assert "every replica the whole batch" in messages["train_on_batch"]
        assert "Fix: train with fit" in messages["train_on_batch"]
    # Before: an IndexError inside tf.distribute (hand-built Poisson batches), and on Keras 2
    # a SyncOnReadVariable error inside the DP metrics (DPGradients outside strategy.run).
    assert "distribute_datasets_from_function" in messages["hand_built_poisson"]
    if KERAS_MAJOR == 2:
        assert "Fix: call it inside the replica function" in messages["cross_replica"]


# Before: a ZeroDivisionError while tracing the step of the replica that got no rows.
def test_a_custom_loop_step_that_leaves_a_replica_without_rows_is_refused(mirrored):
    message = mirrored.get("dp_gradients_empty_replica", "")
    assert "batch of 0 rows" in message and "drop_remainder=True" in message


def test_microbatches_that_would_straddle_replicas_are_refused(mirrored):
    message = mirrored["refusal"]
    assert message is not None and "num_microbatches=3" in message
    assert "straddle" in message and "multiple of 2" in message


def test_poisson_shards_on_two_replicas_give_the_single_device_run(mirrored):
    # Replica r samples x[r::2] with the same q (distributed_poisson_batches): the step
    # equals one device on the two samples concatenated, normalised by the global q·N.
    run = mirrored["poisson"]
    _assert_same_run(run["one"], run["two"])


def _free_ports(count):
    import socket  # pylint: disable=g-import-not-at-top
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_multi_worker_mirrored_strategy_gives_the_single_device_run():
    # Two worker processes on 127.0.0.1 (one CPU replica each, TF_CONFIG), bounded in time.
    # Keras 2: Model.fit on shuffled batches; Poisson shards in a custom loop (see
    # distributed_runs.poisson_distributed). Keras 3's Model.fit fails
    # under MultiWorkerMirroredStrategy before any train step, for plain models too
    # (_maybe_symbolic_build reduces the tuple batch: "Attempt to convert a value
    # (PerReplica...)"; keras-team/keras#20585, tensorflow/tensorflow#72388), so on
    # Keras 3 the workers run the engine's train step in a custom loop
    # (strategy.run(model.train_step, ...)) on the same global batches.
    sys.path.insert(0, str(RUNS.parent))
    import distributed_runs  # pylint: disable=g-import-not-at-top
    from tf_tempered._compat import tf
    ports = ",".join(map(str, _free_ports(2)))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TF_CONFIG", None)
    workers = [subprocess.Popen([sys.executable, str(RUNS), "worker", str(i), ports],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env) for i in range(2)]
    try:
        outputs = [w.communicate(timeout=150) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.communicate()
    results = []
    for w, (out, err) in zip(workers, outputs):
        lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
        assert w.returncode == 0 and lines, err[-3000:]
        results.append(json.loads(lines[-1][len("RESULT "):]))
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(32, 5, 5, 2)).astype("float32"), rng.integers(0, 3, 32))
    one = distributed_runs._train(tf.distribute.get_strategy(), num_microbatches=4,
                                  sigma=0.0, seed=3, data=data)
    poisson_one = distributed_runs.poisson_reference(2)
    for result in results:
        assert result["replicas"] == 2
        _assert_same_run(one, result["microbatches"])
        _assert_same_run(poisson_one, result["poisson"])


def _train_cli(*flags, timeout=240):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tf_tempered.experiments.train", *flags],
                          capture_output=True, text=True, timeout=timeout, env=env)


@_KERAS2_SUITE
def test_killed_run_resumes_and_counts_every_step(tmp_path):
    # A run of 4 epochs of 11 Poisson steps (digits: N=1438, q=128/N) is SIGKILLed after
    # step 6 of epoch 2; started again with the same --backup_dir it resumes after
    # epoch 1 (BackupAndRestore: weights, optimizer state, epoch) and trains epochs
    # 2-4. The optimizer took 44 steps; 11 + 6 + 33 = 50 DP steps were taken (the 6
    # killed ones were redone and count again), and ε is that of 50 steps.
    from tf_tempered.privacy import accounting
    backup, out = tmp_path / "backup", tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    killed = subprocess.run([sys.executable, str(RUNS), "killed_run", str(backup), "1", "5"],
                            capture_output=True, text=True, timeout=240, env=env)
    assert killed.returncode == -9, killed.stderr[-3000:]  # SIGKILL, mid-run
    ledger = json.loads((backup / "privacy_ledger.json").read_text())
    assert ledger["steps"] == 17 and len(ledger["epsilons"]) == 1
    resumed = _train_cli("--dataset=digits", "--epochs=4", "--batch_size=128",
                         "--learning_rate=0.5", "--nosave_model", f"--backup_dir={backup}",
                         f"--output_dir={out}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps_trained"] == 44 and metrics["steps"] == 50
    assert [r["epoch"] for r in metrics["history"]] == [2, 3, 4]  # resumed after epoch 1
    assert [r["steps"] for r in metrics["history"]] == [28, 39, 50]
    expected = accounting.compute_epsilon(num_examples=1438, batch_size=128,
                                          noise_multiplier=1.1, steps=50, delta=1e-5,
                                          sampling="poisson")
    assert metrics["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert f"ε = {expected:.4g}" in resumed.stdout
    # 44 steps would have been less: the redone steps are not forgotten.
    assert expected > accounting.compute_epsilon(num_examples=1438, batch_size=128,
                                                 noise_multiplier=1.1, steps=44, delta=1e-5,
                                                 sampling="poisson")


@_KERAS2_SUITE
def test_train_script_on_two_replicas_reports_the_single_device_accounting(tmp_path):
    result = _train_cli("--dataset=digits", "--epochs=2", "--batch_size=128",
                        "--learning_rate=0.5", "--nosave_model", "--strategy=mirrored",
                        "--cpu_devices=2", f"--output_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and metrics["steps"] == metrics["steps_trained"] == 22
    from tf_tempered.privacy import accounting
    expected = accounting.compute_epsilon(num_examples=1438, batch_size=128,
                                          noise_multiplier=1.1, steps=22, delta=1e-5,
                                          sampling="poisson")
    assert metrics["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert metrics["test_accuracy"] > 0.3  # it learns (10 classes: chance is 0.1)
    assert "Test accuracy" in result.stdout and f"ε = {expected:.4g}" in result.stdout


def test_privacy_budget_ledger_adds_up_across_fits(tmp_path):
    # Two fits of 2 epochs x 3 steps with one ledger: 12 steps, and the ε of 12 steps
    # (the second fit does not start the count over). A corrupt ledger is refused.
    from tf_tempered import callbacks, make_private
    from tf_tempered._compat import keras
    from tf_tempered.privacy import accounting
    sys.path.insert(0, str(RUNS.parent))
    import distributed_runs  # pylint: disable=g-import-not-at-top
    model = make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=distributed_runs._sgd(0.1), loss=distributed_runs._loss())
    x, y = np.zeros((24, 4), np.float32), np.zeros(24)
    ledger = tmp_path / "ledger.json"
    kwargs = dict(target_epsilon=100.0, delta=1e-5, num_examples=24, batch_size=8,
                  ledger=ledger)
    budget = callbacks.PrivacyBudget(**kwargs)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[budget])
    assert json.loads(ledger.read_text())["steps"] == 6
    budget = callbacks.PrivacyBudget(**kwargs)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[budget]).history
    assert budget.steps_taken == 12 and history["dp_steps"] == [9, 12]
    expected = [accounting.compute_epsilon(num_examples=24, batch_size=8, noise_multiplier=1.0,
                                           steps=s, delta=1e-5) for s in (9, 12)]
    np.testing.assert_allclose(history["epsilon"], expected, rtol=1e-12)
    assert len(budget.epsilons) == 4  # the first fit's two, kept in the ledger
    ledger.write_text(json.dumps({"steps": -1}))
    with pytest.raises(ValueError, match="corrupt"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[callbacks.PrivacyBudget(**kwargs)])


@pytest.mark.skipif(KERAS_MAJOR == 2,
                    reason="Keras 2's fit works under MultiWorkerMirroredStrategy")
def test_train_script_refuses_multi_worker_on_keras3():
    from tf_tempered.experiments import common, train
    with pytest.raises(common.ConfigError, match="TF_USE_LEGACY_KERAS=1"):
        train.make_strategy("multi_worker")
