"""Built-in language models (catalogue.yaml): public config numbers, each with its source."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from compressor.errors import ModelLoadError, did_you_mean
from compressor.decoders.shapes import ModelShape, from_hf_config


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    source: str          # Hugging Face repo id of the config the numbers come from
    params: int          # the published parameter count (tests check shapes reproduce it)
    config: dict
    active_params: int | None = None   # a mixture of experts: the parameters a token reads

    def shape(self) -> ModelShape:
        return from_hf_config(self.config, name=self.name, source=f"catalogue: {self.source}")


@lru_cache(maxsize=1)
def entries() -> dict[str, CatalogueEntry]:
    text = resources.files("compressor.decoders").joinpath("catalogue.yaml").read_text(encoding="utf-8")
    raw = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return {name: CatalogueEntry(name=name, source=str(e["source"]), params=int(e["params"]),
                                 config=dict(e["config"]),
                                 active_params=int(e["active_params"]) if "active_params" in e else None)
            for name, e in raw.items()}


def find(name: str) -> CatalogueEntry | None:
    """The entry for a built-in name or its Hugging Face repo id (case-insensitive)."""
    key = name.strip().lower()
    for entry in entries().values():
        if key in (entry.name, entry.source.lower(), entry.source.lower().split("/")[-1]):
            return entry
    return None


def lookup(name: str) -> CatalogueEntry:
    entry = find(name)
    if entry is None:
        raise ModelLoadError(f"{name!r} is not a file, a folder or a built-in model"
                             f"{did_you_mean(name.lower(), list(entries()))} "
                             "(compress plan --list shows the built-in models)")
    return entry
