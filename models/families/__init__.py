"""Model families: where each kind of model users bring (transformers SigLIP/CLIP, open_clip,
timm + a text encoder) and mmserve's own presets become a served ``MultimodalModel``.

Each module loads with the defining library's own code and reads that library's processor
settings, so answers equal the library's.
"""
