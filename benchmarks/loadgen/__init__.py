"""``mmserve bench``: an open-loop load generator with trace replay, reports and plots.

Module map (each owns one thing):

    cli            flags -> BenchConfig -> run -> table / JSON / PNG
    config         BenchConfig, RunMode: a validated run description
    bench          one run end to end (prepare, scrape, send, drain, scrape, report)
    runner         open and closed loop senders; Sample, RunResult
    connection_slots  one single-connection HTTP client per request in flight
    workload       Poisson arrivals, modality mix, uniform / Zipf image choice
    trace          trace file formats (JSONL, OTLP spans) and replay schedules
    request_spec   Modality, RequestSpec, Arrival
    image_pool     seeded in-process images, pre-encoded
    text_source    fresh seeded texts
    payload        RequestSpec -> request body bytes
    stats          exact percentiles, rates, generator lag, timeline
    server_metrics /metrics scrape and before/after diff
    report         JSON report and the end-of-run table
    plot           PNG: latency CDF per route, throughput and p99 over time
    progress       the tqdm bar on stderr

Nothing here imports the server: the generator only speaks HTTP.
"""
