"""``reconcile --lookups``: a module that would come from the current directory is refused,
saying why, before anything of it is imported, when that directory, a directory on the way
to a dotted module, a ``__pycache__`` of them or any file that could be loaded for it
(source, compiled, sourceless ``.pyc``, extension module) is another user's, writable by its
group or others, or a symbolic link: the lookups run with an operator's credentials."""

from __future__ import annotations

import importlib.util
import marshal
import os
import py_compile
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.cli import assert_one_line_error, run

from replaysafe_pg.cli.lookups import load_lookups
from replaysafe_pg.cli.plumbing import CliError

OTHER_UID = 65534  # nobody

LOOKUPS = "from replaysafe_pg.reconcile import NotFound\nLOOKUPS = {'refund': lambda a: NotFound()}\n"


@pytest.fixture(autouse=True)
def _isolated_imports() -> Iterator[None]:
    """load_lookups may append the current directory to sys.path; each test gets its own.
    The list is changed in place and restored in place: monkeypatch.syspath_prepend, which
    some tests use, restores its own copy into whatever list sys.path is at teardown (its
    teardown runs first: this fixture is set up first), and spawned processes of later tests
    inherit sys.path."""
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if p not in ("", os.getcwd())]
    yield
    sys.path[:] = saved


def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a directory to another user")


def module_in(directory: Path, *, mode: int = 0o755, owner: int | None = None,
              file_owner: int | None = None, file_mode: int = 0o644) -> str:
    directory.mkdir(exist_ok=True)
    name = f"rs_lk_{uuid.uuid4().hex[:8]}"
    path = directory / f"{name}.py"
    path.write_text(LOOKUPS)
    path.chmod(file_mode)
    if file_owner is not None:
        os.chown(path, file_owner, -1)
    directory.chmod(mode)
    if owner is not None:
        os.chown(directory, owner, -1)
    return name


def test_a_module_in_a_directory_of_mine_is_loaded(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    name = module_in(tmp_path / "mine")
    monkeypatch.chdir(tmp_path / "mine")
    assert list(load_lookups(f"{name}:LOOKUPS")) == ["refund"]


def test_a_directory_another_user_owns_is_refused_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _as_root()
    theirs = tmp_path / "theirs"
    name = module_in(theirs, owner=OTHER_UID)
    monkeypatch.chdir(theirs)
    with pytest.raises(CliError) as info:
        load_lookups(f"{name}:LOOKUPS")
    message = info.value.message
    assert message.startswith(f"--lookups: the module {name}.py is in {theirs.resolve()}, "
                              f"which is owned by user {OTHER_UID}")
    assert "not you: the lookups run with an operator's credentials" in message
    assert "install the module or run from a directory only you can write to" in message
    assert name not in sys.modules  # nothing of it ran


@pytest.mark.parametrize("mode, who", [(0o775, "its group"), (0o757, "others"),
                                       (0o777, "its group and others"),
                                       (0o1777, "its group and others")],
                         ids=["group", "others", "both", "sticky like /tmp"])
def test_a_directory_others_may_write_to_is_refused(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    mode: int, who: str) -> None:
    shared = tmp_path / "shared"
    name = module_in(shared, mode=mode)
    monkeypatch.chdir(shared)
    with pytest.raises(CliError, match=f"which may be written by {who} "
                       rf"\(mode {mode:04o}\)"):
        load_lookups(f"{name}:LOOKUPS")
    assert name not in sys.modules


def test_a_module_file_another_user_owns_or_may_write_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    writable = module_in(tmp_path / "w", file_mode=0o666)
    monkeypatch.chdir(tmp_path / "w")
    with pytest.raises(CliError, match=rf"the module {writable}\.py in .* may be written by "
                       r"its group and others \(mode 0666\)"):
        load_lookups(f"{writable}:LOOKUPS")
    if os.geteuid() == 0:
        foreign = module_in(tmp_path / "f", file_owner=OTHER_UID)
        monkeypatch.chdir(tmp_path / "f")
        with pytest.raises(CliError, match=rf"the module {foreign}\.py in .* is owned by "
                           f"user {OTHER_UID}"):
            load_lookups(f"{foreign}:LOOKUPS")


def test_a_package_in_a_directory_another_user_owns_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _as_root()
    theirs = tmp_path / "theirs"
    package = theirs / f"rs_pkg_{uuid.uuid4().hex[:8]}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "reconcile.py").write_text(LOOKUPS)
    os.chown(theirs, OTHER_UID, -1)
    monkeypatch.chdir(theirs)
    with pytest.raises(CliError, match=rf"the module {package.name}/__init__\.py is in "
                       rf".*, which is owned by user {OTHER_UID}"):
        load_lookups(f"{package.name}.reconcile:LOOKUPS")


def test_the_current_directory_already_on_the_path_is_checked_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # python -m puts the current directory first on the path.
    shared = tmp_path / "shared"
    name = module_in(shared, mode=0o777)
    monkeypatch.chdir(shared)
    monkeypatch.syspath_prepend(str(shared))
    with pytest.raises(CliError, match="which may be written by"):
        load_lookups(f"{name}:LOOKUPS")


def test_an_installed_module_is_loaded_whatever_the_current_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = tmp_path / "site"
    name = module_in(installed)
    monkeypatch.syspath_prepend(str(installed))
    # A module of the same name in a directory others may write to is never consulted.
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / f"{name}.py").write_text("raise SystemExit('the shadow ran')\n")
    shared.chmod(0o777)
    monkeypatch.chdir(shared)
    assert list(load_lookups(f"{name}:LOOKUPS")) == ["refund"]
    assert str(shared) not in sys.path


def test_a_module_found_nowhere_still_says_it_cannot_be_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CliError, match="--lookups: cannot import rs_nowhere_at_all: "
                       "ModuleNotFoundError"):
        load_lookups("rs_nowhere_at_all:LOOKUPS")


def test_the_command_line_refuses_it_with_exit_2(tmp_path: Path, dsn: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    name = module_in(shared, mode=0o775)
    monkeypatch.chdir(shared)
    result = run("reconcile", "--lookups", f"{name}:LOOKUPS", dsn=dsn)
    assert_one_line_error(result, f"--lookups: the module {name}.py is in",
                          "which may be written by its group (mode 0775)",
                          "the lookups run with an operator's credentials")
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        other = module_in(theirs, owner=OTHER_UID)
        monkeypatch.chdir(theirs)
        result = run("reconcile", "--lookups", f"{other}:LOOKUPS", dsn=dsn)
        assert_one_line_error(result, f"which is owned by user {OTHER_UID}")
    mine = tmp_path / "mine"
    good = module_in(mine)
    monkeypatch.chdir(mine)
    ok = run("reconcile", "--lookups", f"{good}:LOOKUPS", dsn=dsn)
    assert ok.exit_code == 0, (ok.stdout, ok.stderr)


# --- symbolic links -------------------------------------------------------------------------

def linked_module(cwd: Path, elsewhere: Path) -> str:
    """A module ``cwd/NAME.py`` that is a symbolic link to a file of mine in ``elsewhere``."""
    name = module_in(elsewhere)
    cwd.mkdir(exist_ok=True)
    (cwd / f"{name}.py").symlink_to(elsewhere / f"{name}.py")
    return name


@pytest.mark.parametrize("on_path", [False, True], ids=["appended", "already-on-the-path"])
def test_a_link_in_a_directory_others_may_write_to_is_refused_wherever_it_points(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_path: bool) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    name = linked_module(shared, tmp_path / "mine")
    shared.chmod(0o1777)
    monkeypatch.chdir(shared)
    if on_path:
        monkeypatch.syspath_prepend(str(shared))
    with pytest.raises(CliError) as info:
        load_lookups(f"{name}:LOOKUPS")
    assert info.value.message.startswith(
        f"--lookups: the module {name}.py is in {shared.resolve()}, which may be written by "
        "its group and others (mode 1777)")
    assert name not in sys.modules


def test_a_link_in_my_own_directory_is_refused_saying_so(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    name = linked_module(tmp_path / "cwd", tmp_path / "mine")
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(CliError, match=rf"the module {name}\.py in .* is a symbolic link to "
                       rf"{tmp_path / 'mine' / name}\.py \(links are not followed: copy the file "
                       r"instead\)"):
        load_lookups(f"{name}:LOOKUPS")
    assert name not in sys.modules


def test_a_linked_package_directory_is_refused(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    package = make_package(tmp_path / "mine")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / package.name).symlink_to(package)
    monkeypatch.chdir(cwd)
    with pytest.raises(CliError, match=rf"the module {package.name}/__init__\.py is in "
                       rf"{cwd.resolve() / package.name}, which is a symbolic link"):
        load_lookups(f"{package.name}.reconcile:LOOKUPS")
    assert package.name not in sys.modules


# --- every part of a dotted name ------------------------------------------------------------

def make_package(directory: Path, *, inner: bool = False) -> Path:
    """``directory/PKG`` with ``__init__.py`` and ``reconcile.py`` (``inner``: the lookups in
    ``PKG/inner/reconcile.py`` instead)."""
    package = directory / f"rs_pkg_{uuid.uuid4().hex[:8]}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "reconcile.py").write_text(LOOKUPS)
    if inner:
        (package / "inner").mkdir()
        (package / "inner" / "__init__.py").write_text("")
        (package / "inner" / "reconcile.py").write_text(LOOKUPS)
    return package


def test_a_package_in_my_own_directory_is_loaded(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    package = make_package(tmp_path, inner=True)
    monkeypatch.chdir(tmp_path)
    assert list(load_lookups(f"{package.name}.inner.reconcile:LOOKUPS")) == ["refund"]


def test_a_package_directory_others_may_write_to_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = make_package(tmp_path)
    package.chmod(0o777)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CliError) as info:
        load_lookups(f"{package.name}.reconcile:LOOKUPS")
    assert info.value.message.startswith(
        f"--lookups: the module {package.name}/__init__.py is in {package.resolve()}, which "
        "may be written by its group and others (mode 0777): the lookups run with")
    assert package.name not in sys.modules


def test_an_inner_package_directory_others_may_write_to_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = make_package(tmp_path, inner=True)
    (package / "inner").chmod(0o775)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CliError, match=rf"the module {package.name}/inner/__init__\.py is in "
                       rf".*/{package.name}/inner, which may be written by its group"):
        load_lookups(f"{package.name}.inner.reconcile:LOOKUPS")
    assert f"{package.name}.inner" not in sys.modules


def test_a_submodule_file_another_user_owns_or_may_write_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = make_package(tmp_path)
    (package / "reconcile.py").chmod(0o646)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CliError, match=rf"the module {package.name}/reconcile\.py in .* may be "
                       r"written by others \(mode 0646\)"):
        load_lookups(f"{package.name}.reconcile:LOOKUPS")
    assert f"{package.name}.reconcile" not in sys.modules
    if os.geteuid() == 0:
        (package / "reconcile.py").chmod(0o644)
        os.chown(package / "reconcile.py", OTHER_UID, -1)
        with pytest.raises(CliError, match=rf"the module {package.name}/reconcile\.py in .* is "
                           f"owned by user {OTHER_UID}"):
            load_lookups(f"{package.name}.reconcile:LOOKUPS")
        assert f"{package.name}.reconcile" not in sys.modules


# --- compiled files, sourceless and extension modules ----------------------------------------

def forge_compiled(source: Path, code: str) -> Path:
    """A compiled file of ``code`` in ``source``'s ``__pycache__``, its header made to match
    ``source`` (its mtime and size): the import system runs it instead of the source."""
    st = source.stat()
    header = (importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
              + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
              + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little"))
    compiled = Path(importlib.util.cache_from_source(str(source)))
    compiled.parent.mkdir(exist_ok=True)
    compiled.write_bytes(header + marshal.dumps(compile(code, str(source), "exec")))
    compiled.chmod(0o644)
    return compiled


FORGED = "LOOKUPS = {'forged': lambda a: None}\n"


def test_a_pycache_others_may_write_to_is_refused_though_the_source_is_trusted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = module_in(tmp_path / "cwd")
    source = tmp_path / "cwd" / f"{name}.py"
    compiled = forge_compiled(source, FORGED)
    compiled.parent.chmod(0o777)
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(CliError) as info:
        load_lookups(f"{name}:LOOKUPS")
    assert info.value.message.startswith(
        f"--lookups: the module {name}.py is in {source.parent.resolve()}, whose __pycache__ "
        "(a compiled file there runs instead of the source) may be written by its group and "
        "others (mode 0777)")
    assert name not in sys.modules
    # A compiled file others may write is refused in a __pycache__ only I can write to.
    compiled.parent.chmod(0o755)
    compiled.chmod(0o666)
    with pytest.raises(CliError, match=rf"the module {name}\.py in .* could be loaded from "
                       rf"__pycache__/{compiled.name}, which may be written by its group and "
                       r"others \(mode 0666\)"):
        load_lookups(f"{name}:LOOKUPS")
    assert name not in sys.modules
    # Once only I can write it, the compiled file is mine, and it is what runs.
    compiled.chmod(0o644)
    assert list(load_lookups(f"{name}:LOOKUPS")) == ["forged"]


def test_a_compiled_file_another_user_owns_is_refused(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _as_root()
    name = module_in(tmp_path / "cwd")
    compiled = forge_compiled(tmp_path / "cwd" / f"{name}.py", FORGED)
    os.chown(compiled, OTHER_UID, -1)
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(CliError, match=rf"could be loaded from __pycache__/{compiled.name}, "
                       f"which is owned by user {OTHER_UID}"):
        load_lookups(f"{name}:LOOKUPS")
    assert name not in sys.modules


def sourceless(directory: Path, mode: int) -> str:
    """A sourceless module ``directory/NAME.pyc`` (no ``NAME.py``) of mode ``mode``."""
    directory.mkdir(exist_ok=True)
    name = f"rs_pyc_{uuid.uuid4().hex[:8]}"
    source = directory / f"{name}_src.py"
    source.write_text(LOOKUPS)
    compiled = directory / f"{name}.pyc"
    py_compile.compile(str(source), cfile=str(compiled), doraise=True)
    source.unlink()
    compiled.chmod(mode)
    return name


def test_a_sourceless_compiled_module_is_checked_like_a_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writable = sourceless(tmp_path / "cwd", 0o664)
    mine = sourceless(tmp_path / "cwd", 0o644)
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(CliError, match=rf"the module {writable}\.pyc in .* may be written by "
                       r"its group \(mode 0664\)"):
        load_lookups(f"{writable}:LOOKUPS")
    assert writable not in sys.modules
    assert list(load_lookups(f"{mine}:LOOKUPS")) == ["refund"]


def test_a_sourceless_module_beside_a_trusted_source_is_checked_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Whichever file the finder would pick, any it could is checked.
    package = make_package(tmp_path)
    py_compile.compile(str(package / "reconcile.py"), cfile=str(package / "reconcile.pyc"))
    (package / "reconcile.pyc").chmod(0o666)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CliError, match=rf"could be loaded from {package.name}/reconcile\.pyc, "
                       "which may be written by its group and others"):
        load_lookups(f"{package.name}.reconcile:LOOKUPS")


def test_an_extension_module_others_may_write_is_refused(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    name = module_in(tmp_path / "cwd")
    extension = tmp_path / "cwd" / f"{name}.abi3.so"
    extension.write_bytes(b"not loaded: refused first")
    extension.chmod(0o666)
    monkeypatch.chdir(tmp_path / "cwd")
    # The finder prefers an extension module to the source beside it.
    with pytest.raises(CliError, match=rf"the module {name}\.abi3\.so in .* may be written by "
                       "its group and others"):
        load_lookups(f"{name}:LOOKUPS")
    assert name not in sys.modules
    # A package's __init__ as an extension module, beside a trusted __init__.py.
    package = make_package(tmp_path / "cwd")
    (package / "__init__.abi3.so").write_bytes(b"")
    (package / "__init__.abi3.so").chmod(0o646)
    with pytest.raises(CliError, match=rf"{package.name}/__init__\.abi3\.so.* may be written by "
                       "others"):
        load_lookups(f"{package.name}.reconcile:LOOKUPS")
