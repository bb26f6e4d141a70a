# Copyright 2026 The tf_tempered Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Trains one model with DP-SGD (or without), as in the paper and TF Privacy's tutorials.

    python -m tf_tempered.experiments.train --dataset=mnist --activation=tanh \\
        --epochs=60 --output_dir=/tmp/mnist_tanh

Uses the Keras TensorFlow binds: Keras 3 by default, Keras 2 (tf-keras) when
``TF_USE_LEGACY_KERAS=1`` is set in the environment. Prints, each epoch, one line
with the training loss and accuracy, the fraction of clipped gradients, the test
accuracy and ε (with δ, the accountant and the sampling it assumes), after Keras'
progress bar when stdout is a terminal and alone otherwise (log files, CI);
writes ``metrics.json`` (final test accuracy and ε, every flag, the per-epoch
history, package versions and the Keras used, wall time) and ``model.keras``
(load it with ``keras.models.load_model(path, compile=False)``) into ``--output_dir``.

Randomness: ``--seed`` fixes weight initialisation, dropout and the shuffling of
``--nodpsgd`` runs; the DP noise, the Poisson batches and DP shuffling are keyed
by a per-run secret from the OS's entropy (never printed or written), so two DP
runs with the same flags differ. ``--insecure_dp_seed=K`` makes them reproducible
for debugging; the run is then NOT private, and metrics.json
(``"dp_randomness": "insecure"``, ``"epsilon_holds": false``) and the printed
summary say that the ε does not hold.

Sampling: ``poisson`` (default) trains on Poisson-sampled batches, and the ε reported
is the amplified one they earn. ``shuffle`` trains on shuffled fixed-size batches
(needed for ``--microbatches``), and every ε reported is the bound proven for them,
without amplification by subsampling (σ is calibrated for it with
``--target_epsilon``), labelled so.

Model selection: ``--validation_size=N`` holds out the last N training examples
(:func:`tf_tempered.data.split_validation`; ``--validation_fold=k`` holds out block k
of N from the start instead, for k-fold cross-validation); training, σ and ε use the
rest only, each epoch reports ``validation_accuracy``, and the test set is evaluated once, at
the end (``test_accuracy``), so choices made on the validation numbers leave the
test accuracy an unbiased estimate.
"""

import contextlib
import math
import pathlib
import time

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.callbacks import PrivacyBudget
from tf_tempered.ema import ExponentialMovingAverage
from tf_tempered.experiments import (backup, command_line, common, model_builders, results,
                                     run_report, train_data)
from tf_tempered.privacy import has_secret_dp_randomness, make_private, optimizers

__all__ = ["learning_rate", "make_strategy", "run_training", "define_flags", "main", "cli"]


def learning_rate(config, plan):
    """--learning_rate, or for --lr_schedule=cosine a Keras schedule of the step t:
    lr·(1 + cos(π·t/T))/2 over the run's T = plan.total_steps steps."""
    if config.lr_schedule == "cosine":
        # A function of the optimizer's step count, which a resumed run restores.
        return keras.optimizers.schedules.CosineDecay(config.learning_rate,
                                                      decay_steps=plan.total_steps)
    return config.learning_rate


def _make_optimizer(config, plan):
    lr = learning_rate(config, plan)
    extra = {"momentum": config.momentum} if config.momentum else {}
    if not config.dpsgd:
        # Keras 2: the legacy optimizers, as TF Privacy's (hence the DP ones there) are.
        module = keras.optimizers.legacy if KERAS_MAJOR == 2 else keras.optimizers
        cls = {"sgd": module.SGD, "adam": module.Adam}
        return cls[config.optimizer](learning_rate=lr, **extra)
    # tf_tempered's own DP optimizers: TF Privacy's arguments and update rules, on every
    # supported Python (TF Privacy does not install on 3.12+).
    cls = {"sgd": optimizers.DPKerasSGDOptimizer,
           "adam": optimizers.DPKerasAdamOptimizer}[config.optimizer]
    # Poisson batches vary in size: one example per microbatch (None) is the only fit.
    microbatches = None if config.sampling == "poisson" else config.microbatches
    return cls(l2_norm_clip=config.l2_norm_clip, noise_multiplier=plan.noise_multiplier,
               num_microbatches=microbatches, learning_rate=lr, **extra)


STRATEGIES = ("mirrored", "multi_worker")


def make_strategy(name):
    """None (no strategy), or the tf.distribute strategy --strategy names.

    "mirrored": MirroredStrategy, one replica per GPU TensorFlow sees, or without GPUs
    one per logical CPU device (one, unless --cpu_devices splits the CPU);
    "multi_worker": MultiWorkerMirroredStrategy, the cluster from TF_CONFIG.
    """
    if name is None:
        return None
    if name not in STRATEGIES:
        raise common.ConfigError(f"--strategy={name!r} is invalid: use one of {STRATEGIES}.")
    if name == "multi_worker" and KERAS_MAJOR == 3:
        raise common.ConfigError(
            "--strategy=multi_worker needs Keras 2: run with TF_USE_LEGACY_KERAS=1. Keras 3's "
            "Model.fit fails under MultiWorkerMirroredStrategy before any step, for any model "
            "(keras-team/keras#20585); tf_tempered's DP step itself works there in a custom "
            "training loop (docs/distributed.md).")
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus or tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    return tf.distribute.MultiWorkerMirroredStrategy()


def run_training(config, *, verbose=1, extra_callbacks=None, backup_dir=None, strategy=None):
    """Trains as ``config`` (a TrainConfig) says; returns the metrics dict (also written).

    Args:
        config: the run's settings; validated before anything else happens.
        verbose: 0 silent, 1 progress bar and a line per epoch, 2 a line per epoch
            (loss, accuracy, clipped fraction, test accuracy, ε) and no progress bar,
            "auto" 1 when stdout is a terminal and 2 otherwise (log files, CI).
        extra_callbacks: optional ``f(model, dataset) -> list of Keras callbacks``.
        backup_dir: where ``keras.callbacks.BackupAndRestore`` keeps the run's state
            (weights, optimizer state, epoch) at each epoch end, and PrivacyBudget its
            ledger of DP steps taken; a run killed and started again with the same
            directory resumes from the last completed epoch, and its ε counts every
            DP step taken, the redone ones included (``steps``; ``steps_trained`` is
            the optimizer's count).
        strategy: None, "mirrored" or "multi_worker" (see :func:`make_strategy`), or
            a ``tf.distribute.Strategy``; the same DP-SGD update and ε as one device.

    Raises:
        ConfigError: for invalid settings, before any data is loaded or model trained.
    """
    common.validate_config(config)
    verbose = run_report.check_verbosity(verbose)
    start = time.monotonic()
    out = pathlib.Path(config.output_dir) if config.output_dir else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)  # fail now, not after training
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    data = train_data.prepare_data(config, backup_dir)
    strategy = _check_strategy(config, strategy)
    model = _build_model(config, data, strategy)
    train_ds = train_data.training_batches(config, data.plan, data.train_x,
                                           data.dataset.y_train, strategy)
    data.train_x = None  # the batches hold what they need (ScatterNet's shifts are large)
    test_ds, eval_ds = _evaluation_sets(data, strategy)
    report = run_report.EpochReport(data.plan, verbose,
                                    "test" if data.validation is None else "validation")
    callbacks, budget = _callbacks(config, data.plan, verbose, report, backup_dir)
    if extra_callbacks is not None:
        callbacks.extend(extra_callbacks(model, data.dataset))
    model.fit(train_ds, epochs=config.epochs, validation_data=eval_ds, callbacks=callbacks,
              verbose=1 if verbose == 1 else 0, shuffle=False,  # train_ds is shuffled/sampled
              steps_per_epoch=data.plan.steps_per_epoch if strategy is not None else None)
    # The test set once, at the end (with a validation split, never seen before).
    result = run_report.run_metrics(
        config, data.plan, data, model, report=report, budget=budget,
        test=model.evaluate(test_ds, verbose=0, return_dict=True),
        validation=None if data.validation is None else model.evaluate(
            eval_ds, verbose=0, return_dict=True),
        replicas=1 if strategy is None else strategy.num_replicas_in_sync)
    result["wall_time_s"] = time.monotonic() - start
    result["peak_rss_mib"] = results.peak_rss_mib()  # the process's: data, model and all
    if out is not None:
        if config.save_model:
            model.save(out / "model.keras")
        results.write_json(out / "metrics.json", result)
    if verbose:
        run_report.print_summary(result, data.plan, out, config.save_model)
    return result


def _check_strategy(config, strategy):
    """The tf.distribute strategy (a name is made into one); refuses what it cannot run."""
    if isinstance(strategy, str):
        strategy = make_strategy(strategy)
    if (not config.poisson_padding and strategy is not None
            and strategy.num_replicas_in_sync > 1):
        raise common.ConfigError(
            "--nopoisson_padding is not supported with several replicas (they need batches "
            "of one shape). Fix: drop --strategy or --nopoisson_padding.")
    if config.augmult > 1 and strategy is not None and strategy.num_replicas_in_sync > 1:
        raise common.ConfigError(
            f"--augmult={config.augmult} is not supported with several replicas yet (a "
            "replica's share of a batch could split an example's copies). Fix: drop "
            "--strategy or --augmult.")
    return strategy


def _build_model(config, data, strategy):
    """The compiled model, made private (--dpsgd) once, in the strategy's scope."""
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:  # variables (model, optimizer, DP noise counter) on every replica
        model = model_builders.build_model(config, data.dataset, feature_stats=data.feature_stats)
        if config.dpsgd:
            # Once, here: the builders return plain models, and a second call would
            # re-key the noise. The DP optimizer from _make_optimizer carries C and σ.
            make_private(model, insecure_dp_seed=config.insecure_dp_seed,
                         augmentation_multiplicity=config.augmult, sampling=config.sampling,
                         delta=config.delta, accountant=config.accountant)
            data.plan.epsilon_holds = has_secret_dp_randomness(model)
        model.compile(optimizer=_make_optimizer(config, data.plan),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


def _evaluation_sets(data, strategy, batch_size=1024):
    """(test set, what fit evaluates each epoch: the validation split if any, else the test
    set), batched."""
    if strategy is not None and strategy.num_replicas_in_sync > 1:
        # Keras 3 builds evaluate() on its first batch averaged over the replicas,
        # which fails if that batch splits unevenly: make it a multiple of R.
        replicas = strategy.num_replicas_in_sync
        batch_size = max(replicas,
                         min(batch_size, len(data.dataset.y_test)) // replicas * replicas)
    test_ds = tf.data.Dataset.from_tensor_slices(data.dataset.test).batch(batch_size)
    if data.validation is None:
        return test_ds, test_ds
    return test_ds, tf.data.Dataset.from_tensor_slices(data.validation).batch(batch_size)


def _callbacks(config, plan, verbose, report, backup_dir):
    """(fit's callbacks in order, the PrivacyBudget or None)."""
    # First, so that the bar finishes its line before the report prints. verbose=2:
    # no bar (fit verbose=0), the per-epoch line of the report only.
    progbar = (keras.callbacks.ProgbarLogger(count_mode="steps") if KERAS_MAJOR == 2
               else keras.callbacks.ProgbarLogger())
    callbacks = [progbar] if verbose == 1 else []
    if config.ema_decay:  # None or 0: no averaging (a decay of 0 keeps the weights themselves)
        # Validation sees the average; at the end the model keeps it (evaluated, saved).
        callbacks.append(ExponentialMovingAverage(decay=config.ema_decay))
    ledger = None
    if backup_dir is not None:
        callbacks.append(backup.BackupAndRestore(str(backup_dir)))
        ledger = pathlib.Path(backup_dir) / "privacy_ledger.json"
    budget = None
    if config.dpsgd:
        # With --target_epsilon stops before exceeding it (a safety net: the calibrated σ
        # already keeps the last epoch within it); composes the DP feature statistics into
        # the model's ε; checks the run's N, batch size and σ against the plan's.
        budget = PrivacyBudget(
            target_epsilon=config.target_epsilon or math.inf,
            num_examples=plan.num_examples, batch_size=config.batch_size,
            noise_multiplier=plan.noise_multiplier, ledger=ledger,
            prior_events=plan.prior_events)
        callbacks.append(budget)
    return callbacks + [report], budget


def define_flags():
    """Defines this script's absl flags (call once, from the entry point)."""
    from absl import flags  # pylint: disable=g-import-not-at-top
    command_line.define_training_flags(flags.FLAGS)
    flags.DEFINE_string("backup_dir", None, "Back up the run (weights, optimizer, epoch, "
                        "DP steps taken) here after every epoch, and resume from it if "
                        "present: a killed run started again continues, and its ε counts "
                        "every DP step taken, redone ones included.")
    flags.DEFINE_enum("strategy", None, list(STRATEGIES), "tf.distribute strategy: "
                      "mirrored (one replica per visible GPU, else per logical CPU "
                      "device) or multi_worker (TF_CONFIG cluster). "
                      "Same DP-SGD update and ε as one device.")
    flags.DEFINE_integer("cpu_devices", None, "Split the CPU into this many logical devices "
                         "(before TensorFlow starts), e.g. to try --strategy=mirrored with "
                         "several replicas on a machine without GPUs.")


def _run_from_flags(f):
    if f["cpu_devices"].value is not None:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * f["cpu_devices"].value)
    run_training(common.validate_config(command_line.config_from_flags(f)), verbose="auto",
                 backup_dir=f["backup_dir"].value, strategy=f["strategy"].value)


# `cli` is the console entry point tf-tempered-train.
main, cli = command_line.absl_entry_point(define_flags, _run_from_flags)

if __name__ == "__main__":
    cli()
