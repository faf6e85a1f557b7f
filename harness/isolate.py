"""Run one measurement in a fresh child process and get back one record, or a failure record.

Why: a decode step measured after other configurations ran in the same process inherits their
allocator state, compile caches and fragmentation; an OOM kills the whole sweep. The reference
engine's numbers only became trustworthy once every configuration ran in its own process
(../shared/reference/seed-engine-notes.md §3.2). On a TPU a second reason: only one process may
hold the chip, so the parent never initialises a JAX backend itself.

Data flow::

    parent: run_isolated("pkg.mod:fn", payload, timeout_s, mem_limit_bytes)
      └─ spawns  python -m harness.isolate pkg.mod:fn '<payload json>'   (new session, env below)
           child: child_main(fn) → payload = json.loads(argv) → result = fn(payload)
                  human output → stderr; stdout gets exactly one final line
                  G4BENCH_RESULT {"...": ...}
      parent: waits (timeout), keeps the stderr tail, parses the last result line → dict

The target is ``"module:function"`` or ``"/path/to/file.py:function"``; the function takes the
payload dict and returns a JSON-serialisable dict. Exceptions in the child become a result with a
``failure`` field (the exception type in ``detail``); deaths the child cannot report (SIGKILL from
the kernel OOM killer, a segfault, a hang) are classified by the parent. A failure record is::

    {"failure": {"kind": "oom" | "timeout" | "crash" | "no_result",
                 "detail": str, "stderr_tail": str, "returncode": int | None}}

Environment given to every child: a persistent JAX compilation cache shared by all children
(``JAX_COMPILATION_CACHE_DIR``, default ``~/.cache/g4bench/jax-cache``, override with
``G4BENCH_JAX_CACHE_DIR``) with ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0`` so every compile
is cached; jax reads both at import. Children that import jax should still call
`configure_jax_cache` before compiling, which sets the same options explicitly. Compile time is
therefore a separate field (``compile_s``) from step time in every record: with a warm cache it
measures a cache load, not a compile.

Memory cap: ``mem_limit_bytes`` sets RLIMIT_AS (virtual address space) in the child before exec.
XLA reserves far more address space than it touches, so use generous caps for JAX children; the
cap is exact for host-memory children (and is how the tests inject an OOM).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.results import is_failure

RESULT_PREFIX = "G4BENCH_RESULT "
DEFAULT_JAX_CACHE_DIR = Path("~/.cache/g4bench/jax-cache")
STDERR_TAIL_LINES = 40
FAILURE_KINDS = ("oom", "timeout", "crash", "no_result")

# Text in the stderr tail (or an exception message) that means the child ran out of memory.
_OOM_MARKERS = (
    "RESOURCE_EXHAUSTED",
    "MemoryError",
    "std::bad_alloc",
    "Out of memory",
    "out of memory",
    "Cannot allocate memory",
    "cannot allocate memory",  # glibc under RLIMIT_AS: "cannot allocate memory for thread-local data"
    "RuntimeBufferAllocationFailure",
)


def jax_cache_dir() -> Path:
    """The persistent compilation cache directory shared by all children (created on demand)."""
    raw = os.environ.get("G4BENCH_JAX_CACHE_DIR") or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    path = Path(raw).expanduser() if raw else DEFAULT_JAX_CACHE_DIR.expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


# XLA's CPU runtime mallocs each execution's temporaries (and a copying step's new cache) afresh.
# Above glibc's 32 MiB mmap ceiling every such buffer is a fresh mapping faulted in 4 KiB pages:
# measured on the 2-core dev box, `small` at batch 8 / ctx 8192 took ~53,300 minor faults per
# donated step (~250 ms/step) and 86,000-110,000 per copying step (320-690 ms, the spread was the
# faults). glibc >= 2.35's `hugetlb=1` tunable madvises those mappings for transparent huge pages
# (the kernel's THP mode is usually "madvise"): ~670 faults and ~190 ms donated, 185-240 ms copying.
# A device allocator pools its buffers, so without this the CPU measures the kernel's page zeroing
# rather than the step. Unknown tunables are ignored (musl, old glibc), so it is always safe to set.
MALLOC_HUGEPAGE_TUNABLE = "glibc.malloc.hugetlb=1"


def host_tuning_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with `MALLOC_HUGEPAGE_TUNABLE` added to
    GLIBC_TUNABLES, unless the caller already chose a glibc.malloc.hugetlb value."""
    env = dict(os.environ if base is None else base)
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in tunables:
        env["GLIBC_TUNABLES"] = f"{tunables}:{MALLOC_HUGEPAGE_TUNABLE}" if tunables else MALLOC_HUGEPAGE_TUNABLE
    return env


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment with the host tuning (`host_tuning_env`), the shared JAX
    compilation cache settings and `extra`."""
    env = host_tuning_env()
    env["JAX_COMPILATION_CACHE_DIR"] = str(jax_cache_dir())
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def configure_jax_cache() -> None:
    """In a child that uses jax: point jax at the shared cache and cache every compile."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(jax_cache_dir()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def is_oom_text(text: str) -> bool:
    """Whether `text` (an exception message or stderr) reports an out-of-memory condition."""
    return any(marker in text for marker in _OOM_MARKERS)


def failure(kind: str, detail: str, stderr_tail: str = "", returncode: int | None = None) -> dict[str, Any]:
    """A failure record: ``{"failure": {kind, detail, stderr_tail, returncode}}``."""
    if kind not in FAILURE_KINDS:
        raise ValueError(f"unknown failure kind {kind!r}; expected one of {FAILURE_KINDS}")
    return {"failure": {"kind": kind, "detail": detail, "stderr_tail": stderr_tail, "returncode": returncode}}


# --------------------------------------------------------------------------------------------- child


def resolve_target(target: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Import ``"module:function"`` or ``"/path/file.py:function"`` and return the function."""
    module_name, sep, func_name = target.rpartition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"target must look like 'module:function' or 'file.py:function', got {target!r}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        spec = importlib.util.spec_from_file_location(f"_g4bench_target_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    fn = getattr(module, func_name)
    if not callable(fn):
        raise TypeError(f"{target} is not callable")
    return fn


def _exception_failure(exc: BaseException) -> dict[str, Any]:
    """Turn an exception raised by the child's function into a failure result."""
    text = f"{type(exc).__name__}: {exc}"
    kind = "oom" if isinstance(exc, MemoryError) or is_oom_text(text) else "crash"
    tb = "".join(traceback.format_exception(exc))
    rec = failure(kind, text[:2000], stderr_tail=tb[-4000:])
    rec["failure"]["exception_type"] = type(exc).__name__
    return rec


def emit_result(result: dict[str, Any]) -> None:
    """Write the one machine-readable line to the real stdout and flush."""
    out = sys.__stdout__
    assert out is not None, "the child has no real stdout to report on"
    out.write(RESULT_PREFIX + json.dumps(result, allow_nan=False, default=str) + "\n")
    out.flush()


def child_main(fn: Callable[[dict[str, Any]], dict[str, Any]], argv: list[str] | None = None) -> int:
    """Run `fn` on the JSON payload in ``argv[-1]`` and print its ``G4BENCH_RESULT`` line.

    Anything `fn` prints goes to stderr, so stdout carries exactly one result line. An exception
    (including MemoryError) becomes a failure result carrying the exception type; the exit code is
    then 1, so the parent sees both the record and a non-zero status.
    """
    args = sys.argv[1:] if argv is None else argv
    payload = json.loads(args[-1]) if args else {}
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = fn(payload)
        if not isinstance(result, dict):
            raise TypeError(f"child function returned {type(result).__name__}, expected dict")
    except (Exception, MemoryError) as exc:  # noqa: BLE001 -- recorded with its traceback, never swallowed
        tail = _exception_failure(exc)
        sys.stderr.write(tail["failure"]["stderr_tail"])
        emit_result(tail)
        return 1
    emit_result(result)
    return 0


def _main() -> int:
    """``python -m harness.isolate TARGET PAYLOAD_JSON``: import TARGET and run it via child_main."""
    if len(sys.argv) != 3:
        sys.stderr.write("usage: python -m harness.isolate module:function '<payload json>'\n")
        return 2
    try:
        fn = resolve_target(sys.argv[1])
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        emit_result(_exception_failure(exc))
        return 1
    return child_main(fn, sys.argv[2:])


# -------------------------------------------------------------------------------------------- parent


def _mem_limit_preexec(mem_limit_bytes: int | None) -> Callable[[], None] | None:
    """A preexec_fn that caps the child's address space (RLIMIT_AS) at `mem_limit_bytes`."""
    if mem_limit_bytes is None:
        return None

    def _apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit_bytes, mem_limit_bytes))

    return _apply


def _parse_result(stdout_lines: list[str]) -> dict[str, Any] | None:
    """The JSON of the last ``G4BENCH_RESULT`` line, or None if there is none or it is not JSON."""
    for line in reversed(stdout_lines):
        if line.startswith(RESULT_PREFIX):
            try:
                value = json.loads(line[len(RESULT_PREFIX) :])
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _classify_death(returncode: int, stderr_tail: str, mem_limit_bytes: int | None) -> dict[str, Any]:
    """Failure record for a child that exited without a usable result line."""
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        if sig == signal.SIGKILL:
            return failure(
                "oom", f"killed by {name} (most likely the kernel OOM killer)", stderr_tail, returncode
            )
        if is_oom_text(stderr_tail):
            return failure("oom", f"killed by {name} after an out-of-memory error", stderr_tail, returncode)
        return failure("crash", f"killed by {name}", stderr_tail, returncode)
    if is_oom_text(stderr_tail):
        cap = f" (RLIMIT_AS {mem_limit_bytes} bytes)" if mem_limit_bytes else ""
        return failure(
            "oom", f"exit status {returncode} after an out-of-memory error{cap}", stderr_tail, returncode
        )
    if returncode == 0:
        return failure(
            "no_result", f"exited 0 without a {RESULT_PREFIX.strip()} line", stderr_tail, returncode
        )
    return failure("crash", f"exit status {returncode} without a result line", stderr_tail, returncode)


def run_isolated(
    target: str,
    payload: dict[str, Any],
    timeout_s: float,
    mem_limit_bytes: int | None = None,
    *,
    env: dict[str, str] | None = None,
    stderr_log: Path | None = None,
    tail_lines: int = STDERR_TAIL_LINES,
) -> dict[str, Any]:
    """Run ``target(payload)`` in a fresh Python process; return its result dict or a failure record.

    - `timeout_s`: wall-clock limit; on expiry the child's whole process group gets SIGKILL and
      the result is a ``timeout`` failure.
    - `mem_limit_bytes`: RLIMIT_AS for the child (None = no cap).
    - `env`: extra environment variables on top of `child_env()`.
    - `stderr_log`: if given, the child's full stderr is written there (the record keeps the tail).

    Every returned dict has ``wall_s`` (child start to exit). A success is the child's dict as
    returned; a failure has a ``failure`` field (see module docstring), with the child's own
    partial fields kept when it managed to report.
    """
    cmd = [sys.executable, "-m", "harness.isolate", target, json.dumps(payload, allow_nan=False)]
    tail: deque[str] = deque(maxlen=tail_lines)
    stdout_lines: list[str] = []
    log = stderr_log.open("w", encoding="utf-8") if stderr_log is not None else None
    repo_root = str(Path(__file__).resolve().parents[1])
    extra = dict(env or {})
    extra["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, os.environ.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=child_env(extra),
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group, so a timeout kills grandchildren too
        preexec_fn=_mem_limit_preexec(mem_limit_bytes),
    )

    def _drain_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.append(line)
            if log is not None:
                log.write(line)

    def _drain_stdout() -> None:
        assert proc.stdout is not None
        stdout_lines.extend(line.rstrip("\n") for line in proc.stdout)

    readers = [
        threading.Thread(target=_drain_stderr, daemon=True),
        threading.Thread(target=_drain_stdout, daemon=True),
    ]
    for t in readers:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except BaseException:
        # Ctrl-C or any error in the parent: the child sits in its own session and would not get
        # the terminal's SIGINT, so kill its process group rather than leave it running.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        for t in readers:
            t.join(timeout=10)
        if log is not None:
            log.close()
    wall_s = time.perf_counter() - start
    stderr_tail = "".join(tail)
    returncode = proc.returncode

    if timed_out:
        rec = failure(
            "timeout", f"no result within {timeout_s:g} s; process group killed", stderr_tail, returncode
        )
    else:
        parsed = _parse_result(stdout_lines)
        if parsed is None:
            rec = _classify_death(returncode, stderr_tail, mem_limit_bytes)
        elif is_failure(parsed):
            rec = parsed
            fail = rec["failure"]
            fail["returncode"] = returncode
            fail["stderr_tail"] = stderr_tail or fail.get("stderr_tail", "")
        else:
            rec = parsed
    rec["wall_s"] = wall_s
    return rec


if __name__ == "__main__":
    sys.exit(_main())
