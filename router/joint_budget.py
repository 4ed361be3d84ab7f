"""How many images a request may carry and how long its joint token sequence may be.

The cross-modal layer attends from the text's tokens over the patch tokens
of every image in the request, so one request's work (and the kernel's key
length) is

    joint tokens = images x tokens per image + text tokens

The budget is checked in the intake after tokenizing and before any image
is decoded: a request over it costs the server a tokenization, nothing more.
The towers served today resize every image to one square input, so tokens
per image is the model's constant (its patch grid, plus a class token where
it has one) and the image headers are not needed to count it; a tower whose
token count followed the image's size would count it from the header here.

Over budget, a request is refused (``JointTokensExceededError``, the numbers
in the message) unless it asked to ``truncate``: then the text is cut first,
down to what the images leave, and the answer says it was cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.served_facts import ServedModelFacts
from models.torch_free.text_ids import TokenizedText, cut_to
from router.errors import JointTokensExceededError, TooManyImagesError

DEFAULT_MAX_IMAGES_PER_REQUEST = 4
_MIN_TEXT_TOKENS = 2  # a cut text keeps at least its first id and its closing special token


@dataclass(frozen=True)
class JointTokens:
    """One request's joint sequence as the budget counted it (the answer and ``mmserve_joint_tokens`` show it)."""

    num_images: int
    tokens_per_image: int
    num_text_tokens: int
    max_joint_tokens: int
    total: int = field(init=False)  # counted once, here: readers after the answer call nothing back

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", self.num_images * self.tokens_per_image + self.num_text_tokens)


@dataclass(frozen=True)
class JointTokenBudget:
    """``max_images_per_request`` and ``max_joint_tokens`` for one model."""

    tokens_per_image: int
    max_images_per_request: int
    max_joint_tokens: int

    def __post_init__(self) -> None:
        if self.max_images_per_request < 1:
            raise ValueError("max_images_per_request must be >= 1")
        if self.max_joint_tokens < self.tokens_per_image:
            raise ValueError(f"max_joint_tokens ({self.max_joint_tokens}) must hold one image "
                             f"({self.tokens_per_image} tokens)")

    @classmethod
    def for_model(cls, model: ServedModelFacts, *, max_images_per_request: int | None = None,
                  max_joint_tokens: int | None = None) -> JointTokenBudget:
        """The settings, or defaults from the model: 4 images, and room for that many beside its longest text."""
        tokens_per_image = model.num_image_tokens
        max_images = DEFAULT_MAX_IMAGES_PER_REQUEST if max_images_per_request is None else max_images_per_request
        if max_joint_tokens is None:
            max_joint_tokens = max_images * tokens_per_image + model.max_text_tokens
        return cls(tokens_per_image, max_images, max_joint_tokens)

    def fit(self, num_images: int, text: TokenizedText | None, *, truncate: bool) -> tuple[TokenizedText | None,
                                                                                         JointTokens]:
        """The text as it will run (cut to fit when ``truncate``) and the joint count; raises over budget."""
        if num_images > self.max_images_per_request:
            raise TooManyImagesError(num_images, self.max_images_per_request)
        num_text_tokens = 0 if text is None else len(text.token_ids)
        joint = JointTokens(num_images, self.tokens_per_image, num_text_tokens, self.max_joint_tokens)
        if text is None or joint.total <= self.max_joint_tokens:
            return text, joint  # without a text nothing attends over the images: only their count is limited
        room = self.max_joint_tokens - num_images * self.tokens_per_image
        if not truncate or room < _MIN_TEXT_TOKENS:
            raise JointTokensExceededError(num_images, self.tokens_per_image, num_text_tokens, self.max_joint_tokens)
        cut = cut_to(text, room)
        return cut, JointTokens(num_images, self.tokens_per_image, len(cut.token_ids), self.max_joint_tokens)
