"""``reconcile --lookups MODULE:ATTR``: importing the operator's lookups, and refusing, before
anything is imported, a module that would come from a place under the current directory
someone else could write to (the lookups run with an operator's credentials)."""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import os
import stat
import sys
from collections.abc import Mapping

from replaysafe_pg.cli.db import first_line
from replaysafe_pg.cli.plumbing import CliError
from replaysafe_pg.reconcile import Lookup


def _untrusted(path: str) -> str | None:
    """Why ``path`` (a directory, a file that could be loaded) is not to be trusted with code
    that runs with an operator's credentials, or None: it is a symbolic link (refused, not
    followed: what it points to is elsewhere), it is owned by a user other than this one and
    root (root can change any file anyway), or its group or others may write to it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # nothing there to load
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" to {os.readlink(path)}"
        except OSError:
            target = ""
        return f"is a symbolic link{target} (links are not followed: copy the file instead)"
    if st.st_uid not in (os.geteuid(), 0):
        try:
            import pwd

            owner = f"user {st.st_uid} ({pwd.getpwuid(st.st_uid).pw_name})"
        except (ImportError, KeyError):
            owner = f"user {st.st_uid}"
        return f"is owned by {owner}, not you"
    if st.st_mode & 0o022:
        who = "its group and others" if st.st_mode & 0o022 == 0o022 else (
            "its group" if st.st_mode & 0o020 else "others")
        return f"may be written by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _under(path: str, directory: str) -> bool:
    return os.path.commonpath([path, directory]) == directory


def _places_in(spec: importlib.machinery.ModuleSpec, directory: str) -> list[str]:
    """Where in ``directory`` a module's spec would load it from (its file, a package's
    directories), as the finder names them (abspath: a symbolic link in ``directory`` is
    where it is, not where it points); also a place elsewhere that is in ``directory`` once
    resolved."""
    places = [spec.origin] if spec.origin and spec.has_location else []
    places += list(spec.submodule_search_locations or ())
    found: list[str] = []
    for place in places:
        named = os.path.abspath(place)
        if _under(named, directory):
            found.append(named)
        elif _under(real := os.path.realpath(place), directory):
            found.append(real)
    return found


# What the import system may load for a module NAME in a directory: NAME.py, NAME.pyc (a
# sourceless module), an extension module NAME.<suffix>.so; compiled, __pycache__/NAME.*.pyc.
_LOADABLE = tuple(importlib.machinery.all_suffixes())
_PYCACHE = "__pycache__"


def _entries(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []  # not a directory (a zip archive on the path: itself checked) or gone


def _module_files(directory: str, name: str) -> list[str]:
    """Every file in ``directory`` the import system could load for module ``name`` (the
    last part of its dotted name), whichever of them it would pick."""
    files = [os.path.join(directory, e) for e in _entries(directory)
             if e.startswith(name + ".") and e.endswith(_LOADABLE)]
    cache = os.path.join(directory, _PYCACHE)
    if os.path.isdir(cache) and not os.path.islink(cache):
        files += [os.path.join(cache, e) for e in _entries(cache)
                  if e.startswith(name + ".") and e.endswith(".pyc")]
    if sys.pycache_prefix is not None:  # compiled files kept elsewhere
        for source in [f for f in files if f.endswith(tuple(importlib.machinery.SOURCE_SUFFIXES))]:
            compiled = importlib.util.cache_from_source(source)
            files += [os.path.dirname(compiled), compiled]
    return files


def _loadable(directory: str, name: str) -> list[str]:
    """What must be trusted for module ``name`` (the last part of its dotted name) found in
    ``directory``: its files there, and when ``directory/name`` is a package's directory,
    that directory, its ``__pycache__`` and its ``__init__`` files."""
    paths = _module_files(directory, name)
    package = os.path.join(directory, name)
    if os.path.lexists(package):
        paths.append(package)
        if os.path.isdir(package) and not os.path.islink(package):
            paths.append(os.path.join(package, _PYCACHE))
            paths += _module_files(package, "__init__")
    return paths


def _directories(deepest: str, directory: str) -> list[str]:
    """``directory`` and every directory under it down to ``deepest``, each with its
    ``__pycache__``; a link or file on the way ends the list (it is checked, and refused
    when a link)."""
    parts = os.path.relpath(deepest, directory).split(os.sep)
    chain = [directory]
    for part in parts if parts != ["."] else []:
        chain.append(os.path.join(chain[-1], part))
    found: list[str] = []
    for d in chain:
        found.append(d)
        if os.path.islink(d) or not os.path.isdir(d):
            break
        found.append(os.path.join(d, _PYCACHE))
    return found


def _find_spec(name: str, path: list[str]) -> importlib.machinery.ModuleSpec | None:
    """The spec of submodule ``name`` the import system would find in ``path`` (its parent
    package's directories), without importing anything."""
    for finder in sys.meta_path:
        try:
            spec = finder.find_spec(name, path)
        except (ImportError, ValueError, AttributeError):
            continue
        if spec is not None:
            return spec
    return None


def _distrust(spec: importlib.machinery.ModuleSpec, cwd: str, checked: set[str]) -> str | None:
    """Why a module to be loaded through ``spec`` is not to be trusted, or None: everything
    of it the import system could load from under ``cwd``, and every directory on the way
    there, must be this user's or root's, no one else's to write, and not a symbolic link.
    ``checked``: the paths already found trusted (for the parts of a dotted name before)."""
    places = _places_in(spec, cwd)
    if not places:
        return None  # from the path, outside the current directory: installed
    shown = os.path.relpath(places[0], cwd) + ("/" if os.path.isdir(places[0]) else "")
    for place in places:
        # The finder looked in the directory holding ``place`` for its name: a module's
        # file (mod.py, mod.<suffix>.so; a package's __init__.py), or a package's directory.
        directory, name = os.path.dirname(place), os.path.basename(place).split(".", 1)[0]
        for path in [*_directories(directory, cwd), *_loadable(directory, name)]:
            if path in checked:
                continue
            why = _untrusted(path)
            if why is None:
                checked.add(path)
                continue
            if os.path.basename(path) == _PYCACHE:
                return (f"the module {shown} is in {os.path.dirname(path)}, whose {_PYCACHE} "
                        f"(a compiled file there runs instead of the source) {why}")
            if os.path.isdir(path):
                return f"the module {shown} is in {path}, which {why}"
            if path == places[0]:
                return f"the module {shown} in {cwd} {why}"
            named = os.path.relpath(path, cwd) if _under(path, cwd) else path
            return f"the module {shown} in {cwd} could be loaded from {named}, which {why}"
    return None


def _lookups_module_path(module_name: str) -> None:
    """Make ``module_name`` importable as ``load_lookups`` allows: from the path as it is
    (an installed module is never shadowed), else from the current directory (appended to
    the path last). Refused, saying why, when any part of the dotted name would come from
    under the current directory and that directory, one on the way to the module, a
    ``__pycache__`` of them or a file that could be loaded for it is another user's, may be
    written by others, or is a symbolic link. Nothing is imported to find out."""
    cwd = os.path.realpath(os.getcwd())
    parts = module_name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: nothing of it runs
    except (ImportError, ValueError):
        return  # importing it says what is wrong
    appended = False
    if spec is None:
        spec = importlib.machinery.PathFinder.find_spec(parts[0], [cwd])
        if spec is None:
            return  # nowhere: importing it says so
        appended = True
    checked: set[str] = set()
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if depth > 1:
            parent = sys.modules.get(".".join(parts[:depth - 1]))
            locations = (getattr(parent, "__path__", None) if parent is not None
                         else spec.submodule_search_locations)
            if not locations:
                break  # not a package: importing it says so
            spec = _find_spec(name, list(locations))
            if spec is None:
                break  # nowhere: importing it says so
        if name in sys.modules:
            continue  # already imported: nothing of it is loaded again
        where = _distrust(spec, cwd, checked)
        if where is not None:
            raise CliError(f"--lookups: {where}: the lookups run with an operator's "
                           "credentials; install the module or run from a directory only "
                           "you can write to")
    if appended and cwd not in sys.path:
        sys.path.append(cwd)


def load_lookups(spec: str) -> dict[str, Lookup]:
    """``MODULE:ATTR``: the mapping of operation to lookup that ``reconcile`` uses. MODULE is
    found on the path, then in the current directory (appended last: a file there never
    shadows an installed module). A module (or package of a dotted MODULE) that would come
    from under the current directory is refused, saying why, before anything is imported,
    when that directory, a directory on the way to the module, a ``__pycache__`` of them or
    a file that could be loaded for it (source, compiled, sourceless ``.pyc``, extension
    module) is owned by another user (root excepted), writable by its group or others, or a
    symbolic link: the lookups run with an operator's credentials."""
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr):
        raise CliError(f"--lookups must be MODULE:ATTR, e.g. myapp.reconcile:LOOKUPS (got {spec!r})")
    _lookups_module_path(module_name)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CliError(f"--lookups: cannot import {module_name}: "
                       f"{type(exc).__name__}: {first_line(exc)}") from None
    try:
        value = functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise CliError(f"--lookups: module {module_name} has no attribute {attr}") from None
    if not isinstance(value, Mapping):
        raise CliError(f"--lookups: {spec} is a {type(value).__name__}, not a mapping of "
                       "operation name to lookup")
    for operation, lookup in value.items():
        if not isinstance(operation, str) or not callable(lookup):
            raise CliError(f"--lookups: {spec} must map operation names to callables "
                           f"({operation!r} maps to a {type(lookup).__name__})")
    if not value:
        raise CliError(f"--lookups: {spec} maps no operation")
    return dict(value)
