"""Fixtures of the revalidate tests."""

from __future__ import annotations

import pytest

from tests.harness.revalidate.fakes import HERE


@pytest.fixture
def fake_env(monkeypatch, tmp_path):
    """A run of `g4bench revalidate` with the fake child and device probe (tests/harness/revalidate/fakes.py)."""
    monkeypatch.setenv("G4BENCH_REVALIDATE_CHILD", f"{HERE}:fake_child")
    monkeypatch.setenv("G4BENCH_REVALIDATE_PROBE", f"{HERE}:fake_probe")
    monkeypatch.setenv("G4BENCH_JAX_CACHE_DIR", str(tmp_path / "jax-cache"))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "ran.txt"))
    monkeypatch.chdir(tmp_path)
    return tmp_path
