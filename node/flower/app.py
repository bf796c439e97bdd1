"""Finding a Flower app's ServerApp and ClientApp the way `flwr run` does for an app directory:
the components named in its pyproject.toml's [tool.flwr.app.components], the run config's
defaults from [tool.flwr.app.config] (overridden by the scenario's), the directory importable.
The app's own dependency pins are neither installed nor checked."""
from __future__ import annotations

import importlib
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class FlowerAppError(ValueError):
    """An app that cannot be found or loaded; the message names the key, file or object."""


@dataclass(frozen=True)
class FlowerAppRef:
    """Where the components are: picklable, resolved in each process that needs one."""
    server: str  # "module:attribute"
    client: str
    path: str | None = None  # a directory put on sys.path first
    run_config: dict[str, Any] = field(default_factory=dict)  # the app's defaults, then the scenario's overrides


def read_app(app: str, server_app: str | None, client_app: str | None, overrides: dict[str, Any],
             base: Path | None = None) -> FlowerAppRef:
    """An app directory (with pyproject.toml), or components named as module:attribute."""
    folder = Path(app)
    if base is not None and not folder.is_absolute():
        folder = base / folder
    if (folder / "pyproject.toml").is_file():
        try:
            meta = tomllib.loads((folder / "pyproject.toml").read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise FlowerAppError(f"{folder / 'pyproject.toml'}: cannot read it ({exc})") from None
        flwr = meta.get("tool", {}).get("flwr", {}).get("app", {})
        components = flwr.get("components", {})
        server = server_app or components.get("serverapp")
        client = client_app or components.get("clientapp")
        if not server or not client:
            raise FlowerAppError(f"{folder / 'pyproject.toml'}: [tool.flwr.app.components] must name serverapp and clientapp")
        defaults = dict(flwr.get("config", {}))
        unknown = sorted(set(overrides) - set(defaults))
        if unknown:
            raise FlowerAppError(f"algorithm.flower.run_config: {unknown} are not keys of the app's "
                                 f"[tool.flwr.app.config] ({sorted(defaults)})")
        return FlowerAppRef(server, client, str(folder.resolve()), {**defaults, **overrides})
    if ":" in app or server_app or client_app:
        server = server_app or app
        if not client_app:
            raise FlowerAppError("algorithm.flower.client_app: needed when algorithm.flower.app is not an app directory")
        return FlowerAppRef(server, client_app, None, dict(overrides))
    raise FlowerAppError(f"algorithm.flower.app: {app!r} is neither a directory with a pyproject.toml nor module:attribute")


def load_component(ref: FlowerAppRef, which: str) -> Any:
    """The ServerApp (which='server') or ClientApp ('client') object."""
    from flwr.clientapp import ClientApp  # noqa: PLC0415
    from flwr.serverapp import ServerApp  # noqa: PLC0415

    spec = ref.server if which == "server" else ref.client
    expected = ServerApp if which == "server" else ClientApp
    if ref.path and ref.path not in sys.path:
        sys.path.insert(0, ref.path)
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FlowerAppError(f"{which} app {spec!r}: cannot import {module_name!r} ({exc})") from None
    obj = getattr(module, attribute or "app", None)
    if not isinstance(obj, expected):
        raise FlowerAppError(f"{which} app {spec!r}: {attribute or 'app'!r} is not a flwr {expected.__name__}")
    return obj
