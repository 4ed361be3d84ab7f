"""``ItemFacts.with_text`` keeps every fact of what was sent and adds the text's, whatever fields there are."""

from __future__ import annotations

import dataclasses

from models.tokenizer import TokenizedText
from router.item_facts import ItemFacts
from router.joint_budget import JointTokens


def test_with_text_keeps_every_other_field_and_sets_the_texts():
    sent = ItemFacts(protocol="openai", priority="high", image_encodings=("jpeg", "png"), image_pixels=(640 * 480, None),
                     image_bytes=(1234, 99), raw_shapes=((4, 4, 3),), num_images=2, image_encoding="mixed",
                     largest_image_pixels=640 * 480)
    text = TokenizedText(token_ids=(2, 70, 71, 3), is_truncated=True, num_tokens_before_truncation=9)
    joint = JointTokens(num_images=2, tokens_per_image=17, num_text_tokens=4, max_joint_tokens=64)
    facts = sent.with_text(text, joint)
    assert facts == dataclasses.replace(sent, num_text_tokens=4, is_text_truncated=True, num_joint_tokens=38)
    changed = {f.name for f in dataclasses.fields(ItemFacts) if getattr(facts, f.name) != getattr(sent, f.name)}
    assert changed == {"num_text_tokens", "is_text_truncated", "num_joint_tokens"}


def test_with_no_text_the_text_facts_stay_none():
    sent = ItemFacts(protocol="native", priority="normal", num_images=1, image_encodings=("jpeg",))
    assert sent.with_text(None, None) == sent
