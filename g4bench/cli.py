"""The `g4bench` command line: a thin typer app.

Every command lives in its own module under `g4bench/commands/`, whose import is cheap (typer and
typing only); heavy imports (jax, pandas, the engine, the harness) happen inside the command body,
so `g4bench --help` is instant. Commands call library functions and translate their results into
exit codes; they hold no logic of their own.
"""

from __future__ import annotations

import typer

from g4bench.commands import (
    calibrate,
    capacity,
    constraint_cost,
    device_check,
    doctor,
    engine_steps,
    gate,
    generate,
    plan,
    plot,
    report,
    revalidate,
    roofline,
    serve,
    serve_load,
    verify,
)

app = typer.Typer(
    name="g4bench",
    help="Benchmark and capacity-plan Gemma 4 E-series serving with a pure-JAX engine.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

app.command("verify")(verify.verify)
app.command("generate")(generate.generate)
app.command("revalidate")(revalidate.revalidate)
app.command("roofline")(roofline.roofline)
app.command("plot")(plot.plot)
app.command("report")(report.report)
app.command("gate")(gate.gate)
app.command("capacity")(capacity.capacity)
app.command("calibrate")(calibrate.calibrate)
app.command("serve")(serve.serve)
app.command("serve-load")(serve_load.serve_load)
app.command("constraint-cost")(constraint_cost.constraint_cost)
app.command("doctor")(doctor.doctor)
app.command("engine-steps")(engine_steps.engine_steps)
app.command("plan")(plan.plan)
app.command("device-check")(device_check.device_check)

if __name__ == "__main__":
    app()
