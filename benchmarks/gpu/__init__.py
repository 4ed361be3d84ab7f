"""The one-shot GPU checks and benchmarks (``benchmarks/gpu/run.sh``); not collected by pytest."""
