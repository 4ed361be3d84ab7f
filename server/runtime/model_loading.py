"""Which model the server runs: a pretrained model (``--model``), a repository, else a seeded preset."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from models.errors import DeviceSettingError, ModelRepositoryError
from models.families.pretrained import load_pretrained
from models.loading.repository import ModelBundle, build_preset, load_repository
from models.families.synthetic import ServiceTime, SyntheticServiceTimes
from models.cuda_graphs import CudaGraphBackend
from models.families.presets import SYNTHETIC_ARCHITECTURE
from models.library_warnings import drop_unactionable_library_warnings
from models.precision import resolve_dtype
from models.torch_free.device_refusals import decode_device_on_cpu
from server.runtime_settings import runtime_conflict
from server.settings import Settings

logger = logging.getLogger(__name__)


def resolve_device(setting: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu`` (asked at start-up, not import)."""
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise DeviceSettingError("--device cuda (MMSERVE_DEVICE) but no CUDA device is visible to this process "
                                 "(check the driver, CUDA_VISIBLE_DEVICES and the container's GPU runtime); "
                                 "--device auto serves on the CPU instead")
    return setting


@dataclass(frozen=True)
class DevicePlan:
    """Where the model runs and in what: checked against the machine before any weight is read."""

    device: str  # "cpu" | "cuda"
    dtype: str  # models.precision.SERVED_DTYPES
    decode_device: str  # "cpu" | "cuda"


def plan_device(settings: Settings) -> DevicePlan:
    """``--device``, ``--dtype`` and ``--decode-device`` resolved on this machine; refuses what cannot run here
    (``DeviceSettingError``, naming the setting and what to use instead)."""
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    if settings.decode_device == "cuda" and device != "cuda":
        why = "--device cpu" if settings.device == "cpu" else "no CUDA device is visible"  # auto found no GPU
        raise decode_device_on_cpu(why)
    is_synthetic = synthetic_service_times(settings) is not None
    if why := runtime_conflict(runtime=settings.runtime, quantize=settings.quantize, device=device, dtype=dtype,
                               is_synthetic=is_synthetic, device_setting=settings.device, dtype_setting=settings.dtype):
        raise DeviceSettingError(why)  # auto's device or dtype, resolved here, that ONNX Runtime cannot serve
    return DevicePlan(device=device, dtype=dtype, decode_device=settings.decode_device)


def synthetic_service_times(settings: Settings) -> SyntheticServiceTimes | None:
    """The ``synthetic`` preset's drawn stage times from the settings; None for every other model."""
    if settings.preset != "synthetic" or settings.model is not None or settings.model_repo is not None:
        return None
    spread = dict(distribution=settings.synthetic_distribution, spread=settings.synthetic_spread)
    return SyntheticServiceTimes(vision=ServiceTime(settings.synthetic_vision_ms, **spread),
                                 text=ServiceTime(settings.synthetic_text_ms, **spread), seed=settings.seed)


def load_model(settings: Settings) -> ModelBundle:
    drop_unactionable_library_warnings()
    plan = plan_device(settings)
    device, dtype = plan.device, plan.dtype
    if settings.model is not None:
        bundle = load_pretrained(settings.model, device=device, backend=settings.fusion_backend, seed=settings.seed,
                                 fusion_head=settings.fusion_head,
                                 normalize_embeddings=settings.normalize_embeddings, dtype=dtype)
    elif settings.model_repo is not None:
        bundle = load_repository(settings.model_repo, device=device, backend=settings.fusion_backend,
                                 fusion_head=settings.fusion_head, dtype=dtype)
    else:
        if settings.fusion_head is not None:
            raise ModelRepositoryError(f"fusion head {settings.fusion_head} needs the model it was trained on: "
                                       "serve it with --model DIR or --model-repo DIR, not a preset")
        bundle = build_preset(settings.preset, seed=settings.seed, device=device,
                              backend=settings.fusion_backend, service_times=synthetic_service_times(settings),
                              dtype=dtype)
        logger.warning(
            "serving preset %r with RANDOM weights (seed %d): outputs are meaningless. To serve real "
            "weights, write a model repository with `mmserve init-model-repo DIR --preset %s`, put "
            "your weights in DIR/weights.safetensors (or point text.hf_dir in DIR/model.yaml at a local "
            "Hugging Face model), and start `mmserve serve --model-repo DIR`.",
            settings.preset, settings.seed, settings.preset,
        )
    if settings.served_model_name is not None:
        bundle = with_served_name(bundle, settings.served_model_name)
    logger.info("loaded model %s on %s in %s", bundle.config.name, device, dtype)
    _report_fusion_head(bundle, settings)
    return bundle


def with_served_name(bundle: ModelBundle, name: str) -> ModelBundle:
    """``bundle`` called ``name`` (``--served-model-name``); the fingerprint does not include the name."""
    if not name.strip():
        raise ModelRepositoryError("--served-model-name (MMSERVE_SERVED_MODEL_NAME) is empty")
    return dataclasses.replace(bundle, config=dataclasses.replace(bundle.config, name=name))


def _report_fusion_head(bundle: ModelBundle, settings: Settings) -> None:
    """Say at start-up which head runs: a trained one and its card's figures, or that it is untrained."""
    head = bundle.fusion_head
    if head.is_trained:
        held_out = head.card.get("held_out", {})
        logger.info("fusion head trained (%s): held-out AUC %s, accuracy %s", head.source,
                    held_out.get("auc", "unknown"), held_out.get("accuracy", "unknown"))
        return
    model = settings.model or settings.model_repo or f"preset {settings.preset}"
    logger.warning("the fusion head of %s is untrained: answers carry no match_score and fused_embedding is not "
                   "meaningful; train one with `mmserve train-fusion --model %s --pairs FILE.jsonl --out DIR`",
                   model, settings.model or settings.model_repo or "DIR")


def trace_encoders(bundle: ModelBundle, settings: Settings | None = None) -> None:
    """Swap in the encoders' graphs: CUDA graphs on a GPU (``models.cuda_graphs``, captured during warm-up),
    else TorchScript (``models.graphs``); an encoder that won't trace stays eager.

    ``settings`` (``cuda_graphs``, ``torchscript_encoders``) may turn either off; None: both on. The
    synthetic preset's towers sleep on the host, which a graph would not replay: they are never captured.
    """
    model = bundle.model
    use_cuda_graphs = settings is None or settings.cuda_graphs
    use_torchscript = settings is None or settings.torchscript_encoders
    is_captured = model.device.type == "cuda" and bundle.config.vision.architecture != SYNTHETIC_ARCHITECTURE
    if is_captured and use_cuda_graphs:
        model.drop_encoder_graphs()
        model.capture_encoder_graphs(lambda: CudaGraphBackend(model.device))
        logger.info("the encoders run from CUDA graphs, each bucket shape captured during warm-up")
        return
    if not use_torchscript:
        model.drop_encoder_graphs()
        return
    for outcome in model.trace_encoders():
        if outcome.is_traced:
            logger.info("the %s encoder runs as a TorchScript graph", outcome.encoder)
        else:
            logger.warning("the %s encoder runs eager: %s", outcome.encoder, outcome.reason)


async def seal_graphs_when_ready(bundle: ModelBundle, is_ready: Callable[[], bool],
                                 poll_interval_s: float = 0.05) -> None:
    """Once warm-up is over, stop CUDA-graph captures: a shape first met after ready runs eager, never captured
    on the hot path (the batch runner counts it in ``mmserve_cold_compiles_total{kind="shape"}``)."""
    while not is_ready():
        await asyncio.sleep(poll_interval_s)
    bundle.model.seal_encoder_graphs()
