"""Which model names a request may use: the served name, and the model as the user gave it.

    mmserve serve --model /models/my-clip                     served name: my-clip
        accepted: "my-clip", "/models/my-clip"
    mmserve serve --model google/siglip-base-patch16-224@main served name: google/siglip-base-patch16-224
        accepted: "google/siglip-base-patch16-224", "google/siglip-base-patch16-224@main", "siglip-base-patch16-224"
    mmserve serve --model ./my-clip --served-model-name clip  served name: clip
        accepted: "clip", "./my-clip", "my-clip"

Clients of vLLM and Infinity send the string they started the server with
(``"model": "/models/my-clip"``); clients that listed ``/v1/models`` send the
served name. Both reach the one model. The OpenAI ``model`` field and the
KServe v2 model name in the path go through ``ServedModelNames.accepts``;
answers always carry the served name (``--served-model-name``, else the Hub
id or the directory's name).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from models.served_facts import ServedModelFacts
from server.settings import Settings


@dataclass(frozen=True)
class ServedModelNames:
    """The served name and every other name that means this model."""

    served: str
    aliases: frozenset[str]

    def accepts(self, requested: str) -> bool:
        return requested == self.served or requested in self.aliases

    def described(self) -> str:
        """For an error message: ``'my-clip' (also called '/models/my-clip')``."""
        others = sorted(self.aliases - {self.served})
        also = f" (also called {', '.join(repr(name) for name in others)})" if others else ""
        return f"{self.served!r}{also}"


def _short_names(given: str) -> set[str]:
    """``given`` without a revision (``id@rev``), and the last part of a path or Hub id."""
    bare = given.partition("@")[0] if "@" in given and not given.startswith(("/", ".")) else given
    names = {given, bare}
    last = PurePath(bare.rstrip("/")).name
    if last:
        names.add(last)
    return {name for name in names if name}


def served_model_names(settings: Settings, model: ServedModelFacts) -> ServedModelNames:
    """The names of the model ``settings`` started: its served name, ``--model`` as given and its short name."""
    aliases: set[str] = set()
    for given in (settings.model, None if settings.model_repo is None else str(settings.model_repo)):
        if given:
            aliases |= _short_names(given)
    return ServedModelNames(served=model.name, aliases=frozenset(aliases))
