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
"""First-layer activation norms during training: non-private ReLU, DP ReLU, DP tanh (Figure 4).

    python -m tf_tempered.experiments.activation_norms --dataset=mnist --epochs=15 \\
        --output_dir=/tmp/norms

The norm is the mean per-example L2 norm of the first activation layer's outputs on
the test images (``tf_tempered.callbacks.ActivationNormMonitor``), before training
(epoch 0) and after every epoch. The paper's point: under DP-SGD, ReLU activations
grow (clipping then discards more of the gradient) while tanh stays bounded. Runs
are stored as ``runs/<run>.json`` (a rerun resumes); writes ``activation_norms.json``
and ``activation_norms.png``.
"""

import pathlib
import types

from tf_tempered.callbacks import ActivationNormMonitor, plot_activation_norms
from tf_tempered.experiments import command_line, common, model_builders, results
from tf_tempered.experiments.run_report import progress_verbosity
from tf_tempered.experiments.train import run_training

__all__ = ["RUNS", "run_activation_norms", "define_flags", "main", "cli"]

# name: (activation, DP-SGD?, plot label)
RUNS = {
    "relu_nonprivate": ("relu", False, "ReLU, non-private"),
    "relu_dp": ("relu", True, "ReLU, DP-SGD"),
    "tanh_dp": ("tanh", True, "tanh, DP-SGD"),
    "tanh_nonprivate": ("tanh", False, "tanh, non-private"),
}
DEFAULT_RUNS = ("relu_nonprivate", "relu_dp", "tanh_dp")


def _train_with_monitor(config, verbose):
    """run_training plus the first activation layer's norms (epoch 0 = before training)."""
    holder = {}

    def callbacks(model, dataset):
        layer = model_builders.first_activation_layer(model)
        monitor = ActivationNormMonitor(layer, dataset.x_test)
        monitor.set_model(model)
        holder.update(monitor=monitor, layer=layer.name, initial=monitor.compute())
        return [monitor]

    result = dict(run_training(config, verbose=verbose, extra_callbacks=callbacks))
    monitor = holder["monitor"]
    result["activation_norms"] = {"layer": holder["layer"],
                                  "epochs": [0] + list(monitor.epochs),
                                  "norms": [holder["initial"]] + list(monitor.history)}
    return result


def run_activation_norms(base_config, *, runs=DEFAULT_RUNS, output_dir, verbose=1):
    """Trains ``base_config`` as each of ``runs`` (names of :data:`RUNS`) and records norms.

    The DP runs use ``base_config``'s privacy settings; the non-private ones drop them
    (same data, model, optimizer, learning rate and epochs).

    Returns:
        ``{"runs": {name: {"label", "epochs", "norms", "test_accuracy", "epsilon"}}, ...}``.
    """
    if not output_dir:
        raise common.ConfigError("--output_dir is required (it stores each run, so a rerun "
                                 "resumes). Fix: pass --output_dir=DIR.")
    runs = list(dict.fromkeys(runs))
    unknown = [r for r in runs if r not in RUNS]
    if unknown or not runs:
        raise common.ConfigError(f"--runs: unknown or empty {unknown or runs}; choose among "
                                 f"{', '.join(RUNS)}.")
    named = []
    for name in runs:
        activation, private, _ = RUNS[name]
        config = base_config.replace(activation=activation, scale=2.0, inverse_temperature=2.0,
                                     offset=1.0, learnable=False, output_dir=None, dpsgd=private)
        if not private:
            config = config.replace(noise_multiplier=None, target_epsilon=None,
                                    microbatches=None, insecure_dp_seed=None)
        named.append((name, config))
    out = pathlib.Path(output_dir)
    by_name, trained = results.run_all(out / "runs", named,
                                       lambda c: _train_with_monitor(c, verbose),
                                       verbose=verbose)
    summary = {"runs": {}, "delta": base_config.delta, "num_trained": trained}
    for name in runs:
        run = by_name[name]
        summary["runs"][name] = dict(label=RUNS[name][2], **run["activation_norms"],
                                     test_accuracy=run["test_accuracy"],
                                     epsilon=float(run["epsilon"]), file=f"runs/{name}.json")
    curves = {r["label"]: types.SimpleNamespace(epochs=r["epochs"], history=r["norms"])
              for r in summary["runs"].values()}
    plot_activation_norms(curves, out / "activation_norms.png",
                          title="First-layer activation norms")
    results.write_json(out / "activation_norms.json", summary)
    if verbose:
        for r in summary["runs"].values():
            print(f"{r['label']}: norm {r['norms'][0]:.3g} -> {r['norms'][-1]:.3g}, test "
                  f"accuracy {r['test_accuracy']:.4f}, ε = {r['epsilon']:.4g}", flush=True)
        print(f"Wrote {out}/activation_norms.json, activation_norms.png", flush=True)
    return summary


def define_flags():
    """Defines the script's absl flags: train's (minus activation and dpsgd) plus --runs."""
    from absl import flags  # pylint: disable=g-import-not-at-top
    command_line.define_training_flags(
        flags.FLAGS, exclude=("activation", "scale", "inverse_temperature", "offset",
                              "learnable", "dpsgd", "save_model"))
    flags.DEFINE_list("runs", list(DEFAULT_RUNS), f"Runs, among {', '.join(RUNS)}.")


def _run_from_flags(f):
    config = command_line.config_from_flags(f, activation="relu", output_dir=None)
    run_activation_norms(config, runs=f.runs, output_dir=f.output_dir,
                         verbose=progress_verbosity())


# `cli` is the console entry point tf-tempered-activation-norms.
main, cli = command_line.absl_entry_point(define_flags, _run_from_flags)

if __name__ == "__main__":
    cli()
