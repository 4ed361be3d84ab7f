"""What every benchmark shares: servers in their own processes, A-B-B-A runs, CPU accounting, tables, figures.

A benchmark script says what it sends and what it compares; this package does
the rest, the same way for every benchmark:

- ``server_commands``: ``mmserve serve`` and its peers (LitServe, Infinity from
  its own venv: ``peer_venv``) as commands on a free loopback port;
  ``server_process``: ``running`` one server for a block, ``paused_servers``
  for a set, ``resumed`` for one measured run (the idle ones SIGSTOPped).
- ``alternation``: two servers measured in turn, A-B-B-A (``compare``,
  ``run_alternated``, ``run_saturation``); ``wrk_load``: saturation from
  ``wrk`` instead of the Python generator (``wrk_saturation``).
- ``cpu_accounting``: a server's CPU per answered request and the CPUs other
  processes took (``CpuMeter``); ``process_resources``: RSS and open files.
- ``load_runs`` and ``sample_stats``: one generator run to its report or
  samples; percentiles, answers per second, the generator's lag.
- ``comparison_table`` and ``table_layout``: the printed tables; ``machine``:
  the header line; ``figures``: ``--save-figures PATH`` for ``benchmarks.headline``.

``benchmarks/peer_litserve.py`` is the short example of a comparison,
``benchmarks/soak.py`` of a single server. Like the rest of ``benchmarks``,
nothing here imports ``server``: servers are driven over HTTP as a user drives them.
"""

from benchmarks.harness.alternation import (
    AlternationPlan, ConfigFor, RunSpec, Saturate, SaturationRun, ServerRuns, abba_order, abba_sequence, compare, log,
    python_saturation, run_alternated, run_orders, run_saturation, saturation_order,
)
from benchmarks.harness.comparison_table import (
    Targets, cpu_ratio, cpu_target_text, format_comparison, format_saturation, verdict_text, verdicts,
)
from benchmarks.harness.cpu_accounting import CpuMeter, CpuSpent, cpu_ms_per_request
from benchmarks.harness.figures import Figure, add_save_figures_argument, comparison_figures, save_figures
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
