"""`g4bench serve-load`: agent-workload latency and goodput over HTTP (harness/load does the work).

Without --url it starts our `g4bench serve` on a free loopback port (model sized for the machine) and
stops it afterwards, also on Ctrl-C and errors; with --url it benchmarks any OpenAI-compatible server.
With --engine-baseline (fixed workload, self-started server) the same run also times the engine's bare
decode step at the server's batch and KV bucket in a fresh child once the server has stopped, and
prints server decode tok/s (while every stream decodes) ÷ the engine's (harness/load/decode_ratio.py).
The closing output is three 80-column tables (latency; throughput and goodput; agent tasks with
prompt tokens computed vs reused), one few-samples line per level, and the run folder.

--trace FILE replays a trace on its own schedule instead of a synthetic workload (harness/load/
trace.py defines both formats: Mooncake/AIPerf rows and g4bench agent sessions; replay.py paces
them). --find-max agents|rate bisects for the most agents / the highest task rate meeting the SLO
attainment target, one measured level per probe, beside the simulator's answer (find_max.py).
Every run scrapes the server's /metrics (ours or vLLM's names) into metrics.jsonl.
Exit codes: 0 done, 1 partial (server died mid-run; results saved), 2 bad setup (server unreachable,
unknown model, bad options), 130 interrupted (results saved).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from g4bench.commands.options import SLO_DEFAULT as _SLO
from g4bench.commands.options import SLO_DEFAULT_HELP


def serve_load(
    conc: Annotated[
        str, typer.Option(help="Concurrency levels, comma-separated (closed loop, or the open-loop cap).")
    ] = "2,4,8",
    workload: Annotated[
        str, typer.Option(help="fixed | agent | shared-prefix | tools (forced tool calls, tool-result messages).")
    ] = "agent",
    json_schema: Annotated[
        Path | None,
        typer.Option(help="Fixed workload: constrain every reply to this JSON Schema file (response_format)."),
    ] = None,
    url: Annotated[
        str | None, typer.Option(help="Benchmark this OpenAI-compatible server instead of starting ours.")
    ] = None,
    model_name: Annotated[
        str | None,
        typer.Option(help="Model id to request (must be in /v1/models; default: the server's first)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Model for the self-started server (default: e2b with an accelerator, else 'small')."
        ),
    ] = None,
    num_requests: Annotated[
        int | None, typer.Option(help="Per level: requests (fixed) or agent tasks (agent workloads).")
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(help="Per level: seconds during which new tasks start (instead of --num-requests)."),
    ] = None,
    input_len: Annotated[
        int | None, typer.Option(help="Prompt tokens (fixed) or first-turn prompt tokens (agent).")
    ] = None,
    output_len: Annotated[
        int | None, typer.Option(help="Generated tokens per request (forced with ignore_eos).")
    ] = None,
    turns: Annotated[int | None, typer.Option(help="Turns per agent task.")] = None,
    tool_result_tokens: Annotated[
        int | None, typer.Option(help="Synthetic tool-result tokens appended each turn.")
    ] = None,
    prefix_len: Annotated[
        int | None, typer.Option(help="Shared system-prompt tokens (shared-prefix workload).")
    ] = None,
    lead_agent: Annotated[
        bool,
        typer.Option(
            help="Shared-prefix, closed loop: the first agent's first turn runs alone and the others start "
            "once it ended (the system prompt is cached, a running fleet's steady state); "
            "--no-lead-agent starts every worker at once (a cold burst)."
        ),
    ] = True,
    rate: Annotated[
        float | None, typer.Option(help="Open loop: task arrivals per second (default: closed loop).")
    ] = None,
    burstiness: Annotated[
        float, typer.Option(help="Gamma shape of arrival gaps: 1 Poisson, <1 bursty (as vLLM).")
    ] = 1.0,
    api: Annotated[
        str, typer.Option(help="auto | tokens (token-id prompts, exact prefix check) | chat (any server).")
    ] = "auto",
    slo: Annotated[Path, typer.Option(help="Goodput objectives (TOML).", show_default=SLO_DEFAULT_HELP)] = _SLO,
    out: Annotated[Path | None, typer.Option(help="Run folder (default: results/<run-id>).")] = None,
    timeout: Annotated[
        float, typer.Option(help="Per-request limit in seconds; a timeout is a recorded failure.")
    ] = 600.0,
    api_key: Annotated[str | None, typer.Option(help="Bearer token for the server.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for synthetic prompts and arrivals.")] = 0,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Replay this JSONL trace on its schedule: Mooncake/AIPerf rows {timestamp ms, input_length, "
            "output_length, hash_ids of 512-token blocks: equal ids = equal tokens} or agent sessions "
            "{session_id, start_ms, prefix_hash_ids, turns: [{input_length, output_length, "
            "tool_result_length, think_ms}]} (turn k sent think_ms after turn k-1's reply). Open loop, "
            "uncapped; reports schedule fidelity and the cache reuse the trace implies."
        ),
    ] = None,
    trace_block_size: Annotated[int, typer.Option(help="--trace: tokens per hash_ids block.")] = 512,
    find_max: Annotated[
        str | None,
        typer.Option(
            help="agents | rate: bisect the most agents (closed loop, one task each) or the highest task rate "
            "(open loop, capped at --conc's largest) whose SLO attainment meets the target, one measured level "
            "per probe, with the simulator's prediction beside it."
        ),
    ] = None,
    search_bounds: Annotated[
        str | None,
        typer.Option(help="--find-max: LO,HI (agents: default 1,largest --conc; rate: required, tasks/s)."),
    ] = None,
    search_tolerance: Annotated[
        float, typer.Option(help="--find-max rate: stop when HI/LO ≤ 1 + this.")
    ] = 0.1,
    max_probes: Annotated[int, typer.Option(help="--find-max: measured levels at most.")] = 6,
    plan_target: Annotated[
        str | None,
        typer.Option(
            help="--find-max: price the prediction for this target (default: local with the self-started "
            "server on a CPU; 'none' skips it)."
        ),
    ] = None,
    plan_profile: Annotated[
        str | None, typer.Option(help="--find-max: step-time profile for the prediction (default: the target's).")
    ] = None,
    prefill_policy: Annotated[
        str | None,
        typer.Option(
            help="Self-started server: mixed | chunk, as serve's (e.g. chunk to match a profile fitted on it). "
            "(default: serve's)"
        ),
    ] = None,
    draft_model: Annotated[
        str | None,
        typer.Option(help="Self-started server: speculative decoding with this draft model, as serve's (needs --spec-k)."),
    ] = None,
    spec_k: Annotated[
        int, typer.Option(help="Self-started server: draft tokens verified per round, as serve's (0: off).")
    ] = 0,
    metrics_interval: Annotated[
        float, typer.Option(help="Scrape the server's /metrics every this many seconds (0: off).")
    ] = 1.0,
    engine_baseline: Annotated[
        bool,
        typer.Option(
            help="Fixed workload, self-started server: after the load, time the engine's bare decode step "
            "at the server's batch and KV bucket (fresh child) and report server ÷ engine decode tok/s."
        ),
    ] = False,
) -> None:
    """Measure TTFT, TPOT, ITL, E2E, goodput and agent-task latency against an OpenAI-compatible server."""
    import math
    import sys
    from dataclasses import replace

    from rich.console import Console

    from harness.env import host_env
    from harness.load import defaults
    from harness.load.report import print_closing, write_run
    from harness.load.runner import LoadConfig, run_load
    from harness.load.server import (
        DEFAULT_ACCEL_MODEL,
        DEFAULT_CPU_MODEL,
        ManagedServer,
        ServerError,
        check_server,
        free_port,
        has_accelerator,
        serve_command,
        wait_ready,
    )
    from harness.load.slo import load_slo
    from harness.load.workloads import WorkloadConfig
    from harness.results import create_run_dir

    console = Console(stderr=True)
    if workload not in ("fixed", "agent", "shared-prefix", "tools") or api not in ("auto", "tokens", "chat"):
        console.print(f"[red]bad --workload {workload!r} or --api {api!r}[/red]")
        raise typer.Exit(2)
    try:
        levels = sorted({int(c) for c in conc.split(",") if c.strip()})
    except ValueError:
        console.print(f"[red]--conc must be integers separated by commas, got {conc!r}[/red]")
        raise typer.Exit(2) from None
    if not levels or min(levels) < 1 or (num_requests is not None and duration is not None):
        console.print("[red]need --conc ≥ 1, and at most one of --num-requests / --duration[/red]")
        raise typer.Exit(2)
    if engine_baseline and (workload != "fixed" or url is not None):
        console.print(
            "[red]--engine-baseline needs --workload fixed and the self-started server (no --url)[/red]"
        )
        raise typer.Exit(2)
    if trace is not None and (find_max is not None or engine_baseline or json_schema is not None):
        console.print("[red]--trace replays its own schedule: no --find-max, --engine-baseline or --json-schema[/red]")
        raise typer.Exit(2)
    if prefill_policy not in (None, "mixed", "chunk") or (prefill_policy is not None and url is not None):
        console.print("[red]--prefill-policy takes mixed or chunk, for the self-started server (no --url)[/red]")
        raise typer.Exit(2)
    if (draft_model is not None or spec_k) and url is not None:
        console.print("[red]--draft-model and --spec-k start the server with speculation: not with --url[/red]")
        raise typer.Exit(2)
    if find_max is not None and (engine_baseline or duration is not None):
        console.print("[red]--find-max measures its own levels: no --engine-baseline or --duration[/red]")
        raise typer.Exit(2)
    replay = search = None
    if trace is not None:
        from harness.load.trace import TraceError, load_trace

        try:
            replay = load_trace(trace, trace_block_size)
        except TraceError as e:
            console.print(f"[red]bad trace:[/red] {e}", soft_wrap=True)
            raise typer.Exit(2) from None
    if find_max is not None:
        from harness.load.find_max import settings_from

        try:
            search = settings_from(find_max, search_bounds, levels, search_tolerance, max_probes, num_requests)
        except ValueError as e:
            console.print(f"[red]{e}[/red]")
            raise typer.Exit(2) from None

    schema = None
    if json_schema is not None:
        import json

        if workload != "fixed":
            console.print("[red]--json-schema applies to --workload fixed[/red]")
            raise typer.Exit(2)
        try:
            schema = json.loads(json_schema.read_text())
        except (OSError, ValueError) as e:
            console.print(f"[red]cannot read --json-schema {json_schema}: {e}[/red]")
            raise typer.Exit(2) from None
    accel = has_accelerator()
    size = defaults.choose(workload, full_size=url is not None or accel)
    wl = WorkloadConfig(
        kind=workload,  # type: ignore[arg-type]
        input_len=input_len if input_len is not None else size.input_len,
        output_len=output_len if output_len is not None else size.output_len,
        turns=turns if turns is not None else size.turns,
        tool_result_tokens=tool_result_tokens if tool_result_tokens is not None else size.tool_result_tokens,
        prefix_len=prefix_len if prefix_len is not None else size.prefix_len,
        lead_agent=lead_agent,
        seed=seed,
        json_schema=schema,
        api="chat" if workload == "tools" else api,  # type: ignore[arg-type]
    )
    max_context = wl.max_context
    if replay is not None:
        from harness.load.replay import trace_workload

        wl, max_context = trace_workload(replay, wl.api, wl.model, seed), replay.max_context
        if wl.api == "chat":  # the chat template's tokens around every message (a generous bound)
            max_context += 16 * replay.max_messages
        console.print(
            f"[bold]serve-load[/bold] --trace {trace}: {replay.format}, {replay.num_requests} requests"
            + (f" in {len(replay.sessions)} sessions" if replay.sessions else "")
            + f" starting over {replay.span_s:.1f} s, {replay.block_size}-token blocks, max context {max_context}; "
            "open loop, uncapped",
            soft_wrap=True,
        )
    else:
        console.print(f"[bold]serve-load[/bold] {workload}: {size.reason}")
        console.print(
            f"  turns {wl.turns_per_task}, input {wl.input_len}, output {wl.output_len}, tool result "
            f"{wl.tool_result_tokens}, shared prefix {wl.prefix_len}"
            + (" (lead agent first)" if wl.lead_opens and rate is None else "")
            + f", max context {max_context}"
        )
    if search is not None:
        console.print(f"  find-max: {search.describe()}")
    try:
        objectives = load_slo(slo)
    except (OSError, ValueError) as e:
        console.print(f"[red]cannot read SLO file: {e}[/red]")
        raise typer.Exit(2) from None
    console.print(
        f"  SLO ({slo}): {objectives.describe()}; attainment target {objectives.attainment_target:g}"
    )

    label = "trace" if replay is not None else f"find-max-{find_max}" if find_max is not None else workload
    run_dir = out if out is not None else create_run_dir(Path("results"), f"serve-load-{label}")
    slots = int(search.hi) if search is not None and search.mode == "agents" else max(levels)
    run_dir.mkdir(parents=True, exist_ok=True)
    server = None
    server_meta: dict = {"self_started": url is None}
    try:
        if url is None:
            name = model or (DEFAULT_ACCEL_MODEL if accel else DEFAULT_CPU_MODEL)
            port = free_port()
            max_len = defaults.server_max_len(max_context)
            try:
                cmd = serve_command(name, slots, max_len, port, prefill_policy, draft_model=draft_model, spec_k=spec_k)
            except ValueError as err:
                console.print(f"[red]{escape(str(err))}[/red]")
                raise typer.Exit(2) from err
            server_meta |= {"model": name, "command": cmd, "max_slots": slots, "max_len": max_len}
            console.print(
                f"  starting server: model {name} ({'accelerator' if accel else 'CPU: small synthetic'}), port {port}"
            )
            server = ManagedServer(cmd, port, run_dir / "server.log")
            server.start()
            base_url = server.base_url
        else:
            base_url = url.rstrip("/")
            with console.status(f"waiting for {base_url}/health (503 while the server warms up)…"):
                wait_ready(base_url)
        served = check_server(base_url, model_name, api_key)
        cfg = LoadConfig(
            base_url=base_url,
            workload=replace(wl, model=served),
            concurrencies=levels,
            num_tasks=num_requests
            if num_requests is not None
            else size.num_tasks
            if duration is None
            else None,
            duration_s=duration,
            tasks_per_conc=size.tasks_per_conc,
            rate=rate if rate is not None else math.inf,
            burstiness=burstiness,
            timeout_s=timeout,
            slo=objectives,
            api_key=api_key,
            metrics_period_s=metrics_interval,
        )
        from harness.load.progress import LiveProgress

        finder = None
        if search is not None:
            from harness.load.find_max import FindMax, plan_predictor

            predict, basis = plan_predictor(server_meta, plan_target, plan_profile, cfg.workload.api, accel)
            console.print(f"  prediction: {basis}", soft_wrap=True)
            finder = FindMax(cfg, search, server, predict, basis)
        with LiveProgress(console) as progress:
            if replay is not None:
                from harness.load.replay import run_trace

                progress.level_start(0, replay.num_requests, label="trace")
                result = run_trace(cfg, replay, server, progress.record)
            elif finder is not None:
                finder.on_level_start, finder.on_record = progress.level_start, progress.record
                result = finder.run()
            else:
                result = run_load(cfg, server, progress.level_start, progress.record)
    except ServerError as e:
        console.print(f"[red]server error:[/red] {e}\n  run folder: {run_dir}")
        raise typer.Exit(2) from None
    finally:
        if server is not None:
            server.stop()

    for note in result.notes:
        console.print(f"  {note}")
    meta = {"run_id": run_dir.name, "argv": ["g4bench", *sys.argv[1:]], "model_name": served,
            "server": server_meta, "env": host_env(cfg.workload.__dict__),
            "search": finder.block if finder is not None else None}  # fmt: skip
    if engine_baseline and not result.interrupted:
        from harness.load.decode_ratio import engine_baseline as measure
        from harness.load.decode_ratio import server_kv_len

        first, last = server_kv_len(max_len, wl.input_len, wl.input_len + wl.output_len - 2)
        console.print(
            f"  engine baseline: {name} decode step, batch {max(levels)}, KV bucket {last} "
            f"(the server's decode steps used {first}..{last}); fresh child, median of 15 steps"
        )
        meta["engine_baseline"] = measure(name, max(levels), last) | {"kv_len_first": first}
    summary = write_run(result, run_dir, meta)
    if finder is not None:
        from harness.load.find_max import write_search

        summary["plots"] += [str(p) for p in write_search(finder.block, run_dir)]
    print_closing(console, summary, run_dir)
    if result.interrupted:
        raise typer.Exit(130)
    if result.partial_reason:
        console.print(f"[red]partial run:[/red] {result.partial_reason}")
        raise typer.Exit(1)
