"""The scenario reference, generated from the schema (emulator/scenario.py): every key with its type,
default, bounds and description, so the reference cannot drift from what the schema accepts.

    python tools/scenario_keys.py            # writes docs/scenario-keys.md
    python tools/scenario_keys.py --check    # exit 1 when docs/scenario-keys.md is not what it would write

tests/test_scenario_keys.py runs the check."""
from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pydantic import BaseModel  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402

from emulator.scenario import Scenario  # noqa: E402

OUT = REPO / "docs" / "scenario-keys.md"
HEADER = """# Scenario keys

Every key a scenario accepts, generated from the schema (`emulator/scenario.py`) by
`python tools/scenario_keys.py`; a test fails when this page is not what the schema gives. Nested
sections are listed under their own path; `[]` marks a list of such sections. A strategy's and a
selection policy's own options are described by the component (`algorithm.options`,
`selection.options`).

| key | type | default | bounds | description |
|---|---|---|---|---|
"""


def _models(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (in a list, an Optional, a Union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _type_name(annotation) -> str:
    if annotation is not None and typing.get_origin(annotation) is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])  # the type, not its validators
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union and any(typing.get_origin(a) is typing.Annotated for a in args):
        return f"Optional[{_type_name(next(a for a in args if a is not type(None)))}]" if type(None) in args else \
            " | ".join(_type_name(a) for a in args)
    text = str(annotation).replace("typing.", "").replace("NoneType", "None")
    for prefix in ("<class '", "'>"):
        text = text.replace(prefix, "")
    return text.replace("emulator.scenario.", "").replace("node.strategies.fedalign.FedAlign.", "")


def _bounds(field) -> str:
    parts = []
    for item in field.metadata:
        for name, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("min_length", "len >="),
                             ("max_length", "len <=")):
            value = getattr(item, name, None)
            if value is not None:
                parts.append(f"{symbol} {value}")
    return ", ".join(parts)


def _default(field) -> str:
    if field.default is PydanticUndefined:
        if field.default_factory is None:
            return "required"
        value = field.default_factory()
        return "(a section)" if isinstance(value, BaseModel) else repr(value)
    return repr(field.default)


def rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    out = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        out.append((key, _type_name(field.annotation).replace("|", "\\|"), _default(field).replace("|", "\\|"),
                    _bounds(field), description))
        is_list = typing.get_origin(field.annotation) is list or "list[" in str(field.annotation)
        for sub in _models(field.annotation):
            out += rows(sub, f"{key}{'[]' if is_list else ''}.")
    return out


def page() -> str:
    return HEADER + "".join(f"| `{k}` | {t} | {d} | {b} | {desc} |\n" for k, t, d, b, desc in rows(Scenario))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = page()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is not what the schema gives: run python tools/scenario_keys.py")
            return 1
        print(f"{OUT}: up to date ({text.count(chr(10)) - HEADER.count(chr(10))} keys)")
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
