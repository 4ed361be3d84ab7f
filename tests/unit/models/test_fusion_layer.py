"""The fusion layer: packed text, per-item independence, and the backend flag."""

from __future__ import annotations

import torch

from models.fusion import LowRankCrossAttention


def _inputs(lengths: list[int], seed: int = 0, text_dim: int = 24, image_dim: int = 40, num_image_tokens: int = 17):
    generator = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    text_tokens = torch.randn(total, text_dim, generator=generator)
    image_tokens = torch.randn(len(lengths), num_image_tokens, image_dim, generator=generator)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths), 0)
    return text_tokens, image_tokens, cu, torch.randn(len(lengths), text_dim, generator=generator), \
        torch.randn(len(lengths), image_dim, generator=generator)


def _layer(backend: str) -> LowRankCrossAttention:
    torch.manual_seed(3)
    return LowRankCrossAttention(text_dim=24, image_dim=40, rank=16, backend=backend).eval()


def _run(layer, text_tokens, image_tokens, cu, text_pooled, image_pooled):
    with torch.inference_mode():
        q = layer.project_text(text_tokens)
        k, v = layer.project_image(image_tokens)
        return layer(q, cu, k, v, text_pooled, image_pooled)


def test_batched_equals_one_item_at_a_time():
    lengths = [1, 5, 3, 9]
    text_tokens, image_tokens, cu, text_pooled, image_pooled = _inputs(lengths)
    layer = _layer("torch")
    batched = _run(layer, text_tokens, image_tokens, cu, text_pooled, image_pooled)
    for i, length in enumerate(lengths):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        single = _run(layer, text_tokens[rows], image_tokens[i : i + 1],
                      torch.tensor([0, length], dtype=torch.int32), text_pooled[i : i + 1], image_pooled[i : i + 1])
        torch.testing.assert_close(batched.fused[i], single.fused[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(batched.score[i], single.score[0], rtol=0, atol=1e-6)


def test_matches_the_formula_written_out():
    lengths = [2, 4]
    text_tokens, image_tokens, cu, text_pooled, image_pooled = _inputs(lengths, seed=1)
    layer = _layer("torch")
    out = _run(layer, text_tokens, image_tokens, cu, text_pooled, image_pooled)
    with torch.inference_mode():
        for i in range(len(lengths)):
            rows = slice(int(cu[i]), int(cu[i + 1]))
            q = text_tokens[rows] @ layer.q_proj.weight.T  # (Lt, r)
            k = image_tokens[i] @ layer.k_proj.weight.T  # (Lv, r)
            v = image_tokens[i] @ layer.v_proj.weight.T  # (Lv, d_v)
            attended = torch.softmax(q @ k.T / 16**0.5, dim=-1) @ v  # (Lt, d_v)
            fused = layer.norm(layer.out_proj(attended.mean(0)) + text_pooled[i])
            score = torch.nn.functional.cosine_similarity(fused, layer.image_proj(image_pooled[i]), dim=0)
            torch.testing.assert_close(out.fused[i], fused, rtol=0, atol=1e-5)
            torch.testing.assert_close(out.score[i], score, rtol=0, atol=1e-5)


def test_auto_backend_on_cpu_equals_the_torch_backend():
    args = _inputs([3, 1, 7], seed=2)
    torch.testing.assert_close(_run(_layer("auto"), *args).fused, _run(_layer("torch"), *args).fused, rtol=0, atol=0)


def test_packed_keys_attend_over_all_of_an_items_images():
    """Item b's text attends over its images' tokens concatenated: rows cu_seqlens_k[b]:cu_seqlens_k[b+1]."""
    lengths, image_tokens_per_item = [3, 2, 4], [17 + 9, 0, 5]
    text_tokens, _, cu, text_pooled, image_pooled = _inputs(lengths, seed=4)
    image_tokens = torch.randn(sum(image_tokens_per_item), 40, generator=torch.Generator().manual_seed(5))
    cu_k = torch.tensor([0, 26, 26, 31], dtype=torch.int32)
    layer = _layer("torch")
    with torch.inference_mode():
        q = layer.project_text(text_tokens)
        k, v = layer.project_image(image_tokens)  # (Tk, r), (Tk, d_v)
        out = layer(q, cu, k, v, text_pooled, image_pooled, cu_seqlens_k=cu_k)
        for i in range(len(lengths)):
            rows, keys = slice(int(cu[i]), int(cu[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
            attended = torch.softmax(q[rows] @ k[keys].T / 16**0.5, dim=-1) @ v[keys]  # (Lt, d_v); 0 columns: 0
            fused = layer.norm(layer.out_proj(attended.mean(0)) + text_pooled[i])
            torch.testing.assert_close(out.fused[i], fused, rtol=0, atol=1e-5)
