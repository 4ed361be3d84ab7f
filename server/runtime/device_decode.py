"""The nvJPEG batch decoder the intake is handed with ``--decode-device cuda`` (engine-side: torch)."""

from __future__ import annotations

from models.jpeg_decode import DeviceJpegDecoder
from models.loading.repository import ModelBundle
from server.settings import Settings


def device_jpeg_decoder(settings: Settings, bundle: ModelBundle) -> DeviceJpegDecoder | None:
    """With ``--decode-device cuda``, the nvJPEG batch decoder on the model's device, at its input geometry.

    It takes only JPEGs under the same pixel limit (``MMSERVE_MAX_IMAGE_PIXELS``)
    whose header says RGB or grey and no EXIF rotation; every other image, and
    any nvJPEG refuses, goes to ``image_decoder`` with its checks and 4xx errors.
    Start-up has already refused ``cuda`` on a machine without it
    (``server.runtime.model_loading.plan_device``).
    """
    if settings.decode_device != "cuda":
        return None
    return DeviceJpegDecoder(bundle.model.device, bundle.config.preprocess, max_pixels=settings.max_image_pixels)
