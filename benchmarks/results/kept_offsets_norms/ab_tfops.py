"""In-process A/B of the MNIST CNN's TF-ops DP step (EngineOptions(native=False)): the per-example
kernel gradients' norms as one reduction over axes [0, 2] (old) against the column sum first
(rows.kept_offsets_kernel, new). Each variant is tf.function(model.train_step) of its own model,
traced under its variant, timed in interleaved rounds of 10 steps.

    TF_TEMPERED_ROOT=<checkout> python ab_tfops.py ROUNDS nonprivate,new,old,new2,old2

A variant chunkN is `new` with EngineOptions(depthwise_chunk=N) (examples per depthwise backprop).
"""
import os
import sys


ROOT = os.environ.get("TF_TEMPERED_ROOT", ".")
sys.path.insert(0, ROOT + "/benchmarks")
sys.path.insert(0, ROOT)
import dp_step  # noqa: E402
import interleaved  # noqa: E402
from tf_tempered._compat import tf  # noqa: E402
from tf_tempered.privacy import EngineOptions  # noqa: E402
from tf_tempered.privacy.layer_grads import rows  # noqa: E402

data = next(iter(dp_step._dataset("mnist", 256)))
new_kept = rows.kept_offsets_kernel


def old_kept(per_row, num_microbatches):  # the code before rows.kept_offsets_kernel
    middle = tf.reduce_sum(tf.reshape(
        per_row, [per_row.shape[0], num_microbatches, -1, per_row.shape[-1]]), 2)

    def materialized_sum(weights):
        kept = weights.zero_nonfinite(middle, axis=1)
        return tf.matmul(tf.cast(weights.scale, kept.dtype)[None, None, :], kept)

    return rows.KernelGrads(tf.reduce_sum(tf.square(middle), [0, 2]), materialized_sum)


def dp_model(name):
    chunk = int(name[5:]) if name.startswith("chunk") else EngineOptions().depthwise_chunk
    return interleaved.mnist_dp_model(EngineOptions(native=False, depthwise_chunk=chunk))


variants = sys.argv[2].split(",")
steps = {}
for name in variants:
    model = dp_step._compiled("nonprivate", "mnist", 256) if name == "nonprivate" else dp_model(name)
    rows.kept_offsets_kernel = old_kept if name.startswith("old") else new_kept
    steps[name] = tf.function(model.train_step)
    for _ in range(5):
        steps[name](data)
    rows.kept_offsets_kernel = new_kept
interleaved.report(interleaved.time_rounds(steps, data, int(sys.argv[1])))
