"""The readers: how a question is read over a document's chunks. Each is one module that
defines one `Spec` (readers/spec.py), and this registry keeps them by name: MemAgent's
(readers/memagent.py), and those that came after it, each as its authors' released
evaluation code runs it (docs/readers.md).

A reader from outside memagent joins the same way: a package that declares a `Spec` under
the entry point group `memagent.readers` (docs/development.md, Adding a reader).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from memagent_cli import protocol
from memagent_cli.errors import UserError
from memagent_cli.readers.spec import Spec, StepField

DEFAULT = protocol.READER  # what a model no one says otherwise of reads with
ENTRY_POINTS = "memagent.readers"
BUILT_IN = ("memagent", "infmem", "rememr1", "memreread", "pi-mem")  # each a module in readers/

_registry: dict[str, Spec] = {}
_plugins_loaded = False
_broken: dict[str, str] = {}  # a plugin that cannot be loaded: why, said when it is asked for
_lock = threading.Lock()
_loaded = False


def register(spec: Spec) -> None:
    """Make `spec` a reader that `--reader`, the registry of models and every command know
    by its name; a later one of the same name replaces it."""
    with _lock:
        _registry[spec.name] = spec


def get(name: str) -> Spec:
    """The reader named `name`; a sentence naming those there are when there is none."""
    _load(plugins=name not in BUILT_IN)  # a scan of the installed packages only for others
    spec = _registry.get(name)
    if spec is None and name in _broken:
        raise UserError(_broken[name])
    if spec is None:
        known = ", ".join(names())
        raise UserError(f"There is no reader {name!r} in this memagent; the readers are {known}.")
    return spec


def names() -> list[str]:
    """Every reader's name: the built-in ones first, then those registered."""
    _load()
    return [*BUILT_IN, *sorted(set(_registry) - set(BUILT_IN))]


def implied(name: str) -> bool:
    """Whether `name` is the reader that goes without saying (Spec.implied): records and
    listings name every other."""
    _load(plugins=name not in BUILT_IN)
    spec = _registry.get(name)
    return spec is not None and spec.implied


def recorded(name: str) -> dict[str, str]:
    """What a trace header's or journal's settings say of reader `name`: nothing for the
    implied one, so runs from before the readers stay the same runs."""
    return {} if implied(name) else {"reader": name}


def named_in(settings: Mapping[str, Any]) -> str:
    """The reader of a trace header's or journal's `settings` (recorded's inverse)."""
    return str(settings.get("reader", DEFAULT))


def find(name: str) -> Spec | None:
    """The reader named `name`, None where this memagent has none (a plugin's trace, read
    without the plugin): for what only shows a trace, which needs no reader to be read."""
    _load(plugins=name not in BUILT_IN)
    return _registry.get(name)


def fields_of(settings: Mapping[str, Any]) -> tuple[StepField, ...]:
    """What the steps of the reader that a trace header's `settings` name carry
    (Spec.fields); none where this memagent has no such reader."""
    spec = find(named_in(settings))
    return spec.fields if spec is not None else ()


def _load(plugins: bool = True) -> None:
    """The built-in readers, once; with `plugins`, the entry points' too, once."""
    global _loaded, _plugins_loaded
    if not _loaded:
        from memagent_cli.readers import infmem, memagent, memreread, pimem, rememr1

        with _lock:
            for spec in (memagent.SPEC, infmem.SPEC, rememr1.SPEC, memreread.SPEC, pimem.SPEC):
                _registry.setdefault(spec.name, spec)
            _loaded = True
    if not plugins or _plugins_loaded:
        return
    _plugins_loaded = True
    for point in metadata.entry_points(group=ENTRY_POINTS):
        # A plugin that cannot be loaded stops no other reader: it is said when asked for.
        try:
            spec = point.load()
        except Exception as exc:
            _broken[point.name] = f"The reader plugin {point.name} cannot be loaded: {exc}"
            continue
        if isinstance(spec, Spec) and spec.name not in BUILT_IN:  # never in a built-in's place
            register(spec)
        else:
            _broken[point.name] = f"The reader plugin {point.name} is not a readers.spec.Spec."


__all__ = [
    "DEFAULT",
    "Spec",
    "StepField",
    "fields_of",
    "find",
    "get",
    "implied",
    "named_in",
    "names",
    "recorded",
    "register",
]
