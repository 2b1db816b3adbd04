"""Reading and writing the files swapplan uses: JSON, gzipped JSON, YAML.

Reads turn every failure into an InputError naming the file. They take regular files
only (a FIFO, ``/dev/stdin`` or a device would block or never end), at most
``max_input_bytes()`` bytes before and after gunzip, YAML without alias bombs, and text
without lone UTF-16 surrogates. Writes are atomic (a temporary file in the same folder
renamed into place) and go only to a new path or over a regular file: never through a
symbolic link, over a device, a FIFO or a folder; ``check_outputs`` (and
``check_output_folder``) also keep a command's outputs off its inputs and off each other
and create a file where each output goes (``probe_folder``), so that an output that
cannot be written fails before any work: the one check every command makes.
"""
from __future__ import annotations

import gc
import gzip
import json
import os
import re
import stat
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

try:   # a faster parser for large files; the standard json module words the errors
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

from .errors import InputError

# The largest file read, before and after gunzip, unless SWAPPLAN_MAX_INPUT_BYTES says
# otherwise (a size such as 2GiB). 512 MiB holds a profile of about a million ops.
DEFAULT_MAX_INPUT_BYTES = 512 * 2**20
MAX_INPUT_ENV = "SWAPPLAN_MAX_INPUT_BYTES"
# YAML takes some 60 times its size in memory to read (and ~25 s for 16 MiB): it is for
# hand-written files, read up to this share of the input size limit (16 MiB by default).
YAML_SHARE = 32
# YAML aliases may add at most this many nodes to the document (each alias counted as
# a copy of what it names): enough for hand-written anchors, not for an alias bomb.
MAX_YAML_ALIAS_NODES = 100_000
_CHUNK = 1 << 20
# A \uD800-\uDFFF escape (JSON, YAML) or \U0000D800 (YAML): the parsed text may then
# hold a lone surrogate, which is not Unicode and cannot be printed or saved.
_SURROGATE_ESCAPE = re.compile(r"\\(?:u|U0000)[dD][89a-fA-F]")
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster


def max_input_bytes() -> int:
    """The size limit of a file read: ``$SWAPPLAN_MAX_INPUT_BYTES`` (a size such as
    ``2GiB``), else 512 MiB. InputError when the variable is not a size."""
    text = os.environ.get(MAX_INPUT_ENV)
    if text is None or not text.strip():
        return DEFAULT_MAX_INPUT_BYTES
    from .units import parse_size
    return parse_size(text, MAX_INPUT_ENV, "<environment>")


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def _too_large(name: str, limit: int, when: str, yaml_file: bool = False) -> InputError:
    from .units import format_bytes
    if yaml_file:
        return InputError(name, "", f"is more than {format_bytes(limit)}{when}, the size limit of a YAML file "
                                    f"(YAML is for hand-written files: it takes some 60 times its size in "
                                    f"memory to read); save large profiles as .json or .json.gz, or raise "
                                    f"{MAX_INPUT_ENV} (YAML may be 1/{YAML_SHARE} of it)")
    return InputError(name, "", f"is more than {format_bytes(limit)}{when}, the input size limit "
                                f"({limit} bytes); raise it with {MAX_INPUT_ENV}, e.g. {MAX_INPUT_ENV}=4GiB")


def read_bytes(path: str | os.PathLike, yaml_file: bool = False) -> bytes:
    """The bytes of a regular file (gunzipped if its name ends in ``.gz``), at most
    ``max_input_bytes()`` of them before and after gunzip (a 32nd of that for YAML).

    Raises InputError naming the file for a missing file, a folder, a FIFO, a device,
    bad gzip, or a file over the limit. Never blocks on a FIFO or reads a device forever.
    """
    name = str(path)
    limit = max_input_bytes() // (YAML_SHARE if yaml_file else 1)
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise InputError(name, "", "no such file") from None
    except IsADirectoryError:
        raise InputError(name, "", "is a directory, expected a file") from None
    except OSError as exc:
        raise InputError(name, "", f"cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(name, "", "is a directory, expected a file")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(name, "", f"is {_kind_of(info.st_mode)}, expected a regular file")
        if info.st_size > limit:
            raise _too_large(name, limit, "", yaml_file)
        with os.fdopen(fd, "rb", closefd=True) as handle:
            fd = -1
            if name.lower().endswith(".gz"):
                return _read_capped(gzip.GzipFile(fileobj=handle, mode="rb"), name, limit, " once gunzipped",
                                    yaml_file)
            return _read_capped(handle, name, limit, "", yaml_file)
    except InputError:
        raise
    except (OSError, EOFError, zlib.error) as exc:  # includes gzip.BadGzipFile
        raise InputError(name, "", f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)


def _read_capped(handle, name: str, limit: int, when: str, yaml_file: bool) -> bytes:
    """Read to the end, failing as soon as more than ``limit`` bytes have come."""
    data = bytearray()
    while True:
        chunk = handle.read(min(_CHUNK, limit + 1 - len(data)) or 1)
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > limit:
            raise _too_large(name, limit, when, yaml_file)


def read_document(path: str | os.PathLike, formats: tuple[str, ...] = ("json", "yaml")) -> Any:
    """Read a JSON, gzipped JSON or YAML file (chosen by its name) into Python data.

    Raises InputError naming the file for a missing or non-regular file, a file over
    the size limit, bad gzip, bad encoding, a syntax error (with its line where the
    parser gives one), a YAML alias bomb and a lone surrogate in a string.
    """
    name = str(path)
    lower = Path(path).name.lower()
    if lower.endswith(".gz"):
        lower = lower[:-3]
    is_yaml = lower.endswith((".yaml", ".yml")) and "yaml" in formats
    raw = read_bytes(path, yaml_file=is_yaml)
    try:
        text = raw.decode("utf-8-sig")   # a byte-order mark, as editors and spreadsheets may save it, is not text
    except UnicodeDecodeError as exc:
        raise InputError(name, f"byte {exc.start}", "not valid UTF-8 text") from None
    del raw  # a large file: do not hold its bytes and its text at once
    with no_gc():
        if is_yaml:
            data = _load_yaml(text, name)
        else:
            data = _load_json(text, name)
        if _SURROGATE_ESCAPE.search(text):
            _reject_surrogates(data, name)
    return data


@contextmanager
def no_gc(freeze: bool = False):
    """Pause the cyclic garbage collector: building millions of small objects (a parsed
    profile) otherwise runs it over and over for nothing (they hold no cycles). With
    ``freeze``, what exists at the end is moved out of the collector's sight
    (``gc.freeze``): a loaded profile lives on, and a full collection would walk all of
    it again for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


def _load_json(text: str, name: str) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(text)   # about three times faster on a large profile
        except orjson.JSONDecodeError:
            pass   # the standard parser words the error (and reads what orjson refuses: ints past 64 bits)
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InputError(name, f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(name, "json", f"invalid JSON: {exc}") from None


def _load_yaml(text: str, name: str) -> Any:
    """Safe YAML; aliases may add at most MAX_YAML_ALIAS_NODES nodes and not refer to
    themselves."""
    loader = _YAML_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if "&" in text:  # no anchor, no alias: skip the walk
            _check_aliases(node, name)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(name, where, f"invalid YAML: {problem}") from None
    except (ValueError, OverflowError, RecursionError, TypeError) as exc:
        raise InputError(name, "yaml", f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_aliases(root, name: str) -> None:
    """The composed YAML graph shares a node per alias; count the nodes it would have
    with every alias written out (one pass, memoised) and refuse past the limit, or a
    node that contains itself."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        if closing:
            size[key] = 1 + sum(size[id(child)] for child in _children(node))
            open_nodes.discard(key)
            continue
        if key in size:
            continue
        if key in open_nodes:
            line = node.start_mark.line + 1 if node.start_mark is not None else "?"
            raise InputError(name, f"line {line}", "invalid YAML: an alias refers to a node that "
                                                   "contains it (a recursive alias)")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)
    extra = size[id(root)] - len(size)
    if extra > MAX_YAML_ALIAS_NODES:
        raise InputError(name, "yaml", f"YAML aliases expand the document by {extra} nodes, more than "
                                       f"{MAX_YAML_ALIAS_NODES} (an alias bomb?); write the values out")


def _reject_surrogates(data: Any, name: str) -> None:
    """InputError naming the first string (or key) that holds a lone UTF-16 surrogate."""
    stack = [(data, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            _check_text(value, name, where or "top level")
        elif isinstance(value, dict):  # children pushed last-first: reported in document order
            for key, item in reversed(value.items()):
                if isinstance(key, str):
                    _check_text(key, name, where or "top level")
                stack.append((item, f"{where}.{key}" if where else str(key)))
        elif isinstance(value, list):
            stack.extend((value[k], f"{where}[{k}]") for k in range(len(value) - 1, -1, -1))


def _check_text(text: str, name: str, where: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise InputError(name, where.encode("ascii", "backslashreplace").decode("ascii"),
                         f"string holds a lone UTF-16 surrogate (\\u{ord(bad):04x} at character "
                         f"{exc.start}), which is not valid Unicode") from None


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not allowed")


# ----------------------------------------------------------------------------- writing


def check_output(path: str | os.PathLike) -> Path:
    """Check that ``path`` may be written: its folder exists and it is absent or a
    regular file (not a symbolic link, a folder, a device, a FIFO or a socket).

    Returns the path; raises InputError naming it otherwise. Call it before long work
    so that a bad output path fails at once.
    """
    path = Path(path)
    name = str(path)
    if not name or name.endswith(os.sep):
        raise InputError(name or "<argument>", "", "expected a file name, got a folder")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        folder = path.parent if str(path.parent) else Path(".")
        if not folder.is_dir():
            raise InputError(name, "", f"folder {str(folder)!r} does not exist") from None
        return path
    except OSError as exc:
        raise InputError(name, "", f"cannot write: {exc.strerror or exc}") from None
    if stat.S_ISREG(info.st_mode):
        return path
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(path)
        raise InputError(name, "", f"is a symbolic link (to {target!r}); swapplan writes only new "
                                   "files or over regular files: give the target's path or a new name")
    raise InputError(name, "", f"is {_kind_of(info.st_mode)}; swapplan writes only new files or over "
                               "regular files")


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, renamed
    over it: readers never see half a file, and nothing but ``path`` is left behind.

    Only a new path or a regular file is written (``check_output``); a file replaced
    keeps its permissions. Raises InputError naming the file when it cannot be written.
    """
    path = check_output(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o666 & ~_umask()  # mkstemp makes 0600; give the usual mode
    try:
        handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except FileNotFoundError:
        raise InputError(str(path), "", f"folder {str(folder)!r} does not exist") from None
    except OSError as exc:
        raise InputError(str(path), "", f"cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException as exc:
        try:
            os.unlink(temp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise InputError(str(path), "", f"cannot write: {exc.strerror or exc}") from None
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def gzip_bytes(data: bytes) -> bytes:
    """Gzip with a zero timestamp, so the same data always gives the same bytes."""
    return gzip.compress(data, compresslevel=9, mtime=0)


# ----------------------------------------------------------------------------- outputs and inputs


def _file_id(path: str | os.PathLike) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the regular file ``path`` names, links followed; None when it
    names none (missing, a folder, a device)."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISREG(info.st_mode) else None


def _real(path: str | os.PathLike) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return os.path.abspath(path)


def same_file(output: str | os.PathLike, other: str | os.PathLike, other_exists: bool = True) -> str | None:
    """How writing ``output`` would replace ``other``: ``"the same file"``, ``"the same
    file, by a symbolic link"`` or ``"the same file, by a hard link"``; None when it
    would not. With ``other_exists`` (an input), ``other`` must be an existing regular
    file; otherwise (another output) two paths that resolve alike match even when
    neither exists yet."""
    other_id = _file_id(other)
    if other_exists and other_id is None:
        return None
    out_id = _file_id(output)
    real_same = _real(output) == _real(other)
    if not real_same and (out_id is None or out_id != other_id):
        return None
    if real_same:
        if os.path.normpath(os.path.abspath(output)) == os.path.normpath(os.path.abspath(other)):
            return "the same file"
        return "the same file, by a symbolic link"
    return "the same file, by a hard link"


def check_outputs(outputs, inputs=()) -> None:
    """Check, before any work, that a command's outputs may be written and replace none
    of its inputs.

    ``outputs``: ``(option, path)`` pairs (``("-o", "p.json")``); ``inputs``: ``(what,
    path)`` pairs (``("profile", "p.json")``); a None or empty path is skipped, and an
    input that is not an existing file (a preset or shipped profile name) is no file
    to protect. Raises InputError, one line naming both, when an output is the same
    file as an input (the same path once resolved, a symbolic link to it either way,
    or a hard link: the same device and inode) or as another output; then checks each
    output with ``check_output`` and its folder with ``probe_folder``.
    """
    outputs = [(option, path) for option, path in outputs if path]
    inputs = [(what, path) for what, path in inputs if path]
    for k, (option, path) in enumerate(outputs):
        for what, source in inputs:
            how = same_file(path, source)
            if how is not None:
                raise InputError(str(path), "", f"{option} would overwrite the input {what} {source} ({how}); "
                                                "write to another path")
        for other_option, other in outputs[:k]:
            how = same_file(path, other, other_exists=False)
            if how is not None:
                raise InputError(str(path), "", f"{other_option} and {option} name {how} ({other} and {path}); "
                                                "give each output its own path")
    probed = set()
    for _, path in outputs:
        path = check_output(path)
        folder = path.parent if str(path.parent) else Path(".")
        if _real(folder) not in probed:
            probe_folder(folder, str(path))
            probed.add(_real(folder))


def probe_folder(folder: str | os.PathLike, name: str | None = None, option: str = "") -> None:
    """Check that files can be created in ``folder`` by creating one (a hidden temporary
    file, removed at once): no write permission, a read-only file system or a folder
    that takes no new files (``/proc/self``) is found before any work, not after it.

    Raises InputError naming ``name`` (default: the folder) and ``option``."""
    name = name or str(folder)
    try:
        handle, temp = tempfile.mkstemp(prefix=".swapplan-probe-", suffix=".tmp", dir=folder)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and os.path.isdir(folder):
            why = "it takes no new files (a special file system?)"
        elif isinstance(exc, FileNotFoundError):
            why = "it does not exist"
        else:
            why = exc.strerror or str(exc)
        raise InputError(name, option, f"cannot write in folder {str(folder)!r}: {why}") from None
    os.close(handle)
    try:
        os.unlink(temp)
    except OSError:
        pass


def _existing_ancestor(folder: Path) -> Path:
    """The nearest of ``folder``'s ancestors that exists (links followed), as written
    (``f`` for ``f/x``), else the current folder."""
    for parent in Path(folder).parents:
        if os.path.exists(parent):
            return parent
    return Path(".")


def check_output_folder(folder: str | os.PathLike, option: str, writes, inputs=(), subfolders=()) -> None:
    """``check_outputs`` for a command that writes files into ``folder`` (and its
    ``subfolders``): InputError when an input is a file the command may write there.
    ``writes(relative)`` says whether the command writes the file at the relative path
    (a Path) inside ``folder``; an input is caught by its resolved path, or as the file
    a hard or symbolic link there names; and when ``folder`` exists and is not a folder,
    or cannot be created or written (``probe_folder`` in it, in its existing
    ``subfolders``, or in the nearest ancestor it would be created in). Creates nothing."""
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise InputError(str(folder), option, "is not a folder")
    if os.path.isdir(folder):
        for sub in ("", *subfolders):
            if sub == "" or os.path.isdir(Path(folder) / sub):
                probe_folder(Path(folder) / sub, str(folder), option)
    else:
        parent = _existing_ancestor(Path(folder))
        if not parent.is_dir():
            raise InputError(str(folder), option, f"{str(parent)!r} is a file, not a folder")
        probe_folder(parent, str(folder), option)
    inputs = [(what, path) for what, path in inputs if path and _file_id(path) is not None]
    if not inputs:
        return
    base = Path(_real(folder))
    existing: dict[tuple[int, int], tuple[Path, str]] = {}   # a file there: its path there, how it is linked
    for sub in ("", *subfolders):
        try:
            names = os.listdir(base / sub)
        except OSError:
            continue
        for name in names:
            relative = Path(sub) / name
            file_id = _file_id(base / relative)
            if file_id is not None and writes(relative):
                link = "symbolic" if os.path.islink(base / relative) else "hard"
                existing.setdefault(file_id, (relative, f"the same file, by a {link} link"))
    for what, path in inputs:
        real = Path(_real(path))
        try:
            relative = real.relative_to(base)
        except ValueError:
            relative = None
        if relative is not None and writes(relative):
            how = "the same file" if os.path.normpath(os.path.abspath(path)) == str(real) \
                else "the same file, by a symbolic link"
        elif _file_id(path) in existing:
            relative, how = existing[_file_id(path)]
        else:
            continue
        raise InputError(str(Path(folder) / relative), "", f"{option} {folder} would overwrite the input {what} "
                                                          f"{path} ({how}); write to another folder")
