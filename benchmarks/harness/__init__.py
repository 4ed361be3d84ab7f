"""What every benchmark shares: servers in their own processes, A-B-B-A runs, CPU accounting, tables, figures.

A benchmark script says what it sends and what it compares; this package does
the rest, the same way for every benchmark: ``server_commands`` (mmserve,
LitServe and Infinity from its own venv, ``peer_venv``, on free loopback
ports) and ``server_process`` (``running``, ``paused_servers``, ``resumed``);
``alternation`` (A-B-B-A: ``compare``, ``run_alternated``, ``run_saturation``)
with saturation from the Python generator or ``wrk_load``; ``cpu_accounting``
(CPU per answer, the CPUs others took) and ``process_resources`` (RSS, open
files); ``load_runs`` and ``sample_stats``; ``comparison_table``,
``table_layout``, ``machine`` and ``figures`` (``--save-figures PATH``).
``benchmarks/peer_litserve.py`` is the short example of a comparison,
``benchmarks/soak.py`` of a single server. Nothing here imports ``server``.
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
