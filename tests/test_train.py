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
"""The train script: metrics.json, model.keras, ε, flag validation, the CLI."""

import dataclasses
import json
import math
import subprocess
import sys
import types

import numpy as np
import pytest
from once_per_session import once_per_session

from tf_tempered._compat import KERAS_MAJOR, keras
from tf_tempered.experiments import command_line, model_builders, privacy_plan, run_report
from tf_tempered.experiments import train as train_lib
from tf_tempered.experiments.common import ConfigError, TrainConfig, validate_config
from tf_tempered.privacy.accounting import compute_epsilon
from tf_tempered.privacy.sampling import poisson_steps_per_epoch

# The train script sits above make_private and fit, which the Keras 2 suite tests directly
# (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

DIGITS_TRAIN = 1438
TINY = TrainConfig(dataset="digits", epochs=2, batch_size=128, learning_rate=0.5)


def _read(path):
    with open(path) as f:
        return json.load(f)


def test_train_writes_metrics_and_a_model_that_reproduces_them(tmp_path):
    config = TINY.replace(output_dir=str(tmp_path))
    returned = train_lib.run_training(config, verbose=0)
    metrics = _read(tmp_path / "metrics.json")

    for key in ("test_accuracy", "epsilon", "delta", "epsilon_label", "accountant", "sampling",
                "noise_multiplier", "steps", "flags", "wall_time_s", "history", "versions",
                "dataset"):
        assert key in metrics, key
    assert metrics["flags"] == config.to_dict()
    assert metrics["dataset"]["source"] == "sklearn.datasets.load_digits"
    assert set(metrics["versions"]) >= {"tensorflow", "keras", "tf-keras", "tensorflow-privacy",
                                        "tf_tempered"}
    assert metrics["keras_major"] == KERAS_MAJOR  # the Keras that trained, as selected
    assert metrics["wall_time_s"] > 0
    # The process's peak resident memory (Linux: getrusage's KiB): TensorFlow alone is > 100 MiB.
    assert 100 < metrics["peak_rss_mib"] < 64 * 1024
    assert metrics["test_accuracy"] == pytest.approx(returned["test_accuracy"])
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]
    for h in metrics["history"]:
        assert 0 <= h["test_accuracy"] <= 1 and h["epsilon"] > 0
    assert metrics["history"][-1]["test_accuracy"] == pytest.approx(metrics["test_accuracy"])

    # ε is exactly the accountant's for these settings, after each epoch and at the end.
    steps_per_epoch = poisson_steps_per_epoch(num_examples=DIGITS_TRAIN, expected_batch_size=128)
    expected = [compute_epsilon(num_examples=DIGITS_TRAIN, batch_size=128, noise_multiplier=1.1,
                                steps=e * steps_per_epoch, delta=1e-5, sampling="poisson")
                for e in (1, 2)]
    assert [h["epsilon"] for h in metrics["history"]] == pytest.approx(expected, rel=1e-12)
    assert metrics["epsilon"] == pytest.approx(expected[-1], rel=1e-12)
    assert metrics["steps"] == 2 * steps_per_epoch
    assert "Poisson sampling (as trained)" in metrics["epsilon_label"]
    assert metrics["dp_randomness"] == "secret" and metrics["epsilon_holds"] is True
    assert "NOT PRIVATE" not in metrics["epsilon_label"]
    # Statistics of the private batches without noise are listed as outside ε.
    assert {"history.train_loss", "history.train_accuracy", "history.dp_grad_norm",
            "history.dp_clipped_fraction"} <= set(metrics["not_covered_by_epsilon"])
    assert not any("test_" in key for key in metrics["not_covered_by_epsilon"])

    model = keras.models.load_model(tmp_path / "model.keras", compile=False)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    from tf_tempered import data  # pylint: disable=import-outside-toplevel
    x_test, y_test = data.load("digits").test
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    assert accuracy == pytest.approx(metrics["test_accuracy"], abs=1e-6)


@pytest.mark.parametrize("num_examples, batch_size, epochs", [(1438, 1000, 4), (1438, 64, 60)])
def test_shuffle_with_target_epsilon_calibrates_sigma_for_every_epoch(num_examples, batch_size,
                                                                      epochs):
    # Before: the plan's steps, ⌊N/B⌋ an epoch, were taken for ⌈steps·B/N⌉ passes, fewer than
    # the epochs (3 of 4; 59 of 60), and PrivacyBudget stopped the run early (probe W, F1).
    config = TINY.replace(sampling="shuffle", batch_size=batch_size, epochs=epochs,
                          target_epsilon=3.0)
    plan = privacy_plan.plan_privacy(config, num_examples)
    with pytest.warns(UserWarning, match="WITHOUT privacy amplification"):
        spent = compute_epsilon(num_examples=num_examples, batch_size=batch_size,
                                noise_multiplier=plan.noise_multiplier, epochs=epochs,
                                delta=1e-5, sampling="shuffle")
    assert 2.9 <= spent <= 3.0


def test_shuffle_with_target_epsilon_reports_the_bound_for_shuffled_batches(tmp_path):
    config = TINY.replace(epochs=1, sampling="shuffle", microbatches=64, target_epsilon=2.0,
                          output_dir=str(tmp_path), save_model=False)
    train_lib.run_training(config, verbose=0)
    metrics = _read(tmp_path / "metrics.json")
    assert not (tmp_path / "model.keras").exists()
    # Shuffled batches: σ is calibrated so that the bound proven for them (without
    # amplification by subsampling), the only ε reported, lands just under the target.
    assert 1.95 <= metrics["epsilon"] <= 2.0
    assert metrics["steps"] == DIGITS_TRAIN // 128
    assert "shuffled fixed-size batches" in metrics["epsilon_label"]
    assert "Poisson" not in metrics["epsilon_label"]
    assert "epsilon_no_amplification" not in metrics
    with pytest.warns(UserWarning, match="WITHOUT privacy amplification"):
        expected = compute_epsilon(num_examples=DIGITS_TRAIN, batch_size=128,
                                   noise_multiplier=metrics["noise_multiplier"],
                                   steps=metrics["steps"], delta=1e-5, microbatch_size=2,
                                   sampling="shuffle")
    assert metrics["epsilon"] == pytest.approx(expected, rel=1e-12)


def test_non_private_run_reports_infinite_epsilon(tmp_path):
    config = TINY.replace(epochs=1, dpsgd=False, optimizer="adam", learning_rate=0.01,
                          output_dir=str(tmp_path), save_model=False)
    result = train_lib.run_training(config, verbose=0)
    metrics = _read(tmp_path / "metrics.json")  # strict JSON: inf is the string "inf"
    assert math.isinf(result["epsilon"]) and math.isinf(float(metrics["epsilon"]))
    assert math.isinf(float(metrics["history"][0]["epsilon"]))
    assert metrics["test_accuracy"] > 0.5
    assert metrics["not_covered_by_epsilon"] == []  # no ε covers anything here


@pytest.mark.parametrize("changes, message", [
    (dict(microbatches=7, sampling="shuffle"), "--microbatches=7 does not divide --batch_size"),
    (dict(microbatches=64), "--sampling=poisson needs one example per microbatch"),
    (dict(noise_multiplier=1.0, target_epsilon=3.0), "mutually exclusive"),
    (dict(learning_rate=0.0), "--learning_rate=0.0 is invalid"),
    (dict(l2_norm_clip=-1.0), "--l2_norm_clip=-1.0 is invalid"),
    (dict(batch_size=0), "--batch_size=0 is invalid"),
    (dict(epochs=1.5), "--epochs=1.5 is invalid"),
    (dict(noise_multiplier=0.0), "--noise_multiplier=0.0 is invalid"),
    (dict(target_epsilon=-1.0), "--target_epsilon=-1.0 is invalid"),
    (dict(delta=1.0), "--delta=1.0 is invalid"),
    (dict(dataset="svhn"), "--dataset='svhn' is invalid"),
    (dict(sampling="fixed"), "--sampling='fixed' is invalid"),
    (dict(activation="relu", scale=3.0), "--scale only applies to --activation=tempered_sigmoid"),
    (dict(scale=0.0), "--scale=0.0 is invalid"),
    (dict(dpsgd=False, noise_multiplier=1.0), "--noise_multiplier has no effect with --nodpsgd"),
    (dict(num_train=0), "--num_train=0 is invalid"),
    (dict(insecure_dp_seed=1.5), "--insecure_dp_seed=1.5 is invalid"),
    (dict(dpsgd=False, insecure_dp_seed=3), "--insecure_dp_seed has no effect with --nodpsgd"),
    (dict(head="linear"), "--head=linear applies to --features=scatternet only"),
    (dict(head="mlp", features="scatternet"), "--head='mlp' is invalid"),
    (dict(head="linear", features="scatternet", learnable=True),
     "--learnable has nothing to learn with --head=linear"),
    (dict(lr_schedule="step"), "--lr_schedule='step' is invalid"),
    (dict(poisson_padding=False, sampling="shuffle"), "--nopoisson_padding applies to DP-SGD"),
    (dict(poisson_padding=False, dpsgd=False), "--nopoisson_padding applies to DP-SGD"),
])
def test_validation_names_the_flag(changes, message):
    with pytest.raises(ConfigError, match="Fix:|choose one of|must be") as info:
        validate_config(TINY.replace(**changes))
    assert message in str(info.value)


def test_unpadded_poisson_batches_train_the_same_model(monkeypatch, tmp_path):
    # --nopoisson_padding: each step sees only its sampled examples; with the same insecure
    # key (membership and noise), the same weights and the same ε as the padded run.
    from tf_tempered.experiments import train_data
    datasets = []
    original = train_data.training_batches
    monkeypatch.setattr(train_data, "training_batches",
                        lambda *a, **k: datasets.append(original(*a, **k)) or datasets[-1])
    config = TINY.replace(epochs=2, insecure_dp_seed=4, noise_multiplier=1.0)
    runs = {}
    for padding in (True, False):
        models = []
        result = train_lib.run_training(
            config.replace(poisson_padding=padding), verbose=0,
            extra_callbacks=lambda model, dataset: models.append(model) or [])
        runs[padding] = result, models[0].get_weights()
    padded, unpadded = datasets
    assert padded.element_spec[0].shape[0] is not None  # one fixed size
    assert unpadded.element_spec[0].shape[0] is None
    batches = [(len(y), int(info["mask"].numpy().sum())) for _, y, info in unpadded]
    assert all(rows == sampled for rows, sampled in batches)  # no padding rows
    assert len({rows for rows, _ in batches}) > 1
    assert runs[True][0]["epsilon"] == runs[False][0]["epsilon"]
    for a, b in zip(runs[True][1], runs[False][1]):
        np.testing.assert_allclose(b, a, atol=1e-5)


def test_bad_config_fails_before_loading_data(monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("data loaded before validation")
    monkeypatch.setattr(train_lib.train_data.data_lib, "load", no_loading)
    with pytest.raises(ConfigError, match="mutually exclusive"):
        train_lib.run_training(TINY.replace(noise_multiplier=1.0, target_epsilon=1.0), verbose=0)


def test_batch_larger_than_the_data_fails_before_training(monkeypatch):
    monkeypatch.setattr(train_lib.model_builders, "build_model",
                        lambda *a: pytest.fail("model built before validation"))
    with pytest.raises(ConfigError, match=r"--batch_size=256 is larger than the 100 training"):
        train_lib.run_training(TINY.replace(batch_size=256, num_train=100), verbose=0)


def test_flags_cover_every_setting_and_parse_into_a_config():
    from absl import flags  # pylint: disable=import-outside-toplevel
    values = flags.FlagValues()
    command_line.define_training_flags(values)
    assert {f.name for f in dataclasses.fields(TrainConfig)} <= set(values)
    values(["prog", "--dataset=digits", "--activation=tanh", "--nodpsgd", "--epochs=3",
            "--microbatches=32"])
    config = command_line.config_from_flags(values, output_dir="/tmp/x")
    assert config == TrainConfig(dataset="digits", activation="tanh", dpsgd=False, epochs=3,
                                 microbatches=32, output_dir="/tmp/x")


@pytest.mark.parametrize("given", [["--sampling=poisson"], ["--accountant=pld", "--delta=1e-6"]])
def test_flags_only_dp_sgd_reads_are_refused_with_nodpsgd(given):
    # Before: ignored silently (--nodpsgd --sampling=poisson trained on shuffled batches).
    from absl import flags  # pylint: disable=import-outside-toplevel
    values = flags.FlagValues()
    command_line.define_training_flags(values)
    values(["prog", "--dataset=digits", "--nodpsgd", *given])
    names = ", ".join(flag.split("=")[0] for flag in given)
    with pytest.raises(ConfigError, match=f"^{names} ha(s|ve) no effect with --nodpsgd.*Fix: "
                                          f"drop {names}, or train with --dpsgd"):
        command_line.config_from_flags(values)
    values(["prog", "--dataset=digits", "--dpsgd", *given])
    assert command_line.config_from_flags(values).dpsgd


def test_cli_rejects_a_bad_flag_combination_with_a_clear_message(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tf_tempered.experiments.train", "--dataset=digits",
         "--noise_multiplier=1.0", "--target_epsilon=3", f"--output_dir={tmp_path}"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "--noise_multiplier=1.0 and --target_epsilon=3.0 are mutually exclusive" in proc.stderr
    assert not (tmp_path / "metrics.json").exists()



# ------------------------------------------------- what the seed controls (issue 13)

_RUNS_SCRIPT = """
import json, sys
import numpy as np
import tf_tempered
from tf_tempered._compat import keras
from tf_tempered import data
from tf_tempered.experiments import train
from tf_tempered.experiments.common import TrainConfig
from tf_tempered.privacy import poisson_batches

out = sys.argv[1]
base = TrainConfig(dataset="digits", epochs=1, batch_size=128, learning_rate=0.5, seed=0)
modes = {"dp": {}, "nodp": {"dpsgd": False}, "insecure": {"insecure_dp_seed": 11}}


class Initial(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.weights = [w.copy() for w in self.model.get_weights()]


arrays = {}
for mode, changes in modes.items():
    initial = Initial()
    train.run_training(base.replace(output_dir=f"{out}/{mode}", save_model=False, **changes),
                       verbose=0, extra_callbacks=lambda model, dataset: [initial])
    arrays.update({f"{mode}_initial_{i}": w for i, w in enumerate(initial.weights)})
    arrays.update({f"{mode}_final_{i}": w for i, w in enumerate(initial.model.get_weights())})
x, y = data.load("digits").train
for name, kwargs in {"poisson": {}, "poisson_insecure": {"insecure_dp_seed": 11}}.items():
    keras.utils.set_random_seed(0)
    ds = poisson_batches(x, y, expected_batch_size=128, steps=3, **kwargs)
    arrays[name] = np.stack([mask.numpy() * (1 + np.arange(len(labels))) + labels.numpy()
                             for _, labels, mask in ((a, b, c["mask"]) for a, b, c in ds)])
np.savez(f"{out}/arrays.npz", **arrays)
"""


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """Two separate processes, each training default DP, --nodpsgd and --insecure_dp_seed runs
    with the same --seed, and drawing Poisson batches after set_random_seed(0)."""
    return once_per_session(tmp_path_factory, "train_two_processes",
                            lambda: _two_processes(tmp_path_factory))


def _two_processes(tmp_path_factory):
    dirs = [tmp_path_factory.mktemp(f"process{i}") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", _RUNS_SCRIPT, str(out)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for out in dirs]
    outs = []
    for out, proc in zip(dirs, procs):
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        outs.append((out, dict(np.load(out / "arrays.npz")), stderr))
    return outs


def _weights(arrays, mode, when):
    prefix = f"{mode}_{when}_"
    return [arrays[k] for k in sorted((k for k in arrays if k.startswith(prefix)),
                                      key=lambda k: int(k[len(prefix):]))]


def test_same_seed_same_initial_weights_but_secret_dp_randomness(two_processes):
    (_, a, _), (_, b, _) = two_processes
    for mode in ("dp", "nodp", "insecure"):
        for wa, wb in zip(_weights(a, mode, "initial"), _weights(b, mode, "initial")):
            np.testing.assert_array_equal(wa, wb)  # --seed: same initialisation
    final_a, final_b = _weights(a, "dp", "final"), _weights(b, "dp", "final")
    assert len(final_a) == 6
    assert not any(np.array_equal(wa, wb) for wa, wb in zip(final_a, final_b))
    assert not np.array_equal(a["poisson"], b["poisson"])  # secret batch membership


def test_non_private_and_insecure_runs_reproduce_bit_for_bit(two_processes):
    (_, a, _), (_, b, _) = two_processes
    for mode in ("nodp", "insecure"):
        for wa, wb in zip(_weights(a, mode, "final"), _weights(b, mode, "final")):
            np.testing.assert_array_equal(wa, wb)
    np.testing.assert_array_equal(a["poisson_insecure"], b["poisson_insecure"])
    # The opt-in's batches are not those of another seed's run.
    assert not np.array_equal(a["poisson_insecure"], a["poisson"])


def test_metrics_say_whether_epsilon_holds(two_processes):
    out, _, stderr = two_processes[0]
    secret, insecure, nodp = (_read(out / m / "metrics.json") for m in ("dp", "insecure", "nodp"))
    assert secret["dp_randomness"] == "secret" and secret["epsilon_holds"] is True
    assert insecure["dp_randomness"] == "insecure" and insecure["epsilon_holds"] is False
    assert "NOT PRIVATE: --insecure_dp_seed=11" in insecure["epsilon_label"]
    assert "ε does NOT hold" in insecure["epsilon_label"]
    assert insecure["flags"]["insecure_dp_seed"] == 11
    assert nodp["dp_randomness"] is None and nodp["epsilon_holds"] is True
    # The opt-in warns once for the run (noise and batches: one warning, not one per
    # step), and PrivacyBudget says once that the ε it logs does not hold.
    assert stderr.count("insecure_dp_seed=11: the DP noise") == 1, stderr[-3000:]
    assert stderr.count("PrivacyBudget: model 'digits_cnn' was made private with "
                        "insecure_dp_seed") == 1, stderr[-3000:]


def _key_patterns(key):
    signed = key - (1 << 64) if key >= (1 << 63) else key
    return [key.to_bytes(8, "little"), key.to_bytes(8, "big"), str(key).encode(),
            str(signed).encode(), f"{key:x}".encode()]


def test_secrets_appear_in_no_written_file_or_output(tmp_path, monkeypatch, capfd):
    from tf_tempered.privacy import randomness  # pylint: disable=import-outside-toplevel
    drawn, real = [], randomness.secrets.randbits
    monkeypatch.setattr(randomness.secrets, "randbits",
                        lambda k: drawn.append(real(k)) or drawn[-1])
    train_lib.run_training(TINY.replace(epochs=1, output_dir=str(tmp_path)), verbose=1)
    assert len(drawn) == 2  # the noise key and the Poisson-membership key
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"metrics.json", "model.keras"}
    printed = capfd.readouterr()
    blobs = [p.read_bytes() for p in written] + [(printed.out + printed.err).encode()]
    assert b"Test accuracy" in blobs[-1]
    for key in drawn:
        for blob in blobs:
            assert not any(pattern in blob for pattern in _key_patterns(key))


def test_cli_insecure_dp_seed_says_epsilon_does_not_hold(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tf_tempered.experiments.train", "--dataset=digits",
         "--epochs=1", "--batch_size=128", "--insecure_dp_seed=3", f"--output_dir={tmp_path}",
         "--nosave_model"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NOT PRIVATE: --insecure_dp_seed=3" in proc.stdout  # the printed summary
    assert "this ε does not hold" in proc.stdout  # the per-epoch line
    assert _read(tmp_path / "metrics.json")["epsilon_holds"] is False


# ------------------------------------------------- progress output (issue 15)

_EPOCH_LINE = (r"Epoch (\d+)/2: loss (\d+\.\d{4}), train accuracy (\d\.\d{4}), clipped fraction "
               r"(\d\.\d{3}), test accuracy (\d\.\d{4}), ε = (\S+) at δ=1e-05 \(RDP\)")


class _Stream:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_verbosity_is_the_bar_on_a_terminal_only():
    assert run_report.progress_verbosity(_Stream(True)) == 1
    assert run_report.progress_verbosity(_Stream(False)) == 2
    assert run_report.progress_verbosity(object()) == 2  # no isatty: not a terminal


def _run_cli(tmp_path, *, tty):
    """The README's main job, shortened: stdout is a pipe, or a pseudo-terminal if tty."""
    import os  # pylint: disable=import-outside-toplevel
    args = [sys.executable, "-m", "tf_tempered.experiments.train", "--dataset=digits",
            "--batch_size=64", "--learning_rate=0.5", "--epochs=2", f"--output_dir={tmp_path}"]
    if not tty:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
        return proc.returncode, proc.stdout, proc.stderr
    import pty  # pylint: disable=import-outside-toplevel
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdout=follower, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=300)
    return proc.returncode, b"".join(chunks).decode(), stderr


def _check_epoch_lines(lines):
    import re  # pylint: disable=import-outside-toplevel
    matches = [re.fullmatch(_EPOCH_LINE, line) for line in lines]
    assert all(matches), lines
    assert [int(m.group(1)) for m in matches] == [1, 2]
    steps = poisson_steps_per_epoch(num_examples=DIGITS_TRAIN, expected_batch_size=64)
    for epoch, m in zip((1, 2), matches):
        expected = compute_epsilon(num_examples=DIGITS_TRAIN, batch_size=64, noise_multiplier=1.1,
                                   steps=epoch * steps, delta=1e-5, sampling="poisson")
        assert m.group(6) == f"{expected:.4g}"
        assert 0 <= float(m.group(4)) <= 1 and math.isfinite(float(m.group(2)))
    return matches


def test_cli_prints_one_line_per_epoch_when_stdout_is_not_a_terminal(tmp_path):
    returncode, stdout, stderr = _run_cli(tmp_path, tty=False)
    assert returncode == 0, stderr[-3000:]
    assert "\r" not in stdout and "\b" not in stdout  # no progress bar updates
    lines = stdout.splitlines()
    # What ε does not cover, two epochs and the summary, nothing else.
    assert len(lines) == 4, stdout
    assert lines[0] == run_report.NOT_COVERED_NOTE
    matches = _check_epoch_lines(lines[1:3])
    metrics = _read(tmp_path / "metrics.json")
    assert lines[3].startswith(f"Test accuracy {metrics['test_accuracy']:.4f}; ε = ")
    # The printed numbers are the recorded ones.
    for m, record in zip(matches, metrics["history"]):
        assert float(m.group(2)) == pytest.approx(record["train_loss"], abs=5e-5)
        assert float(m.group(4)) == pytest.approx(record["dp_clipped_fraction"], abs=5e-4)
        assert float(m.group(5)) == pytest.approx(record["test_accuracy"], abs=5e-5)
    # The model was saved as .keras and loads in this Keras.
    model = keras.models.load_model(tmp_path / "model.keras", compile=False)
    assert model.count_params() == metrics["model"]["params"]


@pytest.mark.extended  # a pty subprocess (11 s); the off-terminal output is tested above
def test_cli_keeps_the_progress_bar_on_a_terminal(tmp_path):
    returncode, stdout, stderr = _run_cli(tmp_path, tty=True)
    assert returncode == 0, stderr[-3000:]
    assert "\r" in stdout or "\b" in stdout  # the bar redraws its line
    # The terminal turns \n into \r\n; each epoch still ends with its summary line.
    lines = [line.split("\r")[-1] for line in stdout.replace("\r\n", "\n").splitlines()]
    epoch_lines = [line for line in lines if line.startswith("Epoch ") and ": loss " in line]
    _check_epoch_lines(epoch_lines)


def test_augmult_shifts_and_flips_scatternet_features():
    # Shifted (and mirrored) images' features, precomputed: tests/test_augment.py trains on them.
    validate_config(TINY.replace(dataset="mnist", features="scatternet", augmult=4,
                                 augment_shift=1))
    validate_config(TINY.replace(dataset="mnist", features="scatternet", augmult=2,
                                 augment_shift=0, augment_flip=True))


def test_cosine_schedule_decays_the_learning_rate_to_zero_over_the_run():
    """--lr_schedule=cosine: lr·(1 + cos(π·t/T))/2 at step t of T, on the optimizer that trains."""
    config = TINY.replace(lr_schedule="cosine", epochs=3)
    plan = privacy_plan.plan_privacy(config, DIGITS_TRAIN)
    schedule = train_lib.learning_rate(config, plan)
    assert train_lib.learning_rate(TINY, plan) == 0.5  # constant: the float
    config_of = train_lib._make_optimizer(config, plan).get_config()["learning_rate"]
    assert config_of["class_name"] == "CosineDecay", config_of  # the optimizer has it
    total = 3 * poisson_steps_per_epoch(num_examples=DIGITS_TRAIN, expected_batch_size=128)
    assert plan.total_steps == total
    for step in (0, total // 3, total // 2, total):
        expected = 0.5 * 0.5 * (1 + math.cos(math.pi * step / total))
        assert float(schedule(step)) == pytest.approx(expected, abs=1e-6)
    result = train_lib.run_training(config, verbose=0)  # and it trains
    assert result["test_accuracy"] > 0.5


def test_weight_standardization_flag_builds_scaled_convolutions_on_scatternet_only():
    with pytest.raises(ConfigError, match="--weight_standardization applies to the ScatterNet "
                                          "CNN's convolutions only"):
        validate_config(TINY.replace(weight_standardization=True))
    with pytest.raises(ConfigError, match="--head=linear"):
        validate_config(TINY.replace(weight_standardization=True, features="scatternet",
                                     head="linear"))
    config = validate_config(TINY.replace(features="scatternet", activation="tanh",
                                          weight_standardization=True))
    dataset = types.SimpleNamespace(input_shape=(2, 2, 81), num_classes=10)
    model = model_builders.build_model(config, dataset)
    convs = [layer for layer in model.layers if "conv" in layer.name]
    assert [type(c).__name__ for c in convs] == ["WeightStandardizedConv2D"] * 2
    assert all(c.scaled for c in convs)
    plain = model_builders.build_model(config.replace(weight_standardization=False), dataset)
    assert plain.count_params() == model.count_params()
