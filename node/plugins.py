"""A user's own components, named in a scenario by import path: "package.module:name".

The scenario names them (task.model, task.dataset, algorithm.name, selection.policy); this module
turns a path into the object, and says in one line what is wrong when it cannot: the module does
not import, has no such attribute, or the object is not of the kind the key needs. Every process
of a run resolves the same path, so the user's package must be importable there (installed, or on
PYTHONPATH)."""
from __future__ import annotations

import importlib
import re
from typing import Any

_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class PluginError(ValueError):
    """A path that does not resolve to what its key needs; str() says what and why."""


def is_import_path(value: Any) -> bool:
    """Whether `value` is written as "package.module:name" (a registered name never has a colon)."""
    return isinstance(value, str) and ":" in value


def resolve(path: str) -> Any:
    """The object at "package.module:name" (name may be dotted: "mod:Class.attribute")."""
    if not _PATH.match(path):
        raise PluginError(f"{path!r} is not an import path of the form package.module:name")
    module_name, _, attribute = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # an ImportError, or whatever the user's module raised while importing
        raise PluginError(f"{path!r}: cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"{path!r}: {module_name} has no attribute {attribute}") from None
    return obj


def resolve_class(path: str, base: type, what: str) -> type:
    """The class at `path`, which must subclass `base` (`what` names the base in the message)."""
    obj = resolve(path)
    if not isinstance(obj, type) or not issubclass(obj, base):
        kind = f"the class {obj.__qualname__}" if isinstance(obj, type) else f"a {type(obj).__name__}"
        raise PluginError(f"{path!r} is {kind}, not a subclass of {what}")
    return obj


def resolve_callable(path: str) -> Any:
    obj = resolve(path)
    if not callable(obj):
        raise PluginError(f"{path!r} is a {type(obj).__name__}, not a function or class")
    return obj


class Registry:
    """The named classes of one axis (strategies, selection policies): registered by a decorator,
    looked up by name, or given by a user as "package.module:Class" (a subclass of `base`)."""

    def __init__(self, axis: str, base: type, error: type[ValueError] = PluginError):
        self.axis, self.base, self.error = axis, base, error
        self.classes: dict[str, type] = {}

    def register(self, name: str):
        """Class decorator: make a class available under `name`."""

        def add(cls: type) -> type:
            if name in self.classes:
                raise self.error(f"{self.axis} {name!r} is registered twice "
                                 f"({self.classes[name].__qualname__}, {cls.__qualname__})")
            cls.name = name
            self.classes[name] = cls
            return cls

        return add

    def get(self, name: str) -> type:
        if is_import_path(name):
            try:
                return resolve_class(name, self.base, f"{self.base.__module__}.{self.base.__qualname__}")
            except PluginError as exc:
                raise self.error(str(exc)) from None
        try:
            return self.classes[name]
        except KeyError:
            raise self.error(f"no {self.axis} named {name!r} (have {', '.join(sorted(self.classes))}, "
                             f"or your own as package.module:Class)") from None
