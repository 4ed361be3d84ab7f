"""What every benchmark shares: servers in their own processes, A-B-B-A runs, CPU accounting, tables.

A benchmark script says what it sends and what it compares; this package
does the rest, the same way for every benchmark:

- ``server_commands``: how to start mmserve (``mmserve_command``,
  ``mmserve_model_command``), its peers (``litserve_command``,
  ``infinity_command``, Infinity from a venv of its own: ``peer_venv``) and the
  OTLP sink, each on a free loopback port.
- ``server_process``: a started server (``ServerProcess``, a process group
  paused with SIGSTOP while another is measured); ``running`` for one server,
  ``paused_servers`` for a set started one after the other, ``resumed`` for one
  measured run.
- ``alternation``: two servers measured in turn, A-B-B-A (``compare``,
  ``run_alternated``): saturation then a fixed open-loop rate; saturation
  alone for any number of servers (``run_saturation``); the orders
  (``abba_order``, ``abba_sequence``, ``rotated``).
- ``wrk_load``: saturation from ``wrk`` (C, one thread) posting a set of
  bodies in turn (``write_bodies``, ``run_wrk``; ``wrk_saturation`` plugs it
  into ``run_alternated``), and its report read (``parse_wrk_report``).
- ``cpu_accounting``: from ``/proc``, a server's CPU per answered request and
  the CPUs other processes took during a run (``CpuMeter``).
- ``comparison_table``: the ratio table of a comparison with its targets and
  verdicts (``format_comparison``), saturation alone (``format_saturation``);
  ``table_layout`` for the other layouts.
- ``load_runs`` and ``sample_stats``: one generator run to its report or
  samples; percentiles, answers per second, the generator's lag.
- ``intervals``: a mean's 95 % interval; ``process_resources``: RSS and open
  files over a run; ``machine``: the machine line and the date for a header.
- ``figures``: ``--save-figures PATH``, the headline figures a run printed,
  as JSON for ``benchmarks.headline`` (``Figure``, ``save_figures``).

A new comparison with a peer is a short file::

    from benchmarks.harness import (AlternationPlan, Targets, compare, format_comparison, litserve_command,
                                    machine_line, mmserve_command, num_usable_cpus, utc_now)
    from benchmarks.loadgen.workload import TextLengthRange, parse_mix

    PLAN = AlternationPlan(seconds=10.0, num_rounds=2, warmup_s=3.0, concurrency=32)

    def main() -> None:
        commands = {"mmserve": mmserve_command("tiny", {"MAX_BATCH_SIZE": "8", "CACHE_TEXT_BYTES": "0"}),
                    "litserve": litserve_command("tiny", max_batch_size=8, max_queue_delay_ms=5.0)}
        # What it sends: texts only, 16-60 characters.
        runs = compare(commands, peer="litserve", ours="mmserve", plan=PLAN, label="text",
                       config_for=lambda run: run.config(mix=parse_mix("text:1"),
                                                         text_length=TextLengthRange(16, 60)))
        # What it compares: mmserve's throughput and p99 against LitServe's.
        print(f"texts, mmserve vs LitServe, {utc_now()}, {machine_line()}")
        print(format_comparison("tiny, text only", runs, "litserve", "mmserve", PLAN, Targets(1.0, 0.7),
                                num_usable_cpus(), "mm/lit"))

To saturate with ``wrk`` instead of the Python generator (the fixed-rate runs
stay on the Python generator), write each server's bodies once and pass
``saturate``; the table then also holds each server's CPU per answered request::

    bodies = {name: write_bodies(scratch / name, "text", "/v1/embeddings", [b'{"input": ["a cat"]}'])
              for name in commands}
    runs = compare(commands, "litserve", "mmserve", PLAN, config_for, "text",
                   saturate=wrk_saturation(bodies.__getitem__))
    print(format_comparison("tiny, text only", runs, "litserve", "mmserve", PLAN, Targets(1.0, 0.7, 0.8),
                            num_usable_cpus(), "mm/lit", generator="wrk -t1"))

A benchmark of one server uses ``running``, ``load_runs`` and ``sample_stats``::

    with running(mmserve_command("tiny", {"MAX_BATCH_SIZE": "8"})) as server:
        meter = CpuMeter(server)  # CPU of every process of the server, from /proc
        samples = run_samples(mixed_load_config(server.url, mix="text:1", duration_s=10.0, rate_rps=50.0))
        cpu_ms = meter.stop().server_ms_per_request(sum(sample.is_ok for sample in samples))
    print(f"p99 {latency_ms(samples, 99):.1f} ms, {cpu_ms:.2f} CPU ms per answered request")

(``run_report`` gives the run's JSON report instead, as ``mmserve bench`` prints it.)

Like the rest of ``benchmarks``, nothing here imports ``server``: servers are
driven over HTTP as a user drives them.
"""

from benchmarks.harness.alternation import (
    AlternationPlan, ConfigFor, RunSpec, Saturate, SaturationRun, ServerRuns, abba_order, abba_sequence, compare, log,
    python_saturation, rotated, run_alternated, run_orders, run_saturation, saturation_order,
)
from benchmarks.harness.comparison_table import (
    Targets, cpu_ratio, cpu_target_text, format_comparison, format_saturation, verdict_text, verdicts,
)
from benchmarks.harness.cpu_accounting import CpuMeter, CpuSpent, cpu_ms_per_request
from benchmarks.harness.figures import Figure, add_save_figures_argument, comparison_figures, save_figures
from benchmarks.harness.intervals import mean_interval
from benchmarks.harness.load_runs import capacity_rps, mixed_load_config, run_report, run_samples
from benchmarks.harness.machine import machine_line, num_usable_cpus, utc_now
from benchmarks.harness.sample_stats import lag_p99_ms, latency_ms, ok_rate_rps, percentile_ms
from benchmarks.harness.server_commands import (
    infinity_command, litserve_command, mmserve_command, mmserve_model_command,
)
from benchmarks.harness.server_process import (
    ServerCommand, ServerProcess, ServerStartError, paused_servers, resumed, running, start_paused,
)
from benchmarks.harness.table_layout import align, fixed_width, label_and_text, ruled
from benchmarks.harness.wrk_load import (
    WrkBodies, WrkReport, parse_wrk_report, run_wrk, wrk_path, wrk_saturation, write_bodies,
)
