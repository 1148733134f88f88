"""Format registry: built-in formats plus plug-ins from the ``precisionlab.formats``
entry-point group."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from .base import Format

ENTRY_POINT_GROUP = "precisionlab.formats"

_REGISTRY: dict[str, Format] = {}
_plugins_loaded = False


class UnknownFormatError(KeyError):
    """Raised by :func:`get` for a name no format is registered under."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


def register(cls_or_obj: type[Format] | Format | None = None, *, name: str | None = None):
    """Register a format class (instantiated with no arguments) or instance.

    Usable as ``@register`` or ``@register(name="my-format")`` on a class, or
    called directly with an instance.
    """

    def add(obj: type[Format] | Format) -> type[Format] | Format:
        inst = obj() if isinstance(obj, type) else obj
        key = name or inst.name
        if not key:
            raise ValueError("a format needs a name")
        inst.name = key
        _REGISTRY[key] = inst
        return obj

    if cls_or_obj is None:
        return add
    return add(cls_or_obj)


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if isinstance(obj, Format) or (isinstance(obj, type) and issubclass(obj, Format)):
            register(obj, name=ep.name)
        elif isinstance(obj, Callable):  # a factory returning a Format
            register(obj(), name=ep.name)


def names() -> list[str]:
    """Registered format names, built-ins first in their canonical order."""
    _load_plugins()
    return list(_REGISTRY)


def get(name: str | Format) -> Format:
    """The format registered under ``name`` (a Format passes through)."""
    if isinstance(name, Format):
        return name
    _load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownFormatError(
            f"unknown format {name!r}; known formats: {', '.join(_REGISTRY)}"
        ) from None


def plugin_loader() -> Callable[[], None]:
    """Force a re-scan of entry points (used by tests that install a plug-in)."""

    def reload() -> None:
        global _plugins_loaded
        _plugins_loaded = False
        _load_plugins()

    return reload
