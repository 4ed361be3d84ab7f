"""Typed errors of the router: why a request was not served.

The server maps each to an HTTP answer (503 + Retry-After, 504, 500 with an
error id); the router never speaks HTTP.
"""

from __future__ import annotations


class RouterError(Exception):
    """Base class for the router's deliberate failures."""


class ServerRefusalError(RouterError):
    """A refusal for the server's state, whichever item met it first: never an item's error.

    A many-item call raises it as it is, not inside ``IntakeItemError``, so no
    answer blames a row for it ("row 0: the server is shutting down"), and
    one process answers as API processes in front of an engine do, which
    refuse such a call before any item is looked at.
    """


class DecodeQueueFullError(RouterError):
    """The decode pool's queue is full: nothing was decoded; ``retry_after_s`` is its backlog at its pace."""

    def __init__(self, num_waiting: int, retry_after_s: float) -> None:
        super().__init__(f"{num_waiting} requests already wait to be decoded (MMSERVE_MAX_DECODE_QUEUE); "
                         f"retry in {retry_after_s:.1f} s")
        self.num_waiting = num_waiting
        self.retry_after_s = retry_after_s


class QueueFullError(RouterError):
    """Admission control refused the request; ``retry_after_s`` estimates the drain."""

    def __init__(self, lane: str, reason: str, retry_after_s: float) -> None:
        super().__init__(f"the {lane} lane is saturated ({reason}); retry in {retry_after_s:.1f} s")
        self.lane = lane
        self.reason = reason
        self.retry_after_s = retry_after_s


class DeadlineExceededError(RouterError):
    """The request's deadline passed before it could be computed."""


class ShuttingDownError(ServerRefusalError):
    """The server is draining and takes no new requests (the message is the client's: never empty)."""

    def __init__(self, message: str = "the server is shutting down") -> None:
        super().__init__(message)


class ItemFailedError(RouterError):
    """This item failed inside the model (after the batch was split down to it).

    ``error_id`` is logged with the traceback so an operator can find it.
    """

    def __init__(self, error_id: str) -> None:
        super().__init__(f"inference failed (error id {error_id})")
        self.error_id = error_id


class ComputeUnavailableError(ServerRefusalError):
    """The compute thread is not running (died or never started)."""


class IntakeItemError(RouterError):
    """One item of a many-item intake call was refused or failed; ``error`` says why.

    The whole call fails with it (a protocol answers a request as a unit), and
    ``item_index`` names the item so the answer can point at it. ``error`` is
    whatever the item raised: the decoder's own error, a model's
    ``TextTooLongError`` or one of this module's.
    """

    def __init__(self, item_index: int, error: Exception) -> None:
        super().__init__(f"item {item_index}: {error}")
        self.item_index = item_index
        self.error = error


class TooManyImagesError(RouterError):
    """A request carries more images than ``max_images_per_request`` allows."""

    def __init__(self, num_images: int, max_images: int) -> None:
        super().__init__(f"the request has {num_images} images; the limit is {max_images} "
                         "(MMSERVE_MAX_IMAGES_PER_REQUEST)")
        self.num_images = num_images
        self.max_images = max_images


class JointTokensExceededError(RouterError):
    """Image tokens plus text tokens outgrow what the cross-modal layer takes (``max_joint_tokens``)."""

    def __init__(self, num_images: int, tokens_per_image: int, num_text_tokens: int, max_joint_tokens: int) -> None:
        total = num_images * tokens_per_image + num_text_tokens
        super().__init__(
            f"{num_images} images x {tokens_per_image} tokens + {num_text_tokens} text tokens = {total} joint "
            f"tokens; the limit is {max_joint_tokens} (MMSERVE_MAX_JOINT_TOKENS; send \"truncate\": true to cut "
            "the text to fit)")
        self.num_images = num_images
        self.tokens_per_image = tokens_per_image
        self.num_text_tokens = num_text_tokens
        self.num_joint_tokens = total
        self.max_joint_tokens = max_joint_tokens


class ImageItemError(RouterError):
    """Image ``image_index`` of a request could not be decoded; ``error`` is the decoder's own error."""

    def __init__(self, image_index: int, error: Exception) -> None:
        super().__init__(f"image {image_index}: {error}")
        self.image_index = image_index
        self.error = error
