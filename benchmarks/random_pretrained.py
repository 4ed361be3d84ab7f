"""Small random image–text models written as their libraries write them, for tests and benchmarks.

Weights cannot be downloaded here, so the loading code is exercised on models
built with each library's own constructors and saved with its own
``save_pretrained``: the same files a Hub repository holds, only small and
random. Nothing of a model's code is copied; the tokenizers are real ones
(a SentencePiece model trained on a few lines for SigLIP, a byte-level BPE
for CLIP) so CJK text, truncation and padding behave as they do for users.

    write_siglip(dir)    SiglipModel + SiglipTokenizer + SiglipImageProcessor (squash to S px)
    write_clip(dir)      CLIPModel + CLIPTokenizer + CLIPImageProcessor (shortest edge, centre crop)
    write_open_clip(dir) open_clip CLIP (its bundled SimpleTokenizer), as open_clip's save_for_hf lays it out;
                         sigmoid=True adds a logit_bias (a SigLIP-style open_clip model) and squashes
    write_timm_vit(dir)  a timm ViT as timm's save_for_hf writes it (config.json + model.safetensors)
    write_bert(dir)      BertModel + a WordPiece BertTokenizer (Latin letters and the CJK of SENTENCES)
    write_timm_bert_repository(dir)   model.yaml pairing the two (vision.timm_dir + text.hf_dir)
    write_hub_cache(cache_dir, repo_id, model_dir)   the directory laid out as the Hub cache holds it
"""

from __future__ import annotations

import io
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

SENTENCES = (
    "a photo of a cat", "two dogs playing on the grass", "a red bicycle leaning on a wall",
    "a bowl of fruit on a wooden table", "the city skyline at night", "a person riding a horse",
    "a plate of pasta with tomato sauce", "a blue car parked on the street", "snow on the mountains",
    "一只猫坐在窗台上", "两只狗在草地上玩耍", "桌子上有一碗水果", "夜晚的城市天际线",
)


@dataclass(frozen=True)
class TowerSize:
    """Widths and depths of a random model: tiny for tests, larger for benchmarks."""

    image_size: int = 32
    patch_size: int = 8
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    intermediate_size: int = 128
    projection_dim: int = 48


def sentencepiece_model(vocab_size: int, repeats: int = 4) -> bytes:
    """A unigram SentencePiece model trained on ``SENTENCES`` (``repeats`` times over), as SigLIP's tokenizer reads it."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * repeats), model_writer=model, vocab_size=vocab_size,
        character_coverage=1.0, model_type="unigram", hard_vocab_limit=False, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>", minloglevel=2,
    )
    return model.getvalue()


def write_siglip(directory: Path, size: TowerSize = TowerSize(), seed: int = 0, max_text_tokens: int = 16) -> Path:
    """A random ``SiglipModel`` with its tokenizer and image processor, as ``save_pretrained`` writes them.

    ``max_text_tokens``: the text positions (and the tokenizer's ``model_max_length``); transformers'
    zero-shot pipeline pads SigLIP texts to 64, so a model compared with it needs 64.
    """
    from transformers import (
        SiglipConfig, SiglipImageProcessorPil, SiglipModel, SiglipTextConfig, SiglipTokenizer, SiglipVisionConfig,
    )

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spiece = directory / "spiece.model"
    spiece.write_bytes(sentencepiece_model(vocab_size=64))
    tokenizer = SiglipTokenizer(vocab_file=str(spiece), model_max_length=max_text_tokens)
    text = SiglipTextConfig(vocab_size=len(tokenizer), hidden_size=size.hidden_size,
                            intermediate_size=size.intermediate_size, num_hidden_layers=size.num_layers,
                            num_attention_heads=size.num_heads, max_position_embeddings=max_text_tokens,
                            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    vision = SiglipVisionConfig(image_size=size.image_size, patch_size=size.patch_size, hidden_size=size.hidden_size,
                                intermediate_size=size.intermediate_size, num_hidden_layers=size.num_layers,
                                num_attention_heads=size.num_heads)
    torch.manual_seed(seed)
    model = SiglipModel(SiglipConfig(text_config=text.to_dict(), vision_config=vision.to_dict())).eval()
    with torch.no_grad():  # the constructor leaves them at 0; the score should depend on both
        model.logit_scale.fill_(2.3)
        model.logit_bias.fill_(-1.5)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    SiglipImageProcessorPil(size={"height": size.image_size, "width": size.image_size}).save_pretrained(str(directory))
    return directory


def _clip_vocab() -> dict[str, int]:
    """Every byte-level character, alone and ending a word, plus CLIP's special tokens: BPE without merges."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(alphabet + [c + "</w>" for c in alphabet])}
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    return vocab


def write_clip(directory: Path, size: TowerSize = TowerSize(), seed: int = 0) -> Path:
    """A random ``CLIPModel`` with a byte-level BPE tokenizer and a shortest-edge + crop processor."""
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTextConfig, CLIPTokenizer, CLIPVisionConfig

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = CLIPTokenizer(vocab=_clip_vocab(), merges=[], model_max_length=77)
    text = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=size.hidden_size,
                          intermediate_size=size.intermediate_size, num_hidden_layers=size.num_layers,
                          num_attention_heads=size.num_heads, max_position_embeddings=77,
                          projection_dim=size.projection_dim, bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    vision = CLIPVisionConfig(image_size=size.image_size, patch_size=size.patch_size, hidden_size=size.hidden_size,
                              intermediate_size=size.intermediate_size, num_hidden_layers=size.num_layers,
                              num_attention_heads=size.num_heads, projection_dim=size.projection_dim)
    torch.manual_seed(seed)
    config = CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=size.projection_dim)
    model = CLIPModel(config).eval()
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    resize = size.image_size + size.image_size // 8
    CLIPImageProcessorPil(size={"shortest_edge": resize},
                          crop_size={"height": size.image_size, "width": size.image_size}).save_pretrained(str(directory))
    return directory


def write_open_clip(directory: Path, size: TowerSize = TowerSize(), seed: int = 0, sigmoid: bool = False) -> Path:
    """A random open_clip ``CLIP`` in the layout of open_clip's ``save_for_hf`` (safetensors weights).

    The architecture is a model config dict in ``open_clip_config.json``;
    open_clip builds it from there (``create_model("local-dir:DIR")``, no
    weights yet), then its own ``save_config_for_hf`` rewrites the config
    and the weights go to ``open_clip_model.safetensors``. The tokenizer is
    open_clip's bundled CLIP BPE (``SimpleTokenizer``), which needs no files.
    """
    import json

    import open_clip
    from open_clip.push_to_hf_hub import save_config_for_hf
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model_cfg = {
        "embed_dim": size.projection_dim,
        "vision_cfg": {"image_size": size.image_size, "patch_size": size.patch_size, "width": size.hidden_size,
                       "layers": size.num_layers, "head_width": size.hidden_size // size.num_heads,
                       "mlp_ratio": size.intermediate_size / size.hidden_size},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": size.hidden_size, "heads": size.num_heads,
                     "layers": size.num_layers, "mlp_ratio": size.intermediate_size / size.hidden_size},
    }
    preprocess_cfg = {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711],
                      "interpolation": "bicubic", "resize_mode": "shortest"}
    if sigmoid:
        model_cfg["init_logit_bias"] = -2.0
        preprocess_cfg.update(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5], interpolation="bilinear",
                              resize_mode="squash")
    config_path = directory / "open_clip_config.json"
    config_path.write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": preprocess_cfg}))
    torch.manual_seed(seed)
    model = open_clip.create_model(f"local-dir:{directory}", load_weights=False, pretrained_text=False).eval()
    save_config_for_hf(model, config_path, model_config=model_cfg)
    save_file(model.state_dict(), str(directory / "open_clip_model.safetensors"))
    return directory


def write_timm_vit(directory: Path, size: TowerSize = TowerSize(), seed: int = 0) -> Path:
    """A random timm ViT (a 10-class head, as a fine-tuned checkpoint has) saved by timm's ``save_for_hf``."""
    import timm
    from timm.models import save_for_hf

    torch.manual_seed(seed)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=size.image_size,
                              patch_size=size.patch_size, embed_dim=size.hidden_size, depth=size.num_layers,
                              num_heads=size.num_heads, mlp_ratio=size.intermediate_size / size.hidden_size,
                              num_classes=10)
    save_for_hf(model, str(directory), safe_serialization=True)
    return Path(directory)


def write_bert(directory: Path, size: TowerSize = TowerSize(), seed: int = 0, max_tokens: int = 256) -> Path:
    """A random ``BertModel`` with a WordPiece tokenizer whose vocabulary covers the CJK of ``SENTENCES``."""
    from transformers import BertConfig, BertModel, BertTokenizer

    directory = Path(directory)
    letters = "abcdefghijklmnopqrstuvwxyz"
    cjk = sorted({c for sentence in SENTENCES for c in sentence if ord(c) > 0x2E80})
    words = sorted({w for sentence in SENTENCES for w in sentence.split() if w.isascii()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *("##" + c for c in letters), *cjk, *words]
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}, model_max_length=max_tokens)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=size.hidden_size, num_hidden_layers=size.num_layers,
                        num_attention_heads=size.num_heads, intermediate_size=size.intermediate_size,
                        max_position_embeddings=max_tokens, pad_token_id=tokenizer.pad_token_id)
    BertModel(config).eval().save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def write_timm_bert_repository(directory: Path, size: TowerSize = TowerSize(), seed: int = 0) -> Path:
    """An mmserve model repository pairing ``write_timm_vit`` and ``write_bert`` (no weights file: head untrained)."""
    import yaml

    directory = Path(directory)
    write_timm_vit(directory / "vit", size, seed)
    write_bert(directory / "bert", size, seed)
    (directory / "model.yaml").write_text(yaml.safe_dump(
        {"name": directory.name, "vision": {"timm_dir": "vit"}, "text": {"hf_dir": "bert"}, "fusion": {"rank": 8}}))
    return directory


def write_hub_cache(cache_dir: Path, repo_id: str, model_dir: Path, revision: str = "0" * 40) -> Path:
    """Lay ``model_dir`` out as the Hub cache holds ``repo_id`` (refs/main -> snapshots/<rev>); returns the snapshot."""
    repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot
