import sys, collections
sys.path.insert(0, "benchmarks")
import dp_step
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, make_private
m = dp_step._model(sys.argv[1])
make_private(m)
m.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=0.1),
          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"))
ds = dp_step._dataset(sys.argv[1], 256)
m.fit(ds.take(1), verbose=0)
batch = next(iter(ds))
cf = tf.function(m.train_step).get_concrete_function(batch)
gd = cf.graph.as_graph_def()
c = collections.Counter(n.op for n in gd.node)
for f in gd.library.function:
    c.update(n.op for n in f.node_def)
print(sum(c.values()), len(gd.library.function), sorted(c.items(), key=lambda kv: -kv[1])[:50])
