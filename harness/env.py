"""The `env` block: what produced a number (software, revision, device, host, configuration, time).

Every result record carries one, and each run folder has an `env.json`, so a number read months
later still says which code, which jax and which chip made it.

Data flow: the *parent* builds the host part with `host_env(config)` without importing jax (on a
TPU only one process may hold the chip, and the children need it); the *child* calls
`device_info()` after importing jax and returns it in its result; `merge_device` folds that into
the parent's block. `probe_device()` runs `device_info` in a throwaway child when the parent needs
the platform before any measurement (e.g. to choose CPU or accelerator defaults).

Fields: ``g4bench_version``, ``git_rev`` (``git rev-parse --short HEAD`` plus ``-dirty`` when the
tree has uncommitted changes; None outside a git checkout), ``jax_version``, ``jaxlib_version``,
``python_version``, ``os``, ``host``, ``config_hash`` (first 16 hex digits of the SHA-256 of the
canonical JSON of the configuration), ``timestamp_utc`` (ISO 8601), and from the child
``platform`` (jax backend: cpu, tpu, gpu), ``device_kind`` (e.g. "TPU v6 lite"), ``device_count``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import platform as _platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.results import is_failure

REPO_ROOT = Path(__file__).resolve().parents[1]
DEVICE_FIELDS = ("platform", "device_kind", "device_count")


def config_hash(config: Any) -> str:
    """First 16 hex digits of SHA-256 over the canonical (sorted-key, compact) JSON of `config`."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def git_revision(repo: Path = REPO_ROOT) -> str | None:
    """Short HEAD revision, with ``-dirty`` if tracked or untracked files differ; None without git.

    A repository without commits yet reports ``"uncommitted"`` (plus ``-dirty``).
    """
    try:
        inside = subprocess.run(
            ["git", "rev-parse", "--is-inside-work-tree"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if inside.returncode != 0:
            return None
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        )
        rev = head.stdout.strip() if head.returncode == 0 else "uncommitted"
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    dirty = status.returncode == 0 and status.stdout.strip() != ""
    return rev + ("-dirty" if dirty else "")


def _version(dist: str) -> str | None:
    """Installed version of distribution `dist`, without importing it."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def utc_now() -> str:
    """Current UTC time, ISO 8601 with seconds and a trailing Z."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def host_env(config: Any = None, *, git_rev: str | None = None) -> dict[str, Any]:
    """The env block without device fields (no jax import). `git_rev` overrides the git lookup."""
    from g4bench import __version__

    return {
        "g4bench_version": __version__,
        "git_rev": git_rev if git_rev is not None else git_revision(),
        "jax_version": _version("jax"),
        "jaxlib_version": _version("jaxlib"),
        "python_version": _platform.python_version(),
        "os": _platform.platform(),
        "host": socket.gethostname(),
        "config_hash": config_hash(config),
        "timestamp_utc": utc_now(),
        "platform": None,
        "device_kind": None,
        "device_count": None,
    }


def device_info() -> dict[str, Any]:
    """In a process that may use jax: backend platform, first device's kind, device count."""
    import jax

    devices = jax.devices()
    return {
        "platform": jax.default_backend(),
        "device_kind": devices[0].device_kind if devices else None,
        "device_count": len(devices),
    }


def probe_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated-child target for `probe_device`: returns `device_info()`."""
    return device_info()


def probe_device(timeout_s: float = 300.0, target: str = "harness.env:probe_child") -> dict[str, Any]:
    """`device_info()` measured in a fresh child, so this process never holds the device.

    Returns the device fields, or a failure record (``failure`` key) if the child could not start
    jax (a broken install, a chip held by another process).
    """
    from harness.isolate import run_isolated

    result = run_isolated(target, {}, timeout_s=timeout_s)
    if is_failure(result):
        return result
    return {k: result.get(k) for k in DEVICE_FIELDS}


def merge_device(env: dict[str, Any], device: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of `env` with the device fields taken from `device` (where present)."""
    out = dict(env)
    if device:
        out.update({k: device[k] for k in DEVICE_FIELDS if k in device})
    return out
