"""Which source files are the user's code: one rule for the live capture and for trace analysis.

The session records the innermost user frame of each sync while the loop runs; the analysis finds
the innermost user `python_function` of the same sync in the trace and joins the two by it. Both
must draw the line between user and library code in the same place, so both call `is_user_file`.

The rule looks at where a file is installed, never at folder names alone (`/code/train.py` and
`~/proj/lightning/train.py` are the user's):

- `<frozen ...>`, `<built-in ...>`, anything under `site-packages/` or `dist-packages/`, and the
  interpreter's standard library are library code;
- an absolute path (a live frame's `co_filename`) is library code when it lies under one of the
  run's library roots (`CodeLayout.roots`: those folders, plus the folder of every known library
  package imported from elsewhere, e.g. a source checkout of transformers or trainprof);
- a relative path (the profiler writes `python_function` files relative to their sys.path entry:
  `torch/nn/modules/module.py`, `train.py`) is judged by its top-level name: a package the run
  imported from a library root, a known library, or a stdlib module is library code, unless the
  run imported that name from the user's own folders (`CodeLayout.user_packages`).

The session records its `CodeLayout` beside the sync sites, so an offline analysis draws the line
where the live capture drew it; without one, this process's layout and the known names are used.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import sys
import sysconfig
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Top-level packages that are library code wherever they are imported from. Extend as needed.
LIBRARY_PACKAGES = frozenset(
    {
        "torch",
        "transformers",
        "accelerate",
        "trainprof",
        "fused_layers",
        "triton",
        "numpy",
        "deepspeed",
        "megatron",
        "lightning",
        "lightning_fabric",
        "lightning_utilities",
        "pytorch_lightning",
        "torchmetrics",
        "torchvision",
        "torchaudio",
        "torchao",
        "torchtitan",
        "functorch",
        "peft",
        "trl",
        "datasets",
        "tokenizers",
        "safetensors",
        "huggingface_hub",
        "apex",
        "xformers",
        "flash_attn",
        "bitsandbytes",
        "liger_kernel",
        "timm",
        "diffusers",
        "einops",
        "tqdm",
        "wandb",
        "tensorboard",
        "pandas",
        "scipy",
    }
)
_STDLIB_MODULES = frozenset(getattr(sys, "stdlib_module_names", ()))
# A file inside an installed-packages folder or a `lib/python3.X/` stdlib, on any machine.
_INSTALLED = re.compile(r"(^|/)(site-packages|dist-packages)/|/lib/python3\.\d+/")
# Files inside a library package that hold a training loop of the user's kind.
_USER_FILES_IN_LIBRARIES = ("trainprof/demo.py",)


@dataclass(frozen=True)
class CodeLayout:
    """Where one process's library code lives; the session writes it beside the sync sites.

    `roots`: absolute folders (`/`-separated, ending in `/`) holding library code;
    `library_packages` / `user_packages`: top-level module names the process imported from a
    library root / from the user's folders (the main script's name counts as the user's);
    `versions`: `(top-level name, version)` of the library packages whose installed distribution
    gives one (`with_versions`: the session records them beside the sync sites).
    """

    roots: tuple[str, ...] = ()
    library_packages: frozenset[str] = frozenset()
    user_packages: frozenset[str] = frozenset()
    versions: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)

    def version_of(self, package: str | None) -> str | None:
        """The recorded version of top-level package `package`, or None."""
        return dict(self.versions).get(package) if package else None

    def to_dict(self) -> dict[str, Any]:
        """The `code_layout` object of a version-2 `<worker>.syncsites.json` (DEVELOPING.md)."""
        return {
            "roots": list(self.roots),
            "library_packages": sorted(self.library_packages),
            "user_packages": sorted(self.user_packages),
            "versions": dict(self.versions),
        }

    @classmethod
    def from_dict(cls, document: Any) -> CodeLayout | None:
        """Read `to_dict()`'s form back; None when `document` is not one (wrong-typed parts are dropped)."""
        if not isinstance(document, dict):
            return None

        def strings(key: str) -> list[str]:
            value = document.get(key)
            return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

        versions = document.get("versions")
        pairs = tuple(
            sorted((k, v) for k, v in versions.items() if isinstance(k, str) and isinstance(v, str))
        ) if isinstance(versions, dict) else ()
        return cls(
            roots=tuple(_as_root(r) for r in strings("roots")),
            library_packages=frozenset(strings("library_packages")),
            user_packages=frozenset(strings("user_packages")),
            versions=pairs,
        )


def _as_root(folder: str) -> str:
    return folder.replace("\\", "/").rstrip("/") + "/"


@functools.lru_cache(maxsize=1)
def _installation_roots() -> tuple[str, ...]:
    """This interpreter's stdlib and installed-packages folders."""
    import site

    paths = _scheme_paths()
    folders = [paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    try:
        folders += site.getsitepackages()
        folders.append(site.getusersitepackages())
    except AttributeError:  # some virtualenv builds lack these
        pass
    folders += [p for p in sys.path if "site-packages" in p or "dist-packages" in p]
    return tuple(sorted({_as_root(_realpath(f)) for f in folders if f}))


def _scheme_paths() -> dict[str, str]:
    """`sysconfig.get_paths()`, its default scheme's folders filled from `sys`, as sysconfig fills them.

    `get_paths()` first loads every build variable of the interpreter (3.5 ms of a first analysis on
    the 2-core development machine, 2026-11-25), for the few its folders name. A scheme whose folders
    name a variable not filled here falls back to `get_paths()`.
    """
    version = sys.version_info
    values = {
        "base": sys.prefix, "platbase": sys.exec_prefix, "installed_base": sys.base_prefix,
        "installed_platbase": sys.base_exec_prefix, "platlibdir": getattr(sys, "platlibdir", "lib"),
        "py_version_short": f"{version[0]}.{version[1]}", "py_version_nodot": f"{version[0]}{version[1]}",
        "abiflags": getattr(sys, "abiflags", ""),
    }
    try:
        return {key: os.path.normpath(template.format(**values))
                for key, template in sysconfig.get_paths(expand=False).items()}
    except (KeyError, IndexError, ValueError):
        return sysconfig.get_paths()


@functools.lru_cache(maxsize=4096)
def _realpath(path: str) -> str:
    """`os.path.realpath(path)`, resolving each folder once per process.

    `os.path.realpath` checks every component of its path for a link; the ~100 modules of a process
    share most folders, so resolving the parent folder once (cached) and then only the last
    component costs 1 ms instead of 10 ms for `current_layout` (measured 2026-11-23).
    """
    parent, name = os.path.split(path)
    if not os.path.isabs(path) or parent == path or name in ("", ".", ".."):
        return os.path.realpath(path)
    resolved = os.path.join(_realpath(parent), name)
    return os.path.realpath(resolved) if os.path.islink(resolved) else resolved


def _module_folder(module: Any) -> str | None:
    """The folder of a package (`.../torch/`) or the file of a single-file module, as a root."""
    file = getattr(module, "__file__", None)
    if not isinstance(file, str):
        return None
    file = _realpath(file)
    if os.path.basename(file).startswith("__init__."):
        return _as_root(os.path.dirname(file))
    return file.replace("\\", "/")


def current_layout() -> CodeLayout:
    """This process's layout, from the top-level modules it has imported (~1 ms; cached per import set)."""
    _installation_roots()  # first: its first call imports a module, which would change the import set
    top_level = tuple(sorted(name for name in list(sys.modules) if "." not in name))
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    return _layout_for(top_level, main_file if isinstance(main_file, str) else None)


def with_versions(layout: CodeLayout) -> CodeLayout:
    """`layout` with its library packages' versions, from their installed distributions' metadata.

    The first call reads every distribution's file list (~50 ms): the session asks when it writes a
    window's sync sites, beside the export. Never `module.__version__`: some libraries warn on
    reading it (MarkupSafe 3), and under `python -W error` a warning is an exception.
    """
    found = ((name, _installed_version(name)) for name in sorted(layout.library_packages))
    return dataclasses.replace(layout, versions=tuple((name, v) for name, v in found if v is not None))


@functools.lru_cache(maxsize=1)
def _distributions_by_package() -> Mapping[str, list[str]]:
    """Top-level module name -> the installed distributions that provide it."""
    import importlib.metadata  # ~10 ms of imports: only the live capture needs it

    try:
        return importlib.metadata.packages_distributions()
    except Exception:  # a broken distribution's metadata: no versions rather than no capture
        return {}


@functools.lru_cache(maxsize=1024)
def _installed_version(package: str) -> str | None:
    """The version of the installed distribution that provides top-level module `package`, or None."""
    import importlib.metadata

    for distribution in _distributions_by_package().get(package, ()):
        try:
            return importlib.metadata.version(distribution)
        except Exception:  # PackageNotFoundError, or unreadable metadata
            continue
    return None


@functools.lru_cache(maxsize=8)
def _layout_for(top_level: tuple[str, ...], main_file: str | None) -> CodeLayout:
    installed = _installation_roots()
    roots = set(installed)
    library, user = set(), set()
    for name in top_level:
        if name.startswith("__") or not name.isidentifier():
            continue  # __main__, __mp_main__, <stdin>: not importable names a trace could show
        module = sys.modules.get(name)
        where = _module_folder(module)
        if where is None:
            continue
        if name in LIBRARY_PACKAGES or where.startswith(installed) or _INSTALLED.search(where):
            library.add(name)
            if where.endswith("/") and not where.startswith(installed):
                roots.add(where)  # a source checkout or editable install of a known library
        else:
            user.add(name)
    if main_file:
        user.add(os.path.splitext(os.path.basename(main_file))[0])
    return CodeLayout(
        roots=tuple(sorted(roots)),
        library_packages=frozenset(library - user),
        user_packages=frozenset(user),
    )


def _top_level(path: str) -> str:
    first = path.lstrip("./").split("/", 1)[0]
    return first[:-3] if first.endswith(".py") else first


def _is_absolute(path: str) -> bool:
    return path.startswith("/") or (len(path) > 2 and path[1] == ":" and path[2] == "/")


@functools.lru_cache(maxsize=1)
def _trainprof_root() -> str:
    return _as_root(os.path.dirname(os.path.realpath(__file__)))


@functools.lru_cache(maxsize=1)
def _trainprof_files() -> frozenset[str]:
    """`trainprof/<relative path>` of every source file of this package, to know copies elsewhere."""
    root = _trainprof_root()
    files = set()
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                relative = os.path.join(folder, name).replace("\\", "/")[len(root):]
                files.add("trainprof/" + relative)
    return frozenset(files)


@functools.lru_cache(maxsize=8192)  # the capture and the analysis ask about the same few files
def is_user_file(file: str, layout: CodeLayout | None = None) -> bool:
    """True for the user's code (see the module docstring); `layout` defaults to this process's.

    Takes a live frame's `co_filename` or a trace's `python_function` file.
    """
    path = file.replace("\\", "/")
    if not path or path.startswith("<") or _INSTALLED.search(path):
        return False
    if path.endswith(_USER_FILES_IN_LIBRARIES):  # trainprof's demo loop is the user's code there
        return True
    if _is_absolute(path):
        roots = layout.roots if layout is not None else current_layout().roots
        if path.startswith(roots) or path.startswith(_installation_roots()):
            return False
        # trainprof's own modules checked out elsewhere (`/src/trainprof/trainprof/session/lifecycle.py`)
        return not any(path.endswith("/" + own) for own in _own_file_candidates(path))
    top = _top_level(path)
    if layout is not None and top in layout.user_packages:
        return True
    if layout is not None and top in layout.library_packages:
        return False
    return top not in LIBRARY_PACKAGES and top not in _STDLIB_MODULES


def _own_file_candidates(path: str) -> tuple[str, ...]:
    """The `trainprof/...` suffixes of `path` that name one of trainprof's own files."""
    index = path.rfind("/trainprof/")
    if index < 0:
        return ()
    suffix = path[index + 1:]
    return (suffix,) if suffix in _trainprof_files() else ()


@functools.lru_cache(maxsize=8192)  # as is_user_file: many frames share a file
def library_of(file: str, layout: CodeLayout | None = None) -> str | None:
    """The top-level package a library file belongs to (`transformers`, `torch`, ...), or None.

    For the standard library it is `"python"`; for a file not in any package, None.
    """
    if is_user_file(file, layout):
        return None
    path = file.replace("\\", "/")
    if path.startswith("<"):
        return None
    if re.search(r"/lib/python3\.\d+/(?!.*(site|dist)-packages/)", path):
        return "python"
    match = re.search(r"(?:^|/)(?:site-packages|dist-packages)/([^/]+)", path)
    if match:
        return _top_level(match.group(1))
    if _is_absolute(path):
        roots = (layout.roots if layout is not None else current_layout().roots) + _installation_roots()
        best = max((r for r in roots if path.startswith(r)), key=len, default=None)
        if best is None:
            index = path.rfind("/trainprof/")
            return "trainprof" if index >= 0 and _own_file_candidates(path) else None
        if best in _installation_roots():
            return "python"
        return best.rstrip("/").rsplit("/", 1)[-1]
    top = _top_level(path)
    return "python" if top in _STDLIB_MODULES else top


WARNING_SOURCE = "trainprof"
"""The file name of a trainprof warning that no frame of the user's code called into: the command
line shows such a warning as its message alone (`trainprof.cli.one_line_warnings`)."""


def warn(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """Warn the user from the innermost frame of their own code (`is_user_file`), never raising into it.

    `warnings.warn`'s fixed `stacklevel` would point at trainprof's (or torch's) frame and show
    trainprof's source line; where no frame of the stack is the user's (`trainprof run`, once the
    script has ended) the warning names `WARNING_SOURCE`, which has no source line. Under `python
    -W error` (or a filter that turns the warning into an error) the message is logged on the
    `trainprof` logger instead.
    """
    level = _user_stacklevel(sys._getframe(1))
    try:
        if level is not None:
            warnings.warn(message, category, stacklevel=level)
        else:
            warnings.warn_explicit(message, category, WARNING_SOURCE, 0, module=WARNING_SOURCE)
    except Exception:
        logging.getLogger("trainprof").warning("%s", message)


def _user_stacklevel(frame: Any) -> int | None:
    """The `stacklevel` that makes `warnings.warn`, called by `frame`'s callee, point at the innermost
    frame of the user's code from `frame` outward; None when none is."""
    level = 2
    while frame is not None:
        file = frame.f_code.co_filename
        # warnings.warn counts no frame of importlib's (`_next_external_frame`)
        if not ("importlib" in file and "_bootstrap" in file):
            if is_user_file(file):
                return level
            level += 1
        frame = frame.f_back
    return None
