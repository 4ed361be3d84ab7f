"""Server settings: defaults < YAML file (``--config``) < ``MMSERVE_*`` env < CLI flags.

Every limit the server enforces is a setting here, with a default that suits
the default preset; README.md carries the table.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Literal

import yaml

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    NoDecode,
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from models.families.presets import PRESET_NAMES
from router.inline_decode import INLINE_IMAGE_MAX_PIXELS
from server.runtime_settings import runtime_conflict

LaneName = Literal["text", "vision", "fusion"]


class Settings(BaseSettings):
    """All of mmserve's knobs. Env names are ``MMSERVE_`` + the field name upper-cased."""

    model_config = SettingsConfigDict(env_prefix="MMSERVE_", extra="forbid", protected_namespaces=())

    # -- model ----------------------------------------------------------------
    preset: str = Field("vit-l16", description="Model preset served when no model repository is given.")
    model_repo: Path | None = Field(None, description="Model repository directory (mmserve init-model-repo).")
    model: str | None = Field(
        None, description="A pretrained model to serve: a local directory or a Hugging Face Hub id (SigLIP, CLIP, or "
                          "an mmserve model repository), resolved through the local Hub cache.")
    fusion_head: Path | None = Field(
        None, description="A trained fusion head (mmserve train-fusion); default: fusion_head.safetensors beside "
                          "the model, if there is one.")
    normalize_embeddings: bool | None = Field(
        None, description="L2-normalise the served embeddings; default: the model family's convention (true for "
                          "SigLIP and CLIP, false for the presets).")
    seed: int = Field(0, description="Seed for a preset's random weights.")
    synthetic_vision_ms: float = Field(
        20.0, ge=0, description="The synthetic preset's median vision stage time per batch (slept, not computed).")
    synthetic_text_ms: float = Field(4.0, ge=0, description="The synthetic preset's median text stage time per batch.")
    synthetic_distribution: Literal["constant", "lognormal", "uniform"] = Field(
        "lognormal", description="How the synthetic preset's stage times spread around their medians.")
    synthetic_spread: float = Field(
        0.25, ge=0, description="lognormal: sigma of log(time); uniform: half-width as a fraction of the median.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available, else cpu.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="What the model computes in: auto = bfloat16 on a CUDA device that supports it "
                            "(float16 otherwise), float32 on the CPU. Answers are float32 numbers whatever it is.")
    decode_device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Where JPEG images are decoded: cuda = nvJPEG through torchvision.io.decode_jpeg "
                           "(other formats and images it refuses still decode on the CPU); needs a CUDA device.")
    jpeg_draft: bool = Field(
        False, description="Decode a large JPEG reduced in the DCT (1/2, 1/4 or 1/8 scale), down to the side the "
                           "model's resize needs: about half the decode CPU of a photo, pixels within about one "
                           "level; off by default, since the exact decode equals the reference processor.")
    served_model_name: str | None = Field(
        None, description="The model's name in answers, /v1/models and KServe v2; default: the Hub id or the "
                          "directory's name (a model repository's: the name in its model.yaml, which init-model-repo "
                          "sets to the directory's name). The string given to --model is accepted as a name too.")
    cuda_graphs: bool = Field(
        True, description="On CUDA, capture every warmed encoder shape as a CUDA graph before ready and replay "
                          "it (models.cuda_graphs); false: TorchScript (torchscript_encoders) or eager. Ignored "
                          "on the CPU.")
    runtime: Literal["auto", "torch", "onnxruntime"] = Field(
        "auto", description="What runs the towers: auto = ONNX Runtime on the CPU for the real models and the "
                            "tiny/ViT presets (torch when a graph cannot be exported or disagrees with torch, "
                            "logged), torch on CUDA and for the synthetic preset; onnxruntime = ONNX Runtime or "
                            "exit naming why. Under onnxruntime torchscript_encoders and cuda_graphs are ignored.")
    export_cache_dir: Path | None = Field(
        None, description="Where exported ONNX graphs are kept between starts (one directory per model, runtime, "
                          "exporter and ONNX Runtime versions, opset and quantization); default: "
                          "$XDG_CACHE_HOME/mmserve/onnx (~/.cache/mmserve/onnx).")
    quantize: Literal["int8"] | None = Field(
        None, description="int8: quantize the towers' matrix multiplies (ONNX Runtime only; refused with "
                          "--runtime torch); part of the fingerprint. Off by default.")
    quantize_min_cosine: float = Field(
        0.99, gt=0, le=1, description="With --quantize int8: the start-up probe set's int8-to-float32 cosine "
                                      "below which the server refuses to start.")
    compute_threads: int | None = Field(
        None, ge=1, le=1024, description="Intra-op threads of whichever runtime computes the towers (torch's "
                                         "pool, or each ONNX Runtime session's); default: the runtime's own "
                                         "(one per physical core).")
    fusion_backend: Literal["auto", "triton", "torch"] = Field(
        "auto", description="Cross-attention kernel: auto = Triton on CUDA, torch on CPU.")

    # -- network --------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind (0 = any free port).")
    grpc_port: int | None = Field(
        None, ge=1, le=65535, description="Also serve KServe v2 over gRPC on this port (Triton's default is 8001); "
                                          "off when unset. Needs the grpc extra (pip install mmserve[grpc]).")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    api_workers: int | None = Field(
        None, ge=1, le=64, description="API processes in front of the engines (HTTP, protocols, keys, limits, "
                                       "image decode); 1 with one engine: one process serves everything. Unset: "
                                       "chosen from the usable CPUs and the device "
                                       "(server/workers/default_count.py): 1 on a CPU device or on 2 CPUs, else "
                                       "min(CPUs - 1, 3).")

    engines: int | Literal["auto"] = Field(
        1, description="Engine processes behind the API processes, each with its own model, lanes, batcher and "
                       "segment cache; a request goes whole to one, chosen by its first cacheable segment "
                       "(server/workers/engine_dispatch.py). auto: one per visible GPU (one on the CPU). More "
                       "than 1 always runs API processes in front (--api-workers 1: one API process).")
    devices: Annotated[list[str] | None, NoDecode] = Field(
        None, description="One engine per listed device (cuda:0,cuda:1 ... or cpu); sets --engines. Each engine "
                          "sees only its own GPU (CUDA_VISIBLE_DEVICES).")
    engine_wait_bound_ms: float = Field(
        50.0, ge=0, description="With several engines: a cacheable request leaves the engine that owns its key "
                                "for the least-loaded one when the owner's estimated wait exceeds that one's "
                                "by more than this.")
    engine_dispatch: Literal["affinity", "round_robin"] = Field(
        "affinity", description="With several engines: affinity = by the first cacheable segment's key (the "
                                "segment cache is not split); round_robin = in turn, to measure what affinity "
                                "saves.")

    # -- input limits ---------------------------------------------------------
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1, description="Largest request body accepted.")
    max_image_pixels: int = Field(36_000_000, ge=1, description="Largest image (width x height), from its header.")
    max_text_chars: int = Field(100_000, ge=1, description="Longest text accepted before tokenizing.")
    max_images_per_request: int = Field(4, ge=1, le=64, description="Most images one request may carry.")
    max_labels_per_request: int = Field(
        1000, ge=1, description="Most labels one POST /v1/classify may score (each one a cached text segment).")
    max_candidates_per_request: int = Field(256, ge=1, description="Most candidates one POST /v1/rank may rank.")
    max_joint_tokens: int | None = Field(
        None, ge=1, description="Longest joint sequence (images x tokens per image + text tokens) a request may "
                                "fuse; default: max_images_per_request images beside the model's longest text.")
    decode_threads: int = Field(4, ge=1, description="Threads decoding images and tokenizing text.")
    max_decode_queue: int = Field(
        1024, ge=1, description="Items (requests or protocol rows) waiting for a decode thread before 503.")
    pixel_slots: int | None = Field(
        None, ge=1, description="With --api-workers N > 1, shared-memory slots per API process for decoded images on "
        "their way to the engine, each one model input (S x S x 3 bytes), free again once the engine copied it; "
        "default: max_images_per_request x the vision or fusion lane's queue bound, whichever is larger.")
    inline_image_max_pixels: int = Field(
        INLINE_IMAGE_MAX_PIXELS, ge=0,
        description="An item whose images (W x H from their headers, summed) are no larger is decoded on the event "
        "loop, not in the decode pool, whose hop costs more than such a decode (0: always the pool).")

    # -- batching (every lane; per-lane overrides below) ---------------------------
    max_batch_size: int = Field(8, ge=1, description="Largest batch a lane runs.")
    max_queue_delay_ms: float = Field(5.0, ge=0, description="Longest a request waits for its batch to fill.")
    max_queue_size: int = Field(256, ge=1, description="Requests a lane holds before refusing with 503.")
    text_max_batch_size: int | None = Field(None, ge=1)
    vision_max_batch_size: int | None = Field(None, ge=1)
    fusion_max_batch_size: int | None = Field(None, ge=1)
    text_max_queue_delay_ms: float | None = Field(None, ge=0)
    vision_max_queue_delay_ms: float | None = Field(None, ge=0)
    fusion_max_queue_delay_ms: float | None = Field(None, ge=0)
    text_max_queue_size: int | None = Field(None, ge=1)
    vision_max_queue_size: int | None = Field(None, ge=1)
    fusion_max_queue_size: int | None = Field(None, ge=1)
    default_timeout_ms: int = Field(30_000, ge=1, description="Deadline of a request that sets no timeout_ms.")
    text_default_timeout_ms: int | None = Field(None, ge=1)
    vision_default_timeout_ms: int | None = Field(None, ge=1)
    fusion_default_timeout_ms: int | None = Field(None, ge=1)
    priority_step_ms: float = Field(
        1000.0, ge=0, description="How far high (low) priority moves a request ahead of (behind) its deadline.")
    drain_timeout_s: float = Field(30.0, ge=0, description="On SIGTERM, how long queued work may take to finish.")
    separate_text_executor: bool = Field(
        True, description="Run the text lane on its own compute thread (and CUDA stream), beside vision and fusion.")
    torchscript_encoders: bool = Field(
        True, description="Run the vision and text encoders as TorchScript graphs (checked against eager at "
        "start-up), so a forward takes the GIL once, not once per operator; false: eager PyTorch.")
    image_work_nice: int = Field(
        10, ge=0, le=19, description="CPU nice added to the threads doing image work (the vision/fusion compute "
        "thread, the decode pool), so text and request handling go first while both have work (Linux; 0: off).")
    api_process_nice: int = Field(
        5, ge=0, le=19, description="With --api-workers N > 1, CPU nice added to every API process, so the one "
        "engine, which every request passes, gets the cores first while both have work (Linux; 0: off).")
    api_process_start: Literal["forkserver", "spawn"] = Field(
        "forkserver", description="With --api-workers N > 1, how the supervisor starts an API process (the first N "
        "and every one started again): forkserver: forked from a process that has already imported what an API "
        "process imports (server/workers/api_forkserver.py; Linux), so it serves within a fraction of a second; "
        "spawn: a new interpreter (python -m server.workers.api_process), which imports it all again each time.")
    gc_young_threshold: int = Field(
        10_000, ge=1, description="Container objects allocated (net) between two collections of Python's youngest "
        "garbage-collector generation, in every process of the server (Python's default: 700, which under load "
        "collects about a hundred times a second and finds little).")

    # -- segment cache -------------------------------------------------------------
    cache_image_bytes: int = Field(
        1024**3, ge=0, description="Bytes of image segments (embedding, K, V) kept; 0 turns the image cache off.")
    cache_text_bytes: int = Field(
        64 * 1024**2, ge=0, description="Bytes of text segments (embedding, Q) kept; 0 turns the text cache off.")

    # -- operations -------------------------------------------------------------
    enable_fault_injection: bool = Field(
        False, description="Turn on POST /v1/admin/faults (stage delays for alert drills).")
    compute_hang_s: float = Field(
        60.0, ge=0, description="A batch running longer is a hung compute thread: liveness 503, serve exits "
                                "non-zero (0 = never).")

    # -- slow clients and security ------------------------------------------------------
    body_timeout_s: float = Field(30.0, gt=0, description="A request body not complete by then gets 408.")
    header_timeout_s: float = Field(
        10.0, gt=0, description="Request headers not complete this long after their first byte (or the "
                                "connection's start) get 408 and the connection is closed.")
    keep_alive_timeout_s: float = Field(5.0, gt=0, description="An idle keep-alive connection is closed after this.")
    api_keys: SecretStr | None = Field(
        None, description="Comma-separated API keys; when set, requests need Authorization: Bearer <key>.")
    api_key_file: Path | None = Field(
        None, description="A file of API keys, one per line (# starts a comment); a line may be sha256:<hex> "
                          "(mmserve hash-key) instead of the key itself.")
    admin_api_keys: SecretStr | None = Field(
        None, description="Comma-separated admin keys: the only keys the admin routes (DELETE /v1/cache, "
                          "/v1/admin/*, POST /v1/monitoring/baseline) accept; they may call every other route too.")
    admin_api_key_file: Path | None = Field(
        None, description="A file of admin keys, one per line, plain or sha256:<hex>, as api_key_file.")
    allow_open_admin: bool = Field(
        False, description="With no admin keys, leave the admin routes as open as the inference routes even when "
                           "bound to a non-loopback address (where they otherwise answer 403).")
    rate_limit: str | None = Field(
        None, pattern=r"^\s*\d+(\.\d+)?\s*/\s*s\s*(,\s*burst\s*=\s*\d+\s*)?$",
        description="Requests per second per key (per client address for requests without a key), as N/s or "
                    "N/s,burst=M (burst default N); over it: 429 rate_limited with Retry-After. Off when unset.")
    open_health_and_metrics: bool = Field(
        True, description="With keys set, /health/*, /v2/health/* and /metrics still answer without one.")
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Also serve /metrics and /health/* on this port, without a key.")
    cors_origins: str | None = Field(
        None, description="Comma-separated origins CORS allows ('*': any); CORS is off when unset.")

    # -- latency monitoring (T-Digest windows, KS drift) -----------------------------
    drift_window_s: float = Field(120.0, gt=0, description="Sliding window compared with the baseline.")
    drift_baseline_s: float = Field(
        600.0, gt=0, description="Least time after readiness learned as a route's baseline; frozen once it also "
                                 "holds drift_min_samples.")
    drift_period_s: float = Field(30.0, gt=0, description="How often drift is judged.")
    drift_threshold: float = Field(0.02, gt=0, lt=1, description="KS statistic D above which a period is shifted.")
    drift_consecutive: int = Field(3, ge=1, description="Shifted (calm) periods in a row that raise (clear) drift.")
    drift_min_samples: int = Field(5000, ge=1, description="Samples needed in window and baseline to judge; a "
                                                  "route's baseline learns until it holds them.")
    drift_tail_ratio: float = Field(1.5, gt=1, description="P99.9/P99.99 window/baseline ratio that is a shift.")

    # -- tracing (OpenTelemetry; the exporter reads the standard OTEL_* variables) ---------------
    tracing: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: on when OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT is set or OTEL_TRACES_EXPORTER=otlp; "
                            "needs mmserve[otel].")
    trace_sample_ratio: float = Field(
        0.01, ge=0, le=1, description="Share of traces kept (by trace id, as TraceIdRatioBased); 5xx answers, slow "
                                      "requests and a sampled traceparent are always kept.")
    trace_slow_ms: float = Field(
        1000.0, ge=0, description="A request slower than this is always traced (0: no slow rule).")

    @field_validator("preset")
    @classmethod
    def _preset_is_known(cls, value: str) -> str:
        """Checked here, not when the model loads: ``MMSERVE_PRESET`` skips the flag's ``choices``."""
        if value not in PRESET_NAMES:
            raise ValueError(f"unknown preset {value!r}; choose one of {', '.join(PRESET_NAMES)}")
        return value

    @field_validator("export_cache_dir", "model_repo", "fusion_head", "api_key_file", "admin_api_key_file")
    @classmethod
    def _home_expanded(cls, value: Path | None) -> Path | None:
        """``~/x`` from a config file or a quoted variable as the shell expands it in a flag (no shell there)."""
        return None if value is None else value.expanduser()

    @field_validator("rate_limit")
    @classmethod
    def _rate_limit_is_positive(cls, value: str | None) -> str | None:
        """``N/s`` with N > 0, and a burst of at least 1 when one is given (the pattern checked the form)."""
        if value is not None:
            rate, _, burst = value.partition(",")
            if float(rate.split("/")[0]) <= 0 or (burst and int(burst.split("=")[1]) < 1):
                raise ValueError("the rate must be > 0 requests per second and the burst >= 1, e.g. 100/s,burst=20")
        return value

    @model_validator(mode="after")
    def _pixel_slots_hold_a_request(self) -> Settings:
        """A request of the most images must fit in the pixel slots, or it could never be sent."""
        if self.pixel_slots is not None and self.pixel_slots < self.max_images_per_request:
            raise ValueError(f"pixel_slots ({self.pixel_slots}) must be at least max_images_per_request "
                             f"({self.max_images_per_request})")
        return self

    @model_validator(mode="after")
    def _devices_set_the_engine_count(self) -> Settings:
        """``--devices`` runs one engine per device: an ``--engines`` given beside it must say the same, or one of
        the two would be dropped without a word."""
        if (self.devices is not None and "engines" in self.model_fields_set
                and self.engines != len(self.devices)):
            devices = ",".join(self.devices)
            raise ValueError(f"--engines {self.engines} (MMSERVE_ENGINES) and --devices {devices} (MMSERVE_DEVICES, "
                             f"{len(self.devices)} engine{'s' if len(self.devices) > 1 else ''}) disagree: --devices "
                             "sets the engine count, leave --engines out")
        return self

    @model_validator(mode="after")
    def _runtime_can_serve_it(self) -> Settings:
        """What ONNX Runtime cannot serve (``server.runtime_settings``): refused before a weight loads."""
        is_synthetic = self.preset == "synthetic" and self.model is None and self.model_repo is None
        if why := runtime_conflict(runtime=self.runtime, quantize=self.quantize, device=self.device,
                                   dtype=self.dtype, is_synthetic=is_synthetic):
            raise ValueError(why)
        return self

    @field_validator("engines")
    @classmethod
    def _engines_in_range(cls, value: int | str) -> int | str:
        if value != "auto" and not 1 <= int(value) <= 64:
            raise ValueError("engines must be auto or between 1 and 64")
        return value

    @field_validator("devices", mode="before")
    @classmethod
    def _devices_listed(cls, value: object) -> object:
        """``cuda:0,cuda:1`` (a flag or the environment) as the list of its devices, each checked."""
        if isinstance(value, str):
            value = [device.strip() for device in value.split(",") if device.strip()]
        if isinstance(value, list):
            for device in value:
                if not (device == "cpu" or (device.startswith("cuda:") and device[5:].isdigit())):
                    raise ValueError(f"each device must be cpu or cuda:N, got {device!r}")
            if not value:
                raise ValueError("devices must name at least one device, e.g. cuda:0,cuda:1")
        return value

    def lane_value(self, lane: LaneName, name: str) -> float:
        """A batching knob for one lane: its override if set, else the shared value."""
        override = getattr(self, f"{lane}_{name}")
        return getattr(self, name) if override is None else override


class ConfigFileError(Exception):
    """``--config`` names a file that cannot be read, is not a YAML mapping, or holds a key that is no setting.

    The message is one line naming ``--config`` and the path (or the key and the path), for the CLI to print.
    """


def read_config_file(config_file: Path) -> dict[str, object]:
    """The settings a ``--config`` YAML file holds, each key checked against ``Settings``' fields.

    A missing file is refused rather than read as empty: a typo in the path must not start the server on
    defaults. Raises ``ConfigFileError``.
    """
    try:
        text = config_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigFileError(f"--config {config_file}: cannot read the file ({why})") from e
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigFileError(f"--config {config_file}: not valid YAML ({' '.join(str(e).split())})") from e
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigFileError(f"--config {config_file}: holds a YAML {type(values).__name__}, not a mapping of "
                              "settings (e.g. max_batch_size: 16)")
    for key in values:
        if str(key) not in Settings.model_fields:
            close = difflib.get_close_matches(str(key), list(Settings.model_fields), n=1)
            hint = f"; did you mean {close[0]}?" if close else " (settings are the flags' names with _ for -)"
            raise ConfigFileError(f"{key} in {config_file}: not a setting of mmserve{hint}")
    return {str(key): value for key, value in values.items()}


def load_settings(config_file: Path | None = None, **overrides: object) -> Settings:
    """Settings from defaults, an optional YAML file, the environment and ``overrides``.

    ``overrides`` are CLI flags; ``None`` values mean "not given" and are dropped. The file is read and its
    keys checked first (``read_config_file``: ``ConfigFileError``).
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    if config_file is None:
        return Settings(**given)
    file_values = read_config_file(config_file)

    class _WithFile(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, InitSettingsSource(settings_cls, init_kwargs=file_values))

    return Settings.model_validate(_WithFile(**given).model_dump())
