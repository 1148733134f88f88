"""Format registry: the built-in formats plus plug-ins from the
``precisionlab.formats`` entry-point group.

A plug-in package declares, in its ``pyproject.toml``::

    [project.entry-points."precisionlab.formats"]
    my-format = "my_package.module:MyFormat"

where the object is a :class:`Format` subclass (instantiated with no arguments),
a Format instance, or a callable returning one; the entry-point name becomes the
format's name.  Plug-ins load lazily on the first :func:`get` or :func:`names`;
a plug-in that fails to load, or that reuses a registered name, is skipped with
a warning.
"""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points

from .base import Format

ENTRY_POINT_GROUP = "precisionlab.formats"

_REGISTRY: dict[str, Format] = {}
_PLUGINS: set[str] = set()
_plugins_loaded = False


class UnknownFormatError(KeyError):
    """Raised by :func:`get` for a name no format is registered under."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


def register(cls_or_obj: type[Format] | Format | None = None, *, name: str | None = None):
    """Register a format class (instantiated with no arguments) or instance.

    Usable as ``@register`` or ``@register(name="my-format")`` on a class, or
    called directly with an instance.  Re-registering a name replaces it.
    """

    def add(obj: type[Format] | Format) -> type[Format] | Format:
        inst = obj() if isinstance(obj, type) else obj
        if not isinstance(inst, Format):
            raise TypeError(f"register needs a Format subclass or instance, got {obj!r}")
        key = name or inst.name
        if not key:
            raise ValueError("a format needs a name")
        inst.name = key
        _REGISTRY[key] = inst
        return obj

    if cls_or_obj is None:
        return add
    return add(cls_or_obj)


def unregister(name: str) -> None:
    """Remove a registered format (no error if absent)."""
    _REGISTRY.pop(name, None)
    _PLUGINS.discard(name)


def _as_format(obj: object) -> Format:
    if isinstance(obj, Format):
        return obj
    if isinstance(obj, type) and issubclass(obj, Format):
        return obj()
    if callable(obj):
        made = obj()
        if isinstance(made, Format):
            return made
    raise TypeError(f"entry point gave {obj!r}, not a Format, Format subclass or factory")


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            if ep.name not in _PLUGINS:
                warnings.warn(
                    f"format plug-in {ep.value!r} reuses the name {ep.name!r}; skipped",
                    stacklevel=3,
                )
            continue
        try:
            fmt = _as_format(ep.load())
        except Exception as exc:  # a broken plug-in must not break the built-ins
            warnings.warn(f"format plug-in {ep.name!r} failed to load: {exc}", stacklevel=3)
            continue
        register(fmt, name=ep.name)
        _PLUGINS.add(ep.name)


def reload_plugins() -> None:
    """Drop the formats that came from entry points and scan the group again
    (after installing a plug-in into a running interpreter)."""
    global _plugins_loaded
    for key in list(_PLUGINS):
        unregister(key)
    _plugins_loaded = False
    _load_plugins()


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
