"""Writing a ``.safetensors`` file with the mode any new file gets here.

safetensors' ``save_file`` makes its file 0600 whatever the umask, so a
model repository or a trained fusion head written by one user (root, building
an image) could not be read by the user who serves it. ``save_weights``
writes the file, then gives it the mode a file freshly created beside it gets
(0666 less the umask): the umask is observed, never set, since ``os.umask``
set-and-restore would race with every other thread creating files.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import torch
from safetensors.torch import save_file


def new_file_mode(directory: Path) -> int:
    """The permission bits ``open()`` gives a new file in ``directory``: 0666 less the umask (and any default ACL)."""
    probe = Path(directory) / f".mode-probe-{secrets.token_hex(8)}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return os.fstat(fd).st_mode & 0o777
    finally:
        os.close(fd)
        probe.unlink()


def save_weights(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """``save_file(tensors, path, metadata)``, the file then readable as the umask says (not 0600)."""
    path = Path(path)
    mode = new_file_mode(path.parent)
    save_file(tensors, str(path), metadata=metadata)
    path.chmod(mode)
