"""One run-folder lifecycle for `revalidate`, `roofline` and `capacity`, and the policies they share.

Each command supplies only what differs (its settings, its children, its records, its tables);
everything a run folder needs happens here, in this order::

    probe(target)            device fields measured in a fresh child (RequestError if jax cannot start)
    open_run(...)            folder (new ``results/<stamp>-<name>/`` or --out) + logs/ · command.txt
                             (appended on --resume) · env.json (host env merged with the device,
                             the settings, and any extras the command adds)
    run.child(target, ...)   one fresh process (harness/isolate.py) under the run's timeout and
                             memory cap, its full stderr in logs/<name>.log
    run.record(kind, ...)    a record whose env block carries its own config hash and the device
                             that measured it; run.append(rec) validates and writes it at once
    finish(run, records)     summary.csv · plots/ (harness/plots.py) · "results: <folder>" line

Policies decided once, here: `CHILD_TIMEOUT_S` (a measuring child), `COMPILE_TIMEOUT_S` (a
deviceless compile for a TPU target), and the CPU layer format `CPU_LAYERS` with its reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHILD_TIMEOUT_S = 1800.0  # the reference harness's per-configuration limit
COMPILE_TIMEOUT_S = 900.0  # a deviceless compile for a TPU target (no step is run)
KV_LAYOUTS = ("contiguous", "paged")  # the engine's (EngineConfig.kv_layout): per-slot rows, or block pools
CPU_LAYERS = "f32"
CPU_LAYERS_REASON = (
    "CPU: W4A16 weights unpacked inside the step do not fuse on XLA's CPU backend (~21 ms per "
    "1536x12288 projection vs ~2.7 ms dense f32 at batch 1) and bf16 weights convert at ~1 GB/s, so "
    "layers are stored as dense f32 (the engine's CPU default, g4bench.engine.loading.default_format)"
)


class RequestError(ValueError):
    """An unusable request (no device, bad option, resume mismatch); the CLI exits with code 2."""


def on_cpu(platform: str | None) -> bool:
    """Whether a probed platform is the CPU (None: the probe did not say, so assume the CPU)."""
    return platform in (None, "cpu")


def safe_name(name: str) -> str:
    """A file-name-safe form of a configuration name (for its stderr log)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def probe(target: str = "harness.env:probe_child") -> dict[str, Any]:
    """The device fields (platform, device_kind, device_count), read in a fresh child."""
    from harness.env import probe_device
    from harness.results import is_failure

    device = probe_device(target=target)
    if is_failure(device):
        f = device["failure"]
        raise RequestError(f"could not start jax in a child process ({f['kind']}: {f['detail']})\n{f['stderr_tail']}")
    return device


def record_env(base_env: dict[str, Any], config: dict[str, Any], device: dict[str, Any] | None = None) -> dict[str, Any]:
    """The env block of one record: the run's, with this config's hash, the time now, and the device
    that measured it (a child's ``device`` fields, where it reported them)."""
    from harness.env import config_hash, merge_device, utc_now

    return merge_device({**base_env, "config_hash": config_hash(config), "timestamp_utc": utc_now()}, device)


@dataclass(frozen=True)
class RunFolder:
    """An open run folder: where records go, the env every record starts from, the child limits."""

    path: Path
    base_env: dict[str, Any]
    timeout_s: float
    mem_limit_bytes: int | None

    @property
    def run_id(self) -> str:
        return self.path.name

    def child(
        self, target: str, payload: dict[str, Any], log: str, *, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """``target(payload)`` in a fresh process: its result dict, or a failure record."""
        from harness.isolate import run_isolated

        return run_isolated(
            target,
            payload,
            timeout_s=self.timeout_s,
            mem_limit_bytes=self.mem_limit_bytes,
            env=env,
            stderr_log=self.path / "logs" / f"{safe_name(log)}.log",
        )

    def env_for(self, config: dict[str, Any], device: dict[str, Any] | None = None) -> dict[str, Any]:
        return record_env(self.base_env, config, device)

    def record(
        self, kind: str, name: str, config: dict[str, Any], device: dict[str, Any] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """A record of this run (not yet written; see `append`)."""
        from harness.results import make_record

        return make_record(kind, name, run_id=self.run_id, env=self.env_for(config, device), config=config, **fields)

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        """Validate `record` and append it to results.jsonl now (a killed run keeps it); returns it."""
        from harness.results import append_record

        append_record(self.path, record)
        return record


def open_run(
    *,
    out: Path | None,
    results_root: Path,
    short_name: str,
    argv: Sequence[str],
    settings: dict[str, Any],
    identity: dict[str, Any],
    device: dict[str, Any] | None,
    timeout_s: float,
    mem_limit_bytes: int | None,
    resume: bool = False,
    env_extra: dict[str, Any] | None = None,
) -> RunFolder:
    """Make (or reopen) the folder and write command.txt and env.json.

    `identity` is what the run-level config hash covers (the fields that define the measurement);
    `settings` is stored whole in env.json (``--resume`` reads it back)."""
    from harness.env import host_env, merge_device
    from harness.results import create_run_dir, write_command, write_env

    path = Path(out) if out is not None else create_run_dir(results_root, short_name)
    path.mkdir(parents=True, exist_ok=True)
    (path / "logs").mkdir(exist_ok=True)
    base_env = merge_device(host_env(identity), device)
    write_command(path, argv, append=resume)
    write_env(path, {**base_env, "settings": settings, **(env_extra or {})})
    return RunFolder(path=path, base_env=base_env, timeout_s=timeout_s, mem_limit_bytes=mem_limit_bytes)


def finish(run: RunFolder, records: Sequence[dict[str, Any]], console: Any, *, also: str = "") -> list[Path]:
    """Write summary.csv and every figure the records support; print where the run is. Returns the
    figure paths. `also` names the command's own extra files for the closing line."""
    from harness.plots import plot_run
    from harness.results import write_summary

    write_summary(run.path, records)
    paths = plot_run(run.path, console=console)
    for p in paths:
        console.print(f"wrote {p}", soft_wrap=True)
    extra = f", {also}" if also else ""
    console.print(f"results: {run.path}/ (results.jsonl, summary.csv, env.json, command.txt, logs/, plots/{extra})", soft_wrap=True)  # fmt: skip
    return paths


def failure_line(tag: str, result: dict[str, Any]) -> str | None:
    """The progress line of a child that failed (rich markup), or None if it did not fail."""
    from harness.results import is_failure

    if not is_failure(result):
        return None
    f = result["failure"]
    return f"[red]✗ {tag}: {f['kind']} — {f['detail']}[/red]"
