"""Test-wide setup: JAX runs on the CPU (libtpu may be installed and must not grab a TPU or print
init noise), and compiled programs are cached on disk across test processes and runs, so a second
run of the suite skips most compiles (the tiny configs compile far longer than they run)."""

import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path.home() / ".cache" / "g4bench" / "jax-test-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
