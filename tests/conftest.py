"""Test-wide setup: JAX runs on the CPU (libtpu may be installed and must not grab a TPU or print
init noise), and compiles are cached across test processes to keep the suite fast."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
