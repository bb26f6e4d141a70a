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
"""Selection runs on a held-out part of the training set (never the test set).

Trains as ``tf_tempered.experiments.train`` does (same flags) on the first
N - ``--holdout`` training examples (``--num_train`` is set for you) and, after
every epoch, evaluates on the last ``--holdout`` training examples, which the
model never trains on; prints ``holdout accuracy`` per epoch and writes it into
``holdout.json`` next to metrics.json. The train script's own "test accuracy"
column is the test set: do not select on it.

    python benchmarks/scatternet_holdout.py --dataset=mnist --data_dir=DATA \\
        --features=scatternet --activation=tanh --target_epsilon=2.93 --epochs=15
"""

import json
import pathlib

from tf_tempered import data as data_lib
from tf_tempered import scatternet
from tf_tempered._compat import keras, tf
from tf_tempered.experiments import command_line, common, train


class _Holdout(keras.callbacks.Callback):
    def __init__(self, x, y):
        super().__init__()
        self.ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(1024)
        self.history = []

    def on_epoch_end(self, epoch, logs=None):
        acc = self.model.evaluate(self.ds, verbose=0, return_dict=True)["accuracy"]
        self.history.append(float(acc))
        print(f"Epoch {epoch + 1}: holdout accuracy {acc:.4f}", flush=True)


def _run(f):
    config = common.validate_config(command_line.config_from_flags(f))
    full = data_lib.load(config.dataset, data_dir=config.data_dir)
    holdout = f["holdout"].value
    n = len(full.y_train) - holdout
    x, y = full.x_train[n:], full.y_train[n:]
    if config.features == "scatternet":
        x = scatternet.scattering_features(x)
    cb = _Holdout(x, y)
    config = config.replace(num_train=n)
    result = train.run_training(config, verbose="auto", extra_callbacks=lambda m, d: [cb])
    print(f"FINAL holdout accuracy {cb.history[-1]:.4f} (best {max(cb.history):.4f} at epoch "
          f"{cb.history.index(max(cb.history)) + 1}); eps {result['epsilon']:.4g}; wall "
          f"{result['wall_time_s']:.0f} s", flush=True)
    if config.output_dir:
        (pathlib.Path(config.output_dir) / "holdout.json").write_text(
            json.dumps({"holdout": holdout, "accuracy": cb.history}))


def _define():
    from absl import flags  # pylint: disable=g-import-not-at-top
    train.define_flags()
    flags.DEFINE_integer("holdout", 5000, "Last training examples held out for selection.")


main, cli = command_line.absl_entry_point(_define, _run)

if __name__ == "__main__":
    cli()
