"""The tolerant reader: how clients read what the coordinator sends.

:func:`read` validates an answer (or a watch event, or a document saved from one) with its
wire model, ignoring fields this version does not know at any depth, so that a coordinator
newer than its agents and gateways may add fields to what it sends without breaking them.
Requests stay strict on the coordinator (:class:`anex_agent.wire.base.Model` forbids unknown
fields). Works on any pydantic model; imports no wire model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel


M = TypeVar("M", bound=BaseModel)


def read(model: type[M], raw: str | bytes | Any) -> M:
    """``model`` from an answer of the coordinator (JSON text, or the object already decoded),
    ignoring fields this version does not know, at any depth, so that a newer coordinator can
    add fields; everything known is validated as usual (lax mode, as clients parse)."""
    data = json.loads(raw) if isinstance(raw, (str, bytes, bytearray)) else raw
    return model.model_validate(_known_only(model, data))


Strip = Callable[[Any], Any]
_MODEL_STRIPS: dict[type[BaseModel], Strip | None] = {}


def _known_only(model: type[BaseModel], data: Any) -> Any:
    strip = _model_strip(model)
    return data if strip is None else strip(data)


def _model_strip(model: type[BaseModel]) -> Strip | None:
    """What drops ``model``'s unknown fields from a decoded object, at any depth (None: nothing
    to drop: the model takes extra fields itself). Worked out once per model from its field
    types, so a 10,000-peer answer costs one key check per object, not a walk of the types."""
    if model in _MODEL_STRIPS:
        found = _MODEL_STRIPS[model]
        # a model whose fields refer back to it: decided when the outer call returns
        return found if found is not None else (lambda data: (_MODEL_STRIPS[model] or _same)(data))
    if model.model_config.get("extra") != "forbid":
        _MODEL_STRIPS[model] = None
        return None
    _MODEL_STRIPS[model] = None  # while its fields are looked at
    known = frozenset(model.model_fields)
    nested = {name: strip for name, field in model.model_fields.items()
              if (strip := _value_strip(field.annotation)) is not None}

    def strip(data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if not nested:
            return data if data.keys() <= known else {k: v for k, v in data.items() if k in known}
        return {key: (nested[key](value) if key in nested else value)
                for key, value in data.items() if key in known}

    _MODEL_STRIPS[model] = strip
    return strip


def _same(value: Any) -> Any:
    return value


def _value_strip(annotation: Any) -> Strip | None:
    """What drops unknown fields from a value of type ``annotation`` (None: nothing can hold any)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _model_strip(annotation)
    if origin is Annotated:
        return _value_strip(args[0])
    if origin in (Union, UnionType):
        # the member that fits the value's shape: the first model for an object, the first list for a list
        for_dict = next((_model_strip(arg) for arg in args if isinstance(arg, type) and issubclass(arg, BaseModel)),
                        None)
        for_list = next((_value_strip(arg) for arg in args if get_origin(arg) in (list, tuple)), None)
        if for_dict is None and for_list is None:
            return None
        return lambda value: (for_dict(value) if for_dict is not None and isinstance(value, dict) else
                              for_list(value) if for_list is not None and isinstance(value, list) else value)
    if origin in (list, tuple) and args:
        item = _value_strip(args[0])
        if item is None:
            return None
        return lambda value: [item(x) for x in value] if isinstance(value, list) else value
    if origin is dict and len(args) == 2:
        item = _value_strip(args[1])
        if item is None:
            return None
        return lambda value: {k: item(x) for k, x in value.items()} if isinstance(value, dict) else value
    return None
