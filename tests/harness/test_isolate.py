"""harness.isolate: a child's result line comes back; every way a child can die becomes a failure record.

The children are the functions at the bottom of this file, run as ``<this file>:<function>`` in a
fresh interpreter (they import nothing heavy, so each spawn costs a fraction of a second).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from harness.isolate import RESULT_PREFIX, child_env, child_main, is_oom_text, run_isolated

HERE = Path(__file__).resolve()


def target(fn: str) -> str:
    return f"{HERE}:{fn}"


# ------------------------------------------------------------------------------------ the children


def echo_child(payload: dict) -> dict:
    print("human chatter that must not reach stdout")
    sys.stderr.write("working on it\n")
    return {
        "echo": payload,
        "cache_dir": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
        "min_compile": os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"),
    }


def raise_child(payload: dict) -> dict:
    raise RuntimeError("the kernel is numerically wrong")


def xla_oom_child(payload: dict) -> dict:
    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes")


def alloc_child(payload: dict) -> dict:
    blob = bytearray(payload["nbytes"])  # past RLIMIT_AS: MemoryError
    return {"len": len(blob)}


def sigkill_child(payload: dict) -> dict:
    sys.stderr.write("about to be killed\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def segv_child(payload: dict) -> dict:
    os.kill(os.getpid(), signal.SIGSEGV)
    return {}


def hang_child(payload: dict) -> dict:
    time.sleep(600)
    return {}


def silent_exit_child(payload: dict) -> dict:
    os._exit(0)


def bad_return_child(payload: dict) -> list:
    return [1, 2, 3]


# ------------------------------------------------------------------------------------------- tests


def test_success_round_trip_and_cache_env(tmp_path):
    log = tmp_path / "child.log"
    res = run_isolated(target("echo_child"), {"a": 1, "b": [1, 2]}, timeout_s=60, stderr_log=log)
    assert "failure" not in res
    assert res["echo"] == {"a": 1, "b": [1, 2]}
    assert res["min_compile"] == "0"
    assert res["cache_dir"] and Path(res["cache_dir"]).is_dir()
    assert res["wall_s"] > 0
    text = log.read_text()
    assert "working on it" in text
    assert "human chatter" in text  # print() in the child went to stderr, not the result channel


def test_exception_becomes_crash_with_type():
    res = run_isolated(target("raise_child"), {}, timeout_s=60)
    f = res["failure"]
    assert f["kind"] == "crash"
    assert f["exception_type"] == "RuntimeError"
    assert "numerically wrong" in f["detail"]
    assert f["returncode"] == 1
    assert "Traceback" in f["stderr_tail"]


def test_resource_exhausted_message_is_oom():
    res = run_isolated(target("xla_oom_child"), {}, timeout_s=60)
    assert res["failure"]["kind"] == "oom"


def test_memory_limit_turns_allocation_into_oom():
    res = run_isolated(target("alloc_child"), {"nbytes": 2 * 2**30}, timeout_s=60, mem_limit_bytes=1 * 2**30)
    assert res["failure"]["kind"] == "oom"
    assert res["failure"]["exception_type"] == "MemoryError"


def test_sigkill_is_oom_and_keeps_stderr_tail():
    res = run_isolated(target("sigkill_child"), {}, timeout_s=60)
    f = res["failure"]
    assert f["kind"] == "oom"
    assert f["returncode"] == -signal.SIGKILL
    assert "about to be killed" in f["stderr_tail"]


def test_other_signal_is_crash():
    res = run_isolated(target("segv_child"), {}, timeout_s=60)
    assert res["failure"]["kind"] == "crash"
    assert "SIGSEGV" in res["failure"]["detail"]


def test_timeout_kills_and_reports():
    t0 = time.perf_counter()
    res = run_isolated(target("hang_child"), {}, timeout_s=1.5)
    assert time.perf_counter() - t0 < 30
    assert res["failure"]["kind"] == "timeout"
    assert res["wall_s"] >= 1.5


def test_missing_result_line_is_no_result():
    res = run_isolated(target("silent_exit_child"), {}, timeout_s=60)
    assert res["failure"]["kind"] == "no_result"
    assert res["failure"]["returncode"] == 0


def test_non_dict_return_is_crash():
    res = run_isolated(target("bad_return_child"), {}, timeout_s=60)
    assert res["failure"]["kind"] == "crash"
    assert res["failure"]["exception_type"] == "TypeError"


def test_bad_target_is_crash():
    res = run_isolated("harness.no_such_module:fn", {}, timeout_s=60)
    assert res["failure"]["kind"] == "crash"
    assert res["failure"]["exception_type"] == "ModuleNotFoundError"


def test_child_main_in_process(capfd):
    assert child_main(lambda p: {"x": p["x"] + 1}, ['{"x": 41}']) == 0
    out = capfd.readouterr().out.strip().splitlines()
    assert out[-1].startswith(RESULT_PREFIX)
    assert json.loads(out[-1][len(RESULT_PREFIX) :]) == {"x": 42}


def test_cache_dir_override(tmp_path, monkeypatch):
    monkeypatch.setenv("G4BENCH_JAX_CACHE_DIR", str(tmp_path / "cache"))
    env = child_env()
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cache")
    assert (tmp_path / "cache").is_dir()


@pytest.mark.parametrize(
    "text,expected",
    [
        ("RESOURCE_EXHAUSTED: foo", True),
        ("terminate called after throwing an instance of 'std::bad_alloc'", True),
        ("ValueError: x", False),
    ],
)
def test_is_oom_text(text, expected):
    assert is_oom_text(text) is expected


def test_loader_out_of_address_space_is_oom():
    """Under RLIMIT_AS glibc can fail before Python runs ("cannot allocate memory for thread-local
    data", exit 127): that is a probe that does not fit, not a crash that stops a bisection."""
    assert is_oom_text("cannot allocate memory for thread-local data: ABORT")
