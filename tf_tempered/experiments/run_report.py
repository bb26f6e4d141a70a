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
"""What a training run reports: a line per epoch, metrics.json's dict and the summary line.

:class:`EpochReport` records each epoch (accuracies, ε, DP metrics, time) and prints one
line; :func:`run_metrics` is the dict ``run_training`` returns and writes as
``metrics.json``; :func:`print_summary` the last line a run prints.
"""

import math
import sys
import time

from tf_tempered._compat import KERAS_MAJOR, keras
from tf_tempered.experiments import results
from tf_tempered.privacy import epsilon_spent

__all__ = ["EpochReport", "NOT_COVERED_NOTE", "check_verbosity", "not_covered_by_epsilon",
           "print_summary", "progress_verbosity", "run_metrics"]

NOT_COVERED_NOTE = (
    "Note: the training loss and accuracy and the clipping statistics (clipped fraction, "
    "gradient norm) are computed from the private batches without noise: ε does not cover "
    "them, so do not publish them (metrics.json lists them under not_covered_by_epsilon).")


class EpochReport(keras.callbacks.Callback):
    """Records each epoch (accuracies, ε, DP metrics, time) and prints accuracy and ε."""

    def __init__(self, plan, verbose, eval_name="test"):
        super().__init__()
        self.plan, self.verbose, self.records = plan, verbose, []
        self.eval_name = eval_name  # what fit's validation_data is: "test" or "validation"
        self._start = None

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        # With a PrivacyBudget ledger (--backup_dir): every DP step taken, redone ones too.
        steps = int(logs.get("dp_steps", (epoch + 1) * self.plan.steps_per_epoch))
        # A private model's fit puts the ε of its batches into the logs.
        eps = logs["epsilon"] if "epsilon" in logs else self.plan.epsilon(steps)
        record = {"epoch": epoch + 1, "steps": steps, "epsilon": eps,
                  "time_s": time.monotonic() - self._start}
        for key, value in logs.items():
            # val_dp_* are the DP training metrics, idle (zero) in evaluation.
            if key not in ("epsilon", "delta", "dp_steps") and not key.startswith("val_dp_"):
                name = key.replace("val_", f"{self.eval_name}_", 1) if key.startswith(
                    "val_") else (
                    key if key.startswith("dp_") else f"train_{key}")
                record[name] = float(value)
        self.records.append(record)
        if self.verbose and epoch == 0 and self.plan.config.dpsgd:
            print(NOT_COVERED_NOTE, flush=True)
        if self.verbose:
            extra = "" if self.plan.config.sampling == "poisson" or not self.plan.config.dpsgd \
                else " [shuffled batches: no amplification by subsampling]"
            delta = "" if math.isinf(eps) else f" at δ={self.plan.config.delta:g} " \
                f"({self.plan.config.accountant.upper()})"
            if not self.plan.epsilon_holds:
                extra += " [NOT PRIVATE: --insecure_dp_seed, this ε does not hold]"
            clipped = ("" if "dp_clipped_fraction" not in record else
                       f", clipped fraction {record['dp_clipped_fraction']:.3f}")
            print(f"Epoch {epoch + 1}/{self.plan.config.epochs}: loss "
                  f"{record.get('train_loss', math.nan):.4f}, train accuracy "
                  f"{record.get('train_accuracy', math.nan):.4f}{clipped}, {self.eval_name} "
                  f"accuracy {record.get(f'{self.eval_name}_accuracy', math.nan):.4f}, "
                  f"ε = {eps:.4g}{delta}{extra}",
                  flush=True)


def progress_verbosity(stream=None):
    """1 (progress bar and a line per epoch) on a terminal, else 2 (a line per epoch).

    A progress bar rewrites its line with carriage returns hundreds of times per epoch,
    which fills log files and CI output; there one line per epoch says the same.
    """
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return 1 if isatty is not None and isatty() else 2
    except ValueError:  # a closed stream
        return 2


def check_verbosity(verbose):
    """``verbose`` as 0, 1 or 2 ("auto": :func:`progress_verbosity`); else ValueError."""
    if verbose == "auto":
        verbose = progress_verbosity()
    if verbose not in (0, 1, 2):
        raise ValueError(f"verbose must be 0, 1, 2 or 'auto', got {verbose!r}.")
    return verbose


def _steps_taken(report, budget):
    """The steps actually taken (PrivacyBudget may stop early; with a ledger, the steps of
    killed runs that were redone after a restore count again)."""
    if budget is not None and budget.ledger is not None:
        return budget.steps_taken
    return report.records[-1]["steps"] if report.records else 0


def run_metrics(config, plan, data, model, *, report, budget, test, validation, replicas):
    """The dict a run returns and writes as metrics.json: final accuracies and ε, every flag,
    the per-epoch history, the data, the model, package versions and the Keras used.
    ``test``/``validation``: ``model.evaluate(..., return_dict=True)`` (validation None
    without --validation_size)."""
    dataset = data.dataset
    return {
        "test_accuracy": float(test["accuracy"]),
        "test_loss": float(test["loss"]),
        # None without --validation_size (then the test set is what each epoch reports).
        "validation_accuracy": None if validation is None else float(validation["accuracy"]),
        "validation_loss": None if validation is None else float(validation["loss"]),
        # The model's own ledger: every DP step it took, by the sampling of its batches.
        "epsilon": epsilon_spent(model)[0] if config.dpsgd else math.inf,
        "delta": config.delta,
        "epsilon_label": plan.label(),
        # Where the DP noise and batches came from; False: the ε above does not hold.
        "dp_randomness": plan.dp_randomness(),
        "epsilon_holds": plan.epsilon_holds,
        "accountant": config.accountant if config.dpsgd else None,
        "sampling": config.sampling if config.dpsgd else "shuffle (non-private)",
        "noise_multiplier": plan.noise_multiplier,
        # ε of the DP feature statistics alone (--feature_norm=dp_stats; included above).
        "epsilon_feature_stats": plan.prior_epsilon() if plan.prior_events else None,
        "steps": _steps_taken(report, budget),
        "steps_trained": int(model.optimizer.iterations.numpy()),
        "replicas": replicas,
        "steps_per_epoch": plan.steps_per_epoch,
        "flags": config.to_dict(),
        "dataset": {"name": dataset.name, "source": dataset.source,
                    "num_train": len(dataset.y_train), "num_test": len(dataset.y_test),
                    "num_validation": config.validation_size,
                    "validation_fold": config.validation_fold,
                    "input_shape": list(dataset.input_shape)},
        "model": {"name": model.name, "params": int(model.count_params())},
        "history": report.records,
        "not_covered_by_epsilon": not_covered_by_epsilon(config, report.records),
        "versions": results.package_versions(),
        # 3 by default; 2 with TF_USE_LEGACY_KERAS=1 (both are installed, see versions).
        "keras_major": KERAS_MAJOR,
    }


def not_covered_by_epsilon(config, records):
    """The history's keys that are statistics of the private training data without noise:
    the training batches' loss, accuracy and clipping statistics, and the validation
    metrics when the validation set is split from the training data (--validation_size).
    Empty for a non-private run (no ε to cover anything)."""
    if not config.dpsgd:
        return []
    private = ("train_", "dp_") + (("validation_",) if config.validation_size else ())
    held_out = ["validation_accuracy", "validation_loss"] if config.validation_size else []
    return held_out + sorted({f"history.{key}" for record in records for key in record
                              if key.startswith(private)})


def print_summary(result, plan, out, saved_model):
    """The run's last line: accuracies, ε with its label, wall time, what was written."""
    val = result["validation_accuracy"]
    print((f"Validation accuracy {val:.4f}; " if val is not None else "")
          + f"Test accuracy {result['test_accuracy']:.4f}; ε = {result['epsilon']:.4g} "
          f"({plan.label()}); wall time {result['wall_time_s']:.1f} s"
          + (f"; wrote {out}/metrics.json" if out else "")
          + (" and model.keras" if out and saved_model else ""), flush=True)
