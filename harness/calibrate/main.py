"""`g4bench calibrate`: fit a step-time profile (harness/calibrate/steptime.py) from measured steps, validate it.

Data flow::

    points  ← run folders (harness.results.read_records: kind revalidate / roofline, records with
              config.{model,layers,ple,kv_dtype,donate,sliding_kv,batch,ctx} and step_ms_median)
            ← or the reference engine's v6e tables (configs/baselines/jax-reference-steptime-v6e1.csv,
              rows tagged fit / holdout / reallocation)
    features = steptime.features_of(costs.decode_cost(config))   (cache_len = ctx unless stated)
    fit:  for each overlap exponent p in P_GRID, least squares on relative error (coefficients ≥ 0,
          several starts); p is chosen by the leave-one-out median |error| on the fit points only
    validate: residuals, LOO, and prediction (no refit) of held-out points
    → Profile → configs/profiles/<device>.toml (provenance, coefficients, every point)

Relative error is minimized because points span 11–83 ms and a planner cares about percent.
"""

from __future__ import annotations

import datetime as dt
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.calibrate.steptime import COEFFS, FEATURES, PROGRAMS, Profile, StepModel, features_of, predict_ms

PROFILE_DIR = Path(__file__).resolve().parents[2] / "configs" / "profiles"
P_GRID = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
STARTS = ((1.0, 0.8, 2.0, 0.9, 20.0), (2.0, 0.1, 1.0, 0.8, 80.0), (0.5, 1.5, 3.0, 1.0, 40.0))
REFERENCE_CSV = "jax-reference-steptime-v6e1"
KINDS = ("revalidate", "roofline", "engine-steps")


class CalibrateError(ValueError):
    """Unusable input: no points, a run folder without step times."""


@dataclass
class Point:
    """One measured step: its configuration, the measured median and where it came from."""

    config: dict[str, Any]
    measured_ms: float
    source: str
    role: str = "fit"  # fit | holdout | reallocation
    feats: dict[str, float] = field(default_factory=dict)

    @property
    def program(self) -> str:
        return str(self.config.get("program", "decode"))

    @property
    def label(self) -> str:
        c = self.config
        if "program" in c:  # engine-steps: one engine call as served
            return f"{c['program']}/slots{c['max_slots']}/rows{c['rows']}/T{c['tokens']}/kv{c['kv_len']}"
        step = "donated" if c["donate"] else "copying"
        return f"ple-{c['ple']}/kv-{c['kv_dtype']}/{step}/B{c['batch']}/ctx{c['ctx']}"


def cost_of(config: dict[str, Any]) -> Any:
    """costs.decode_cost for a point's configuration; `cache_len` (the buffer length the step
    reads, default ctx) is both the layout's max_len and the KV length."""
    from g4bench.engine.bench import DecodeCase
    from g4bench.model import costs
    from g4bench.model.config import load_config
    from g4bench.model.kv_cache import CacheLayout

    case = DecodeCase(model=config.get("model", "e2b"), layers=config.get("layers", "w4a16"),
                      ple=config.get("ple", "bf16"), kv_dtype=config["kv_dtype"],
                      donate=bool(config["donate"]), sliding_kv=config.get("sliding_kv", "full"),
                      batch=int(config["batch"]), ctx=int(config["ctx"]), embed=config.get("embed"))  # fmt: skip
    n = int(config.get("cache_len") or case.ctx)
    layout = CacheLayout(max_len=n, kv_dtype=case.kv_dtype, ring=case.sliding_kv == "ring")
    return costs.decode_cost(
        load_config(case.model), case.weight_format, layout, case.batch, n, donated=case.donate
    )


def with_features(points: list[Point]) -> list[Point]:
    from harness.calibrate import engine_steps

    for p in points:
        p.feats = features_of(engine_steps.cost_of(p.config) if "program" in p.config else cost_of(p.config))
    return points


def points_from_runs(run_dirs: list[Path], role: str = "fit") -> list[Point]:
    """Decode step medians of every successful revalidate/roofline record in the folders."""
    from harness.results import is_failure, read_records

    out = []
    for d in run_dirs:
        recs = [r for r in read_records(Path(d)) if r.get("kind") in KINDS and not is_failure(r)]
        found = [
            r
            for r in recs
            if r.get("step_ms_median") and (r.get("config", {}).get("batch") or r["kind"] == "engine-steps")
        ]
        if not found:
            raise CalibrateError(f"{d}: no {'/'.join(KINDS)} records with step_ms_median and config.batch")
        for r in found:
            out.append(Point(dict(r["config"]), float(r["step_ms_median"]), f"{d}:{r['name']}", role))
    return with_features(out)


def reference_points() -> list[Point]:
    """The reference engine's measured v6e steps, each row tagged fit / holdout / reallocation."""
    from harness.results import load_baseline

    df = load_baseline(REFERENCE_CSV)
    out = []
    for r in df.itertuples():
        cfg = {"model": "e2b", "layers": r.layers, "ple": r.ple, "kv_dtype": r.kv_dtype,
               "donate": bool(r.donate), "sliding_kv": r.sliding_kv, "batch": int(r.batch),
               "ctx": int(r.ctx), "cache_len": int(r.cache_len)}  # fmt: skip
        out.append(Point(cfg, float(r.step_ms), f"{r.table} ({r.source})", r.role))
    return with_features(out)


# ------------------------------------------------------------------------------------------ fitting
def _arrays(points: list[Point]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    feats = {n: np.array([p.feats[n] for p in points]) for n in FEATURES}
    return feats, np.array([p.measured_ms for p in points])


def _fit_p(feats: dict[str, np.ndarray], y: np.ndarray, p: float) -> np.ndarray:
    from scipy.optimize import least_squares

    def resid(th: np.ndarray) -> np.ndarray:
        return (predict_ms(th, p, feats) - y) / y

    fits = [least_squares(resid, np.array(x0), bounds=(0.0, np.inf)) for x0 in STARTS]
    return min(fits, key=lambda res: res.cost).x


def _sub(feats: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in feats.items()}


def _loo(feats: dict[str, np.ndarray], y: np.ndarray, p: float) -> np.ndarray:
    errs = []
    for i in range(len(y)):
        m = np.ones(len(y), bool)
        m[i] = False
        th = _fit_p(_sub(feats, m), y[m], p)
        errs.append((predict_ms(th, p, _sub(feats, ~m))[0] - y[i]) / y[i] * 100)
    return np.array(errs)


def _stats(prefix: str, err: np.ndarray) -> dict[str, float]:
    if not len(err):
        return {}
    a = np.abs(err)
    return {f"{prefix}_median_abs_pct": float(np.median(a)), f"{prefix}_max_abs_pct": float(a.max())}


# each rate coefficient and the feature it multiplies (logits stream at the KV rate: not its own)
TERM_FEATURE = {"weights_ms_per_gb": "weights_gb", "linear_ms_per_tflop": "linear_tflop",
                "kv_ms_per_gb": "kv_gb", "attention_ms_per_tflop": "attention_tflop"}  # fmt: skip
UNRESOLVED_SHARE = 0.01  # a term under 1% of every fit step: its rate is not measured by these points


def _term_max_share(th: np.ndarray, feats: dict[str, np.ndarray], y: np.ndarray) -> dict[str, float]:
    """Per rate coefficient, the largest fraction of a fit point's measured time its term alone
    would take; a rate whose term never reaches UNRESOLVED_SHARE is a fitting artefact, not a speed."""
    coef = dict(zip(COEFFS, (float(x) for x in th), strict=True))
    return {c: float(np.max(coef[c] * feats[f] / y)) for c, f in TERM_FEATURE.items()}


def fit_model(
    fit: list[Point], holdout: Sequence[Point] = (), p_grid: tuple[float, ...] = P_GRID
) -> StepModel:
    """Fit on `fit` (p chosen by LOO on `fit` alone), then predict `holdout` without refitting."""
    if len(fit) < len(COEFFS) + 1:
        raise CalibrateError(
            f"{len(fit)} fit points; need at least {len(COEFFS) + 1} for {len(COEFFS)} coefficients"
        )
    feats, y = _arrays(fit)
    loo_by_p = {p: _loo(feats, y, p) for p in p_grid}
    p = min(p_grid, key=lambda q: (float(np.median(np.abs(loo_by_p[q]))), q))
    th = _fit_p(feats, y, p)
    err = (predict_ms(th, p, feats) - y) / y * 100
    v: dict[str, Any] = {"n_fit": len(fit), **_stats("fit", err), **_stats("loo", loo_by_p[p])}
    v["loo_median_abs_pct_by_p"] = {str(q): float(np.median(np.abs(e))) for q, e in loo_by_p.items()}
    v["term_max_share"] = _term_max_share(th, feats, y)
    if holdout:
        hf, hy = _arrays(list(holdout))
        v.update({"n_holdout": len(holdout), **_stats("holdout", (predict_ms(th, p, hf) - hy) / hy * 100)})
    return StepModel(coef=dict(zip(COEFFS, (float(x) for x in th), strict=True)), overlap_p=p, validation=v)


def point_rows(
    model: StepModel, points: list[Point], loo: dict[int, float] | None = None
) -> list[dict[str, Any]]:
    """One row per point: label, role, measured, predicted, error %, and the roofline lower bound
    at the fitted KV bandwidth is left to the caller (it needs a device)."""
    rows = []
    for p in points:
        pred = float(
            predict_ms(
                [model.coef[n] for n in COEFFS],
                model.overlap_p,
                {k: np.array([v]) for k, v in p.feats.items()},
            )[0]
        )
        rows.append({"label": p.label, "role": p.role, "source": p.source, "measured_ms": p.measured_ms,
                     "predicted_ms": pred, "error_pct": (pred - p.measured_ms) / p.measured_ms * 100})  # fmt: skip
    return rows


PREFILL_CSV = "jax-reference-prefill-v6e1"


def reference_prefill_model(decode: StepModel) -> tuple[StepModel, list[dict[str, Any]]]:
    """The v6e `[prefill]` model from the reference's one-shot prefill (PREFILL_CSV): the decode
    model with its attention ms/TFLOP refitted (one parameter; three prompt sizes). Validation is
    leave-one-size-out. Returns the model and its point rows."""
    from scipy.optimize import least_squares

    from g4bench.model import costs
    from g4bench.model.config import load_config
    from g4bench.model.kv_cache import CacheLayout
    from g4bench.model.params import WeightFormat
    from harness.results import load_baseline

    cfg, fmt = load_config("e2b"), WeightFormat(layers="w4a16", ple="bf16", embed="bf16")
    df = load_baseline(PREFILL_CSV)
    feats, y = [], np.array(df["prefill_ms"], float)
    for r in df.itertuples():
        layout = CacheLayout(max_len=int(r.cache_len), kv_dtype="bf16", ring=False)
        feats.append(features_of(costs.prefill_cost(cfg, fmt, layout, int(r.bucket), int(r.bucket))))
    arr = {n: np.array([f[n] for f in feats]) for n in FEATURES}
    base = [decode.coef[n] for n in COEFFS]
    i_att = COEFFS.index("attention_ms_per_tflop")

    def fit(mask: np.ndarray) -> float:
        def resid(th: np.ndarray) -> np.ndarray:
            c = list(base)
            c[i_att] = th[0]
            return (predict_ms(c, decode.overlap_p, _sub(arr, mask)) - y[mask]) / y[mask]

        return float(least_squares(resid, [base[i_att]], bounds=(0.0, np.inf)).x[0])

    def pred(att: float, mask: np.ndarray) -> np.ndarray:
        c = list(base)
        c[i_att] = att
        return predict_ms(c, decode.overlap_p, _sub(arr, mask))

    att = fit(np.ones(len(y), bool))
    err = (pred(att, np.ones(len(y), bool)) - y) / y * 100
    loo = []
    for i in range(len(y)):
        m = np.ones(len(y), bool)
        m[i] = False
        loo.append((pred(fit(m), ~m)[0] - y[i]) / y[i] * 100)
    v = {"n_fit": len(y), **_stats("fit", err), **_stats("loo", np.array(loo)),
         "refitted": "attention_ms_per_tflop only; other coefficients and p from [decode]"}  # fmt: skip
    model = StepModel({**decode.coef, "attention_ms_per_tflop": att}, decode.overlap_p, v)
    rows = [{"label": f"prefill/B1/S{int(r.bucket)}", "role": "fit", "source": str(r.source),
             "measured_ms": float(r.prefill_ms), "predicted_ms": float(p), "error_pct": float(e)}
            for r, p, e in zip(df.itertuples(), pred(att, np.ones(len(y), bool)), err, strict=True)]  # fmt: skip
    return model, rows


# ------------------------------------------------------------------------------------------ files
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(float(v)) if isinstance(v, float) else str(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(x)}' for k, x in v.items()) + " }"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def profile_toml(profile: Profile, rows: dict[str, list[dict[str, Any]]]) -> str:
    """TOML text: header, [provenance], [<program>] coefficients, [<program>.validation], points."""
    out = [f"# Step-time profile written by `g4bench calibrate` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC.",
           "# Model form: harness/calibrate/steptime.py. Do not edit by hand; re-run calibrate.",
           f"device = {_toml_value(profile.device)}", f"engine = {_toml_value(profile.engine)}", "", "[provenance]"]  # fmt: skip
    out += [f"{k} = {_toml_value(v)}" for k, v in profile.provenance.items()]
    if profile.step:
        out += ["", "[step]"] + [f"{k} = {_toml_value(v)}" for k, v in profile.step.items()]
    for prog, m in profile.programs.items():
        out += ["", f"[{prog}]", f"overlap_p = {_toml_value(float(m.overlap_p))}"]
        out += [f"{k} = {_toml_value(v)}" for k, v in m.coef.items()]
        out += ["", f"[{prog}.validation]"] + [f"{k} = {_toml_value(v)}" for k, v in m.validation.items()]
        for r in rows.get(prog, []):
            out += ["", f"[[{prog}.points]]"] + [f"{k} = {_toml_value(v)}" for k, v in r.items()]
    return "\n".join(out) + "\n"


def write_profile(path: Path, profile: Profile, rows: dict[str, list[dict[str, Any]]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile_toml(profile, rows), encoding="utf-8")
    return path


def load_profile(device_or_path: str | Path) -> Profile | None:
    """The profile for a device id (configs/profiles/<id>.toml) or a path; None if there is none."""
    path = Path(device_or_path)
    if path.suffix != ".toml":
        path = PROFILE_DIR / f"{device_or_path}.toml"
    if not path.is_file():
        return None
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    progs: dict[str, StepModel] = {}
    for prog in PROGRAMS:
        if prog in data:
            d = data[prog]
            progs[prog] = StepModel(
                {n: float(d[n]) for n in COEFFS}, float(d["overlap_p"]), dict(d.get("validation", {}))
            )
    return Profile(str(data["device"]), str(data.get("engine", "")), progs, dict(data.get("provenance", {})),
                   dict(data.get("step", {})))  # fmt: skip


# ------------------------------------------------------------------------------------------ the command
def _device_of(run_dirs: list[Path]) -> tuple[str, str]:
    """(hardware id, device kind) from the first record's env block."""
    from harness.hardware import hardware_for_device
    from harness.results import read_records

    for d in run_dirs:
        for r in read_records(Path(d)):
            env = r.get("env", {})
            hw = hardware_for_device(env.get("platform"), env.get("device_kind"))
            if hw is not None:
                return hw.id, str(env.get("device_kind"))
    raise CalibrateError("no record names a known device; pass --device")


def _versions(run_dirs: list[Path]) -> dict[str, str]:
    from harness.results import read_records

    for d in run_dirs:
        for r in read_records(Path(d)):
            env = r.get("env", {})
            return {
                k: str(env[k])
                for k in ("g4bench_version", "git_rev", "jax_version", "jaxlib_version")
                if k in env
            }
    return {}


def run_calibrate(run_dirs: list[Path], holdout_dirs: list[Path], *, reference: bool, device: str | None,
                  out: Path | None, console: Any) -> tuple[Profile, Path, list[dict[str, Any]]]:  # fmt: skip
    """Gather points, fit, validate, write the profile and print the point table."""
    if reference:
        pts = reference_points()
        fit = [p for p in pts if p.role == "fit"]
        hold = [p for p in pts if p.role == "holdout"]
        extra = [p for p in pts if p.role == "reallocation"]
        dev = device or "tpu-v6e"
        prov: dict[str, Any] = {
            "device_kind": "TPU v6 lite (TPU v6e-1, ct6e-standard-1t)",
            "engine_measured": "xbill9/tpu-jax-2b reference JAX engine (JAX 0.11.0, libtpu 0.0.44.1), July 2026",
            "runs": ["runs/2026-07-29-kv-quant-v6e1/logs/revalidate.json", "runs/2026-07-29-kv-quant-v6e1/logs/roofline.json"],
            "holdout_runs": ["runs/2026-07-29-kv-quant-v6e1/logs/ple_run.json"],
            "data": f"configs/baselines/{REFERENCE_CSV}.csv",
            "protocol": "fit only on revalidate (12) + roofline (8); ple_run's 12 ceiling steps predicted without refitting",
            "features": "g4bench.model.costs.decode_cost at cache_len = ctx + 16 (the reference's buffer), full-length sliding KV",
        }  # fmt: skip
        engine = "reference JAX engine (xbill9/tpu-jax-2b); see provenance"
    else:
        if not run_dirs:
            raise CalibrateError("give run folders to fit on, or --reference")
        fit = points_from_runs(run_dirs, "fit")
        hold = points_from_runs(holdout_dirs, "holdout") if holdout_dirs else []
        extra = []
        dev, kind = (device, "") if device else _device_of(run_dirs)
        prov = {"device_kind": kind, "runs": [str(d) for d in run_dirs], "holdout_runs": [str(d) for d in holdout_dirs],
                **_versions(run_dirs)}  # fmt: skip
        engine = "g4bench"
    from importlib.metadata import version

    prov.update({"fitted_with": f"g4bench calibrate (numpy {np.__version__}, scipy {version('scipy')})",
                 "model_form": "harness/calibrate/steptime.py", "fit_points": len(fit), "holdout_points": len(hold)})  # fmt: skip
    models: dict[str, StepModel] = {}
    rows_by: dict[str, list[dict[str, Any]]] = {}
    for prog in sorted({p.program for p in fit}, key=lambda q: (q != "decode", q)):
        f = [p for p in fit if p.program == prog]
        h = [p for p in hold if p.program == prog]
        console.print(f"fitting {len(f)} {prog} points ({len(h)} held out) for {dev} …")
        models[prog] = fit_model(f, h)
        rows_by[prog] = point_rows(models[prog], f + h + [p for p in extra if p.program == prog])
    if reference and "prefill" not in models:
        models["prefill"], rows_by["prefill"] = reference_prefill_model(models["decode"])
        prov["prefill_data"] = f"configs/baselines/{PREFILL_CSV}.csv"
    from harness.calibrate.step_record import REFERENCE_STEP, fitted_step

    step = dict(REFERENCE_STEP) if reference else fitted_step(p.config for p in fit)
    profile = Profile(dev, engine, models, prov, step)
    path = write_profile(out or PROFILE_DIR / f"{dev}.toml", profile, rows_by)
    rows = [r for prog in models for r in rows_by[prog]]
    for prog in models:
        print_profile(profile, rows_by[prog], console, prog)
    missing = None if reference else missing_programs(models, fit, run_dirs)
    if missing:
        console.print(missing, soft_wrap=True)
    return profile, path, rows


def missing_programs(models: dict[str, StepModel], fit: list[Point], run_dirs: list[Path]) -> str | None:
    """What `plan` needs and these runs did not time, and the run that adds it: revalidate and
    roofline time the bare decode step only, so a profile fitted on them alone prices prefill and
    the mixed step with its decode rates (plan's basis line says so)."""
    absent = [p for p in ("prefill", "mixed") if p not in models]
    if not absent or not fit or not run_dirs:
        return None
    configs = [p.config for p in fit]
    slots = sorted({int(c["batch"]) for c in configs if c.get("batch")}) or [1, 4, 8]
    max_len = max((int(c["ctx"]) for c in configs if c.get("ctx")), default=2048)
    model, kv = configs[0].get("model", "e2b"), configs[0].get("kv_dtype", "bf16")
    folders = " ".join(str(d) for d in run_dirs)
    return (
        f"no {' or '.join(absent)} points: plan will price {' and '.join(absent)} calls with the decode rates. "
        f"To fit them on the step `serve` runs, time the engine's own calls and calibrate with both: "
        f"g4bench engine-steps --model {model} --kv-dtype {kv} --max-slots {','.join(map(str, slots))} "
        f"--max-len {max_len} --out STEPS_DIR, then g4bench calibrate {folders} STEPS_DIR"
    )


def print_profile(
    profile: Profile, rows: list[dict[str, Any]], console: Any, program: str = "decode"
) -> None:
    from rich.table import Table

    m = profile.programs[program]
    r, share = m.rates(), m.validation.get("term_max_share", {})

    def rate(coef: str, key: str, unit: str, fmt: str) -> str:
        if m.coef[coef] < 1e-6 or r[key] is None:
            return "absorbed into the constant"
        if share.get(coef, 1.0) < UNRESOLVED_SHARE:
            return f"not resolved by these points (< {UNRESOLVED_SHARE:.0%} of every fit step)"
        return f"{r[key]:{fmt}} {unit}"

    console.print(
        f"[bold]{profile.device} {program} step model[/bold] (overlap p = {m.overlap_p:g}, chosen by LOO on the fit points): "
        f"constant {m.coef['const_ms']:.2f} ms; KV + logits stream {rate('kv_ms_per_gb', 'kv_gb_per_s', 'GB/s', '.3g')}; "
        f"linears {rate('linear_ms_per_tflop', 'linear_tflop_per_s', 'TFLOP/s', '.3g')}; "
        f"attention {rate('attention_ms_per_tflop', 'attention_tflop_per_s', 'TFLOP/s', '.3g')}; "
        f"weights stream {rate('weights_ms_per_gb', 'weights_gb_per_s', 'GB/s', '.3g')}",
        soft_wrap=True,
    )
    v = m.validation
    line = f"fit: median |error| {v['fit_median_abs_pct']:.2f}%, max {v['fit_max_abs_pct']:.2f}%; leave-one-out: median {v['loo_median_abs_pct']:.2f}%, max {v['loo_max_abs_pct']:.2f}%"
    if "holdout_median_abs_pct" in v:
        line += f"; [bold]held out ({v['n_holdout']}): median {v['holdout_median_abs_pct']:.2f}%, max {v['holdout_max_abs_pct']:.2f}%[/bold]"
    console.print(line, soft_wrap=True)
    t = Table(title="measured vs predicted step time", title_justify="left")
    # names fold onto a second line rather than being cut at 80 columns; the figures never wrap
    t.add_column("role", no_wrap=True)
    t.add_column("configuration", overflow="fold")
    for c in ("measured ms", "predicted ms", "error"):
        t.add_column(c, justify="right", no_wrap=True)
    for row in rows:
        t.add_row(
            row["role"],
            row["label"],
            f"{row['measured_ms']:.2f}",
            f"{row['predicted_ms']:.2f}",
            f"{row['error_pct']:+.1f}%",
        )
    console.print(t)
    if any(row["role"] == "reallocation" for row in rows):
        console.print(
            "reallocation rows (cap_donate): the reference timed these with a fresh cache allocated per sample, "
            "so they are not latency targets (its 86.2 ms at 1,296 copying sequences is the configuration ple_run "
            "measured at 60.8 ms); donated rows at large batch are outside the fit set (donated points exist only at "
            "batch 32) and are extrapolation.",
            soft_wrap=True,
        )
    if profile.engine.startswith("reference"):
        console.print(
            "These coefficients describe the reference engine's step on a v6e chip. What carries over to g4bench's "
            "step: the form, the HBM stream rate and the attention/linear compute rates (same chip, same XLA op "
            "classes); what does not: the constant, and anything our step does differently (KV buckets and ring "
            "reads, f32 logits, on-device sampling) — costs.py counts our bytes, the profile prices them.",
            soft_wrap=True,
        )
