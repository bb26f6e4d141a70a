# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Build script; all metadata lives in setup.cfg."""

import setuptools

setuptools.setup()
