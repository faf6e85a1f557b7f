"""Device definitions: nameplate figures with their sources, read from configs/hardware/*.toml.

One TOML file per device kind (cpu, tpu-v5e, tpu-v6e, tpu-v5p, nvidia-h100, nvidia-h200). Every
figure is a table ``{value, source, note}``; a figure without a `value` is unknown or measured at
run time, and its `source` says which (the CPU has no nameplate bandwidth: `g4bench roofline`
calibrates it). Nameplate and usable HBM are separate figures, because vendor "GB" are sometimes
GiB and runtimes reserve memory (../shared/reference/capacity-anchors.md B and A8).

Data flow: the roofline, capacity and plot code call `hardware_for_device(platform, device_kind)`
with the fields a child reported in its env block (harness/env.py), and read figures as
`hw.value("peak_bandwidth_bytes_per_s")` (None when unknown), quoting `hw.figures[...].source`
beside any number derived from one.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HARDWARE_DIR = Path(__file__).resolve().parents[1] / "configs" / "hardware"

FIGURES = (
    "hbm_bytes",  # nameplate memory of one chip
    "usable_hbm_bytes",  # what a runtime reported as allocatable
    "peak_bandwidth_bytes_per_s",  # nameplate memory bandwidth
    "peak_bf16_flop_per_s",  # dense bf16 matmul peak
    "peak_int8_op_per_s",  # dense int8 matmul peak
    "usd_per_hour",  # price of one chip-hour where known
)


@dataclass(frozen=True)
class Figure:
    """One hardware figure: `value` (None = unknown / measured at run time), its source, a note."""

    value: float | None
    source: str
    note: str = ""


@dataclass(frozen=True)
class Hardware:
    """A device kind: identity, how JAX names it, and its figures (keys from `FIGURES`)."""

    id: str
    name: str
    platform: str
    jax_device_kinds: tuple[str, ...]
    figures: dict[str, Figure] = field(default_factory=dict)
    aot_topology: str | None = None
    # a GPU's deviceless compile also needs XLA's GpuTargetConfig (a text proto beside the TOML)
    aot_target_config: str | None = None

    def target_config_text(self) -> str:
        """The GpuTargetConfig text proto a deviceless CUDA compile targets (`aot_target_config`)."""
        if not self.aot_target_config:
            raise ValueError(f"{self.id}: no aot_target_config in its hardware definition")
        return (HARDWARE_DIR / self.aot_target_config).read_text()

    def value(self, figure: str) -> float | None:
        """The figure's value, or None when unknown or measured at run time."""
        if figure not in FIGURES:
            raise KeyError(f"unknown figure {figure!r}; expected one of {FIGURES}")
        fig = self.figures.get(figure)
        return None if fig is None else fig.value

    def match_length(self, platform: str | None, device_kind: str | None) -> int:
        """How well a JAX device (backend platform, `device.device_kind`) matches: 0 = not at all,
        else the length of the longest of our `jax_device_kinds` that prefixes the device kind
        (case-insensitive). JAX reports e.g. "NVIDIA H100 80GB HBM3" and "TPU v6 lite"; "TPU v5"
        (v5p) is a prefix of "TPU v5 lite" (v5e), so the longest match wins. The CPU matches any
        cpu-platform device.
        """
        if platform is not None and platform != self.platform:
            return 0
        if self.platform == "cpu":
            return 1 if platform == "cpu" or (device_kind or "").lower() == "cpu" else 0
        kind = (device_kind or "").strip().lower()
        return max((len(k) for k in self.jax_device_kinds if kind and kind.startswith(k.lower())), default=0)


def _parse(path: Path) -> Hardware:
    """Read one hardware TOML file; every figure in `FIGURES` must be present with a source."""
    data = tomllib.loads(path.read_text())
    figures: dict[str, Figure] = {}
    for name in FIGURES:
        raw = data.get(name)
        if not isinstance(raw, dict) or not raw.get("source"):
            raise ValueError(f"{path}: figure {name!r} needs a table with at least a 'source'")
        value = raw.get("value")
        figures[name] = Figure(
            value=None if value is None else float(value),
            source=str(raw["source"]),
            note=str(raw.get("note", "")),
        )
    return Hardware(
        id=str(data["id"]),
        name=str(data["name"]),
        platform=str(data["platform"]),
        jax_device_kinds=tuple(data.get("jax_device_kinds", ())),
        figures=figures,
        aot_topology=data.get("aot_topology"),
        aot_target_config=data.get("aot_target_config"),
    )


def list_hardware(directory: Path = HARDWARE_DIR) -> list[Hardware]:
    """Every device definition in `directory`, sorted by id."""
    return sorted((_parse(p) for p in directory.glob("*.toml")), key=lambda h: h.id)


def load_hardware(id_or_path: str | Path) -> Hardware:
    """A device definition by id (e.g. "tpu-v6e") or by path to a TOML file."""
    path = Path(id_or_path)
    if path.suffix != ".toml":
        path = HARDWARE_DIR / f"{id_or_path}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in HARDWARE_DIR.glob("*.toml"))
        raise FileNotFoundError(f"no hardware definition {id_or_path!r}; known: {known}")
    return _parse(path)


def hardware_for_device(platform: str | None, device_kind: str | None) -> Hardware | None:
    """The definition best matching a JAX device, or None for a device we have no file for."""
    scored = [(hw.match_length(platform, device_kind), hw) for hw in list_hardware()]
    best = max(scored, key=lambda s: s[0], default=(0, None))
    return best[1] if best[0] > 0 else None
