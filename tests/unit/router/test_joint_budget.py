"""The joint-token budget: images per request, and images x tokens per image + text tokens."""

from __future__ import annotations

import pytest

from models.served_facts import served_model_facts
from models.tokenizer import TokenizedText
from router.errors import JointTokensExceededError, TooManyImagesError
from router.joint_budget import JointTokenBudget


def _text(num_tokens: int) -> TokenizedText:
    return TokenizedText(tuple(range(100, 100 + num_tokens - 1)) + (1,), False, num_tokens)


def test_a_request_inside_the_budget_passes_unchanged_with_its_count():
    budget = JointTokenBudget(tokens_per_image=17, max_images_per_request=4, max_joint_tokens=60)
    text, joint = budget.fit(3, _text(9), truncate=False)
    assert text == _text(9)
    assert (joint.num_images, joint.tokens_per_image, joint.num_text_tokens, joint.total) == (3, 17, 9, 60)


def test_over_the_budget_is_refused_with_the_numbers():
    budget = JointTokenBudget(tokens_per_image=17, max_images_per_request=4, max_joint_tokens=60)
    with pytest.raises(JointTokensExceededError) as refused:
        budget.fit(3, _text(10), truncate=False)
    assert (refused.value.num_joint_tokens, refused.value.max_joint_tokens) == (61, 60)
    assert "3 images x 17 tokens + 10 text tokens = 61" in str(refused.value)


def test_truncate_cuts_the_text_to_what_the_images_leave_and_keeps_its_closing_token():
    budget = JointTokenBudget(tokens_per_image=17, max_images_per_request=4, max_joint_tokens=60)
    text, joint = budget.fit(3, _text(20), truncate=True)
    assert len(text.token_ids) == 9 and text.token_ids[-1] == 1 and text.is_truncated
    assert text.num_tokens_before_truncation == 20
    assert joint.total == 60


def test_images_that_leave_no_room_for_a_text_are_refused_even_with_truncate():
    budget = JointTokenBudget(tokens_per_image=17, max_images_per_request=4, max_joint_tokens=52)
    with pytest.raises(JointTokensExceededError):
        budget.fit(3, _text(5), truncate=True)


def test_without_a_text_only_the_image_count_is_limited():
    budget = JointTokenBudget(tokens_per_image=17, max_images_per_request=2, max_joint_tokens=17)
    assert budget.fit(2, None, truncate=False)[1].total == 34
    with pytest.raises(TooManyImagesError, match="3 images; the limit is 2"):
        budget.fit(3, None, truncate=False)


def test_the_defaults_come_from_the_model(tiny_bundle):
    budget = JointTokenBudget.for_model(served_model_facts(tiny_bundle))
    assert budget.tokens_per_image == tiny_bundle.model.vision.num_tokens
    assert budget.max_joint_tokens == 4 * budget.tokens_per_image + tiny_bundle.tokenizer.max_tokens
    with pytest.raises(ValueError, match="must hold one image"):
        JointTokenBudget.for_model(served_model_facts(tiny_bundle), max_joint_tokens=budget.tokens_per_image - 1)
