"""A scheme's recipe keys as pydantic fields, and the errors of a quantize step in the words
of its scheme: steps.py builds one typed step model per registered scheme from these.

Imports pydantic, errors and schemes only (steps.py, the bottom of config, imports it).
"""
from __future__ import annotations

import typing
from collections.abc import Callable
from contextvars import ContextVar
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, SerializationInfo
from pydantic_core import PydanticCustomError

from compressor.errors import did_you_mean
from compressor.schemes.base import Scheme

_LIMITS = ("ge", "le", "gt", "lt")


def scheme_fields(scheme: type[Scheme]) -> dict[str, Any]:
    """name -> (type, Field) of each `key` field of `scheme` (compressor/schemes/base.py)."""
    hints = typing.get_type_hints(scheme, include_extras=True)
    fields: dict[str, Any] = {}
    for f in scheme.recipe_keys():
        meta = f.metadata
        hint = hints[f.name]
        if "check" in meta:
            hint = Annotated[hint, AfterValidator(meta["check"])]
        fields[f.name] = (hint, Field(f.default, description=meta["description"],
                                      **{k: meta[k] for k in _LIMITS if k in meta}))
    return fields


def keys_of(model: type[BaseModel]) -> list[str]:
    """The keys a recipe writes for `model` (aliases where they have one)."""
    return [f.alias or name for name, f in model.model_fields.items()]


def explained(error: Any, model: type[BaseModel], labels: dict[type[BaseModel], str]) -> Any:
    """A pydantic line error of `model` (a step model of the scheme `labels[model]` names),
    with the key's meaning added; a key the scheme lacks names the schemes that have it
    (`labels`: every scheme's step model and label)."""
    loc, kind = error["loc"], error["type"]
    name = str(loc[0]) if len(loc) == 1 else ""
    field = next((f for n, f in model.model_fields.items() if name in (n, f.alias)), None)
    if kind == "extra_forbidden":
        kind, message = "value_error", _not_a_key(name, model, labels)
    elif field is not None and field.description and kind != "value_error":
        message = f"{error['msg']} ({field.description})"
    else:
        return {k: error[k] for k in ("type", "loc", "input", "ctx") if k in error}
    # PydanticCustomError formats {names} from its context: the message has none
    message = message.replace("{", "(").replace("}", ")")
    return {"type": PydanticCustomError(kind, message), "loc": loc, "input": error["input"]}


def _not_a_key(name: str, model: type[BaseModel], labels: dict[type[BaseModel], str]) -> str:
    label, keys = labels[model], ", ".join(keys_of(model))
    owners = [other_label for other, other_label in labels.items() if name in keys_of(other)]
    if owners:
        return (f"is not a key of {label} steps but of {' / '.join(owners)} ones: remove it, or "
                f"give that mode and dtype ({label} keys: {keys})")
    return f"is not a key of {label} steps{did_you_mean(name, keys_of(model))} (their keys: {keys})"


_OWN_TYPE = ContextVar("serializing_own_type", default=False)


def dump_own_type(model: BaseModel, handler: Callable[[Any], Any], info: SerializationInfo) -> Any:
    """`model` serialized with every field of its own class: a step held where the base class
    is declared (a Recipe's steps) is written whole, not as the base's fields."""
    if _OWN_TYPE.get():
        return handler(model)
    token = _OWN_TYPE.set(True)
    try:
        return type(model).__pydantic_serializer__.to_python(
            model, mode=info.mode, by_alias=info.by_alias, exclude_none=info.exclude_none,
            exclude_unset=info.exclude_unset, exclude_defaults=info.exclude_defaults,
            round_trip=info.round_trip, include=info.include, exclude=info.exclude)
    finally:
        _OWN_TYPE.reset(token)
