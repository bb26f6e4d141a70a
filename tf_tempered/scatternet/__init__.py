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
"""ScatterNet features (Tramèr & Boneh, ICLR 2021) and the models trained on them.

The 2-D scattering transform (Mallat; Oyallon & Mallat) of an image x with a
Gaussian low-pass φ_J and Morlet wavelets ψ_{j,θ} (scales j < J, L angles θ)::

    S0 x = x ⋆ φ_J                               (1 channel)
    S1 x = |x ⋆ ψ_{j1,θ1}| ⋆ φ_J                  (J·L channels)
    S2 x = ||x ⋆ ψ_{j1,θ1}| ⋆ ψ_{j2,θ2}| ⋆ φ_J    (j1 < j2: L²·J(J-1)/2 channels)

each subsampled by 2^J. For J=2, L=8 a 28×28 image gives 1 + 16 + 64 = 81
channels at 7×7. The transform is fixed and public (no parameter is learned from
the data), so computing it costs no privacy.

Layout: channels-last ``[N, H / 2^J, W / 2^J, C · K]`` with K = :func:`num_channels`;
channel ``c · K + k`` is kymatio's coefficient k of input channel c (k = 0 is S0,
then S1 by (j1, θ1), then S2 by (j1, θ1, j2, θ2)).

Modules, each importing only those before it:

- ``transform``: the transform (kymatio's filters, computed faster, in threads);
- ``cache``: the cache folder (``$TF_TEMPERED_CACHE_DIR/scatternet``), file names, row reads;
- ``codes``: 8-bit logarithmic codes ("log8" storage: 1 byte a feature, ≤ 2.2% relative error);
- ``features``: :func:`scattering_features`, computed once per image array and cached;
- ``shifted_rows``: :class:`ShiftedFeatures` (and one variant of it, ``VariantRows``), the
  cached shifted and mirrored copies, read per batch from disk;
- ``shifted``: :func:`shifted_scattering_features`, which computes and caches them, for
  augmentation multiplicity;
- ``heads``: :func:`scatternet_cnn` and :func:`scatternet_linear`, and :class:`FeaturePower`
  (an optional power-law compression of the features before them; no kymatio needed).

Needs kymatio (a dependency of tf_tempered; ``pip install "kymatio>=0.3"``) for the
features only.
"""

from tf_tempered.scatternet.cache import CACHE_DIR_ENV, default_cache_dir
from tf_tempered.scatternet.features import scatter_dataset, scattering_features
from tf_tempered.scatternet.heads import FeaturePower, scatternet_cnn, scatternet_linear
from tf_tempered.scatternet.shifted import shifted_scattering_features
from tf_tempered.scatternet.shifted_rows import ShiftedFeatures, VariantRows
from tf_tempered.scatternet.transform import INSTALL_HINT, num_channels

__all__ = ["num_channels", "scattering_features", "shifted_scattering_features",
           "ShiftedFeatures", "VariantRows", "scatter_dataset", "scatternet_cnn",
           "scatternet_linear",
           "FeaturePower",
           "default_cache_dir", "CACHE_DIR_ENV", "INSTALL_HINT"]
