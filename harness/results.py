"""Result records and run folders: build, validate, append, read back, tabulate.

A *record* is one JSON object per measurement (one of the models in harness/records.py; the JSON
Schema harness/schema/result.schema.json is generated from them), with units in field names and an
`env` block (harness/env.py). A *run folder* ``results/<run-id>/``
holds::

    results.jsonl   one record per line: measurements, failures, derived ratio records
    summary.csv     the records flattened into a table (pandas), env and raw samples left out
    command.txt     the exact command line that produced the run
    env.json        the run-level env block and the settings the run was made with
    logs/           each child's full stderr (the records keep only a tail)
    plots/          figures written by `g4bench plot`

Data flow: a sweep calls `create_run_dir` (or reopens one with `--resume`), `write_command`,
`write_env`, then `append_record` per configuration (validated before it touches the file, and
flushed, so a killed sweep keeps what it measured), then `write_summary`. Readers (`gate`, `plot`,
`--resume`) use `read_records` / `read_run`, which raise `RunError` with the line number on a
malformed file rather than guessing.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "result.schema.json"  # from harness/records.py

BASELINES_DIR = Path(__file__).resolve().parents[1] / "configs" / "baselines"
RECORDS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.csv"
COMMAND_FILE = "command.txt"
ENV_FILE = "env.json"

# Columns that are lists or nested blocks: kept in results.jsonl, left out of summary.csv.
_SUMMARY_DROP = ("env", "step_ms_samples", "gate_metrics")


class RecordError(ValueError):
    """A record does not match the result schema (message names the field)."""


class RunError(ValueError):
    """A run folder is missing, empty or holds malformed records."""


@functools.cache
def schema() -> dict[str, Any]:
    """The result-record JSON Schema (draft 2020-12), loaded once."""
    return json.loads(SCHEMA_PATH.read_text())


@functools.cache
def _validator() -> Any:
    import jsonschema

    cls = jsonschema.validators.validator_for(schema())
    cls.check_schema(schema())
    return cls(schema())


def validate_record(record: dict[str, Any]) -> None:
    """Raise `RecordError` naming the first offending field if `record` breaks the schema."""
    errors = sorted(_validator().iter_errors(record), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.absolute_path) or "<record>"
        name = record.get("name", "?") if isinstance(record, dict) else "?"
        raise RecordError(f"record {name!r}: {where}: {err.message}")


def make_record(
    kind: str,
    name: str,
    *,
    run_id: str,
    env: dict[str, Any],
    config: dict[str, Any],
    **fields: Any,
) -> dict[str, Any]:
    """A record with the common fields first, then `fields` (metrics or a `failure` block)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "name": name,
        "run_id": run_id,
        "env": env,
        "config": config,
        **fields,
    }


def is_failure(record: dict[str, Any]) -> bool:
    """Whether `record` reports a measurement that did not complete."""
    return "failure" in record


# ---------------------------------------------------------------------------------------- run folders


def new_run_id(short_name: str, now: dt.datetime | None = None) -> str:
    """``YYYYMMDDTHHMMSSZ-<short-name>`` (UTC), e.g. ``20260730T101500Z-revalidate``."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", short_name).strip("-") or "run"
    return f"{stamp}-{slug}"


def create_run_dir(root: Path, short_name: str) -> Path:
    """Make a new ``root/<run-id>/`` folder (never reusing an existing one) and return it."""
    root.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id(short_name)
    path = root / run_id
    suffix = 1
    while path.exists():
        suffix += 1
        path = root / f"{run_id}-{suffix}"
    path.mkdir()
    return path


def run_id_of(run_dir: Path) -> str:
    """The run id of a folder: its name."""
    return Path(run_dir).resolve().name


def write_command(run_dir: Path, argv: Sequence[str], *, append: bool = False) -> Path:
    """Write the exact command line (shell-quoted) to command.txt; `append` adds a line (a resumed
    run keeps every command that contributed to it). Returns the path."""
    path = Path(run_dir) / COMMAND_FILE
    with path.open("a" if append else "w", encoding="utf-8") as fh:
        fh.write(shlex.join(argv) + "\n")
    return path


def write_env(run_dir: Path, env: dict[str, Any]) -> Path:
    """Write the run-level env block (and settings) to env.json; returns the path."""
    path = Path(run_dir) / ENV_FILE
    path.write_text(json.dumps(env, indent=2, sort_keys=True) + "\n")
    return path


def read_env(run_dir: Path) -> dict[str, Any]:
    """The run's env.json, or `RunError` if it is missing or not a JSON object."""
    path = Path(run_dir) / ENV_FILE
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise RunError(f"{path} not found") from exc
    except json.JSONDecodeError as exc:
        raise RunError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise RunError(f"{path}: expected a JSON object")
    return value


def append_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Validate `record` and append it as one line to results.jsonl (flushed and fsynced)."""
    validate_record(record)
    line = json.dumps(record, allow_nan=False, separators=(",", ":"))
    with (Path(run_dir) / RECORDS_FILE).open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def rewrite_records(run_dir: Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace results.jsonl with `records` atomically (validated; temp file then rename)."""
    path = Path(run_dir) / RECORDS_FILE
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for rec in records:
            validate_record(rec)
            fh.write(json.dumps(rec, allow_nan=False, separators=(",", ":")) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_records(run_dir: Path, *, validate: bool = True) -> list[dict[str, Any]]:
    """All records of a run folder, in file order.

    Raises `RunError` if the folder or results.jsonl is missing, or a line is not a JSON object
    or (with `validate`) breaks the schema; the message gives the file and line number.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"{run_dir} is not a directory")
    path = run_dir / RECORDS_FILE
    if not path.is_file():
        raise RunError(f"{path} not found (is {run_dir} a run folder?)")
    records: list[dict[str, Any]] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RunError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
        if not isinstance(rec, dict):
            raise RunError(f"{path}:{lineno}: expected a JSON object")
        if validate:
            try:
                validate_record(rec)
            except RecordError as exc:
                raise RunError(f"{path}:{lineno}: {exc}") from exc
        records.append(rec)
    return records


# ------------------------------------------------------------------------------------------- pandas


def records_frame(records: Sequence[dict[str, Any]]) -> Any:
    """Records as a pandas DataFrame: one row each, `config.*` and `failure.*` flattened.

    The env block, raw samples and gate hints are dropped (they stay in results.jsonl); the
    stderr tail of a failure is dropped too (it is in the record and the child's log).
    """
    import pandas as pd

    rows = []
    for rec in records:
        row = {k: v for k, v in rec.items() if k not in _SUMMARY_DROP}
        row["platform"] = rec.get("env", {}).get("platform")
        row["device_kind"] = rec.get("env", {}).get("device_kind")
        rows.append(row)
    frame = pd.json_normalize(rows, sep=".")
    frame = frame.drop(columns=[c for c in frame.columns if c == "failure.stderr_tail"])
    # Nullable dtypes: integer columns stay integers even where other kinds leave them empty.
    return frame.convert_dtypes()


def write_summary(run_dir: Path, records: Sequence[dict[str, Any]] | None = None) -> Path:
    """Write summary.csv for the run (reading results.jsonl when `records` is None)."""
    recs = read_records(run_dir) if records is None else records
    path = Path(run_dir) / SUMMARY_FILE
    records_frame(recs).to_csv(path, index=False)
    return path


def read_run(run_dir: Path) -> Any:
    """A run folder's records as a DataFrame (see `records_frame`)."""
    return records_frame(read_records(run_dir))


def load_baseline(name: str) -> Any:
    """A baseline table from configs/baselines/<name>.csv as a DataFrame (see its README)."""
    import pandas as pd

    path = BASELINES_DIR / f"{name}.csv"
    if not path.is_file():
        available = sorted(p.stem for p in BASELINES_DIR.glob("*.csv"))
        raise FileNotFoundError(f"no baseline {name!r} in {BASELINES_DIR}; available: {available}")
    return pd.read_csv(path)
