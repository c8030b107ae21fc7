"""Turn results (dataclasses, paths, enums, numpy scalars) into plain JSON values."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path
from typing import Any

# typing_extensions' TypedDict, not typing's: pydantic reads the package's JSON records (MCP results,
# bench results) and needs it on Python < 3.12
from typing_extensions import TypeAliasType, TypedDict  # noqa: F401 - TypedDict for the records' modules

# What to_jsonable gives: JSON values and nothing else. Named with TypeAliasType so pydantic can
# validate it (a plain recursive alias sends pydantic into endless recursion).
JSONValue = TypeAliasType("JSONValue", "str | int | float | bool | None | list[JSONValue] | dict[str, JSONValue]")

# A JSON object whose shape belongs to someone else (a server's reply, an AWS response body, a
# launch record, a user's parameter file): JSON, but not fields this package interprets one by one.
JSONObject = dict[str, JSONValue]


def to_jsonable(value: Any) -> Any:  # Any in: anything; out: a JSONValue
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):  # pydantic models
        return to_jsonable(value.model_dump())
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return value.item()  # numpy / torch scalars
    return value


def last_json_object(text: str) -> JSONObject | None:
    """The last line of ``text`` that is a JSON object (a child process's verdict after its log lines), or None."""
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None
