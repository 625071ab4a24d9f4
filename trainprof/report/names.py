"""Short display names that stay distinct: kernels (demangled C++ signatures), ops, modules.

A kernel's demangled name is a whole C++ signature, often thousands of characters:

    void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(
        at::TensorIteratorBase&)::{lambda()#3}::...::{lambda(float)#1}, std::array<char*, 2ul>, ...>(...)
    std::enable_if<...::exists, void>::type vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(...)
    ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)

Its short name comes from its structure, not from cutting at the first `<` or `(`: the return type
(`void`, `std::enable_if<...>::type`) and the argument list go, the namespaces go, the function's
name stays (`unrolled_elementwise_kernel`, `fused_add_rms_norm_kernel`, `ncclDevKernel_Generic`).
A generic name (`Kernel2`, `device_kernel`) keeps its first template argument, which is where such
kernels say what they are. Distinct kernels whose short names coincide get more of their own name,
level by level, until they differ: the innermost namespace, then the template arguments in short,
then the whole name; kernels that still look alike show the part of their names where they differ.
Itanium-mangled names (`_ZN2ck16tensor_operation6device...`, in ROCm traces) give their nested name.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence

from trainprof.report.text import ELLIPSIS, cut, safe_text

PARSE_CHARS = 16384
"""Characters of a name read to find its structure (the longest real kernel names seen: ~5,200)."""
DIFFERING_CHARS = 28
"""Characters shown of where two look-alike names differ."""
DIFFERING_LEAD = 8
"""Characters before the first difference that the differing part starts with (its context)."""
GENERIC_KERNEL_NAMES = frozenset(
    {"kernel", "Kernel", "Kernel2", "device_kernel", "kernel_entry", "run_kernel"}
)
"""Function names that say nothing alone: CUTLASS's `Kernel<...>`, `device_kernel<flash::...>`."""

_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = {")": "(", "]": "[", "}": "{"}
_IDENTIFIER_END = re.compile(r"[\w>]")
_MANGLED_PART = re.compile(r"(\d+)")


def _depths(text: str) -> list[int] | None:
    """Per character, how deep it sits in brackets (`<>`, `()`, `[]`, `{}`); None when unbalanced.

    A `>` closes a template only when a `<` is open innermost: inside parentheses it is a
    comparison (`enable_if<((8)>(0))>`), and `->` in `Memcpy HtoD (Pageable -> Device)` is text.
    """
    stack: list[str] = []
    depths = []
    for char in text:
        if char in _OPENERS or char == "<":
            depths.append(len(stack))
            stack.append(char)
        elif char == ">":
            if stack and stack[-1] == "<":
                stack.pop()
            depths.append(len(stack))
        elif char in _CLOSERS:
            while stack and stack[-1] == "<":  # a `<` inside parentheses was a comparison
                stack.pop()
            if not stack or stack[-1] != _CLOSERS[char]:
                return None
            stack.pop()
            depths.append(len(stack))
        else:
            depths.append(len(stack))
    return depths if not stack else None


def _split_top(text: str, depths: list[int], separator: str) -> list[str]:
    """`text` split at each `separator` that stands outside every bracket."""
    parts, start, index = [], 0, 0
    while index < len(text):
        if depths[index] == 0 and text.startswith(separator, index):
            parts.append(text[start:index])
            index += len(separator)
            start = index
        else:
            index += 1
    parts.append(text[start:])
    return parts


class _Signature:
    """A C++ name's parts: its namespaces and classes, its own name, its template arguments."""

    def __init__(self, scopes: list[str], name: str, template_args: list[str]) -> None:
        self.scopes = scopes
        self.name = name
        self.template_args = template_args


def _parse(text: str) -> _Signature | None:
    """The parts of a demangled C++ name, or None for a name that is not one (`Memcpy HtoD (...)`)."""
    if text.startswith("_Z"):
        return _parse_mangled(text)
    depths = _depths(text)
    if depths is None:
        return None
    # The argument list: the last top-level `(` right after a name or a template's `>`.
    opens = [i for i, char in enumerate(text) if char == "(" and depths[i] == 0]
    head = text
    if opens and opens[-1] > 0 and _IDENTIFIER_END.match(text[opens[-1] - 1]):
        head = text[: opens[-1]]
    elif opens and opens[-1] > 0:
        return None  # text in parentheses after a word: a label, not a signature
    head_depths = depths[: len(head)]
    words = [word for word in _split_top(head, head_depths, " ") if word]
    if not words or (len(words) > 1 and head is text):
        return None  # words without an argument list: plain text
    qualified = words[-1]  # what precedes it is the return type
    offset = len(head) - len(qualified)
    scopes = _split_top(qualified, head_depths[offset : offset + len(qualified)], "::")
    last = scopes.pop()
    name, args = last, []
    if "<" in last:
        cut_at = last.index("<")
        name = last[:cut_at]
        inner = last[cut_at + 1 : last.rindex(">")] if ">" in last else ""
        inner_depths = _depths(inner)
        if inner_depths is not None:
            args = [arg.strip() for arg in _split_top(inner, inner_depths, ",") if arg.strip()]
    if not name or not (name[0].isalpha() or name[0] in "_~"):
        return None
    return _Signature(scopes, name, args)


def _parse_mangled(text: str) -> _Signature | None:
    """The nested name of an Itanium-mangled symbol: `_ZN2ck6device6kernelI...` -> ck::device::kernel."""
    index = 3 if text.startswith("_ZN") else 2
    parts = []
    while True:
        match = _MANGLED_PART.match(text, index)
        if match is None:
            break
        length = int(match.group(1)[:6])  # a length past the name's end ends the parse below
        start = match.end()
        part = text[start : start + length]
        if len(part) < length or not part:
            break
        parts.append(part)
        index = start + length
    if not parts:
        return None
    return _Signature(parts[:-1], parts[-1], [])


# Rewrites that make a template argument compact, in order: a lambda keeps its parameter types
# (`{lambda(float)#1}` -> `lambda(float)`, where elementwise kernels say their dtype), the
# `operator()() const` of nested lambdas and the lambdas without parameters go, then a function's
# own argument list before `::`, then the namespaces and classes that qualify a name.
_COMPACT = (
    (re.compile(r"\{lambda\(([^(){}]*)\)#\d+\}"), r"lambda(\1)"),
    (re.compile(r"::operator\(\)\(\) const"), ""),
    (re.compile(r"lambda\(\)::"), ""),
    (re.compile(r"::lambda\(\)(?=[,>]|$)"), ""),
    (re.compile(r"(\w)\([^()]*\)::"), r"\1::"),
    (re.compile(r"(?:\(anonymous namespace\)|[A-Za-z_]\w*)::(?!lambda\()"), ""),
)


def _compact(argument: str) -> str:
    """A template argument without namespaces and lambda plumbing: `at::native::direct_copy_kernel_
    cuda(at::TensorIteratorBase&)::{lambda()#3}::...::{lambda(float)#1}` -> `direct_copy_kernel_cuda::
    lambda(float)`, `std::array<char*, 2ul>` -> `array<char*, 2ul>`."""
    for pattern, replacement in _COMPACT:
        argument = pattern.sub(replacement, argument)
    return argument.strip()


def _short_argument(argument: str) -> str:
    """A template argument in short: compact, less its own template arguments (`array`)."""
    compact = _compact(argument)
    depths = _depths(compact)
    if depths is None:
        return compact
    for index, char in enumerate(compact):
        if char == "<" and depths[index] == 0 and index > 0:
            return compact[:index]
    return compact


def _kernel_levels(name: str) -> list[str]:
    """A kernel's display names from least to most detailed (the last one: the whole name)."""
    text = safe_text(name, PARSE_CHARS).strip()
    whole = text.removeprefix("void ")
    signature = _parse(text)
    if signature is None:
        return [whole]
    args = signature.template_args
    first = signature.name
    if signature.name in GENERIC_KERNEL_NAMES and args:
        first = f"{signature.name}<{_short_argument(args[0])}>"
    levels = [first]
    named_scopes = [scope for scope in signature.scopes if scope and scope[0] not in "({"]
    scoped = f"{named_scopes[-1]}::{signature.name}" if named_scopes else signature.name
    if named_scopes:
        levels.append(f"{named_scopes[-1]}::{first}")
    if args:
        levels.append(f"{scoped}<{', '.join(_short_argument(arg) for arg in args)}>")
        levels.append(f"{scoped}<{', '.join(_compact(arg) for arg in args)}>")
    levels.append(whole)
    return levels


def short_kernel_names(names: Sequence[str], max_chars: int) -> list[str]:
    """One short display name per kernel name (structure: module docstring), at most `max_chars`
    characters; distinct names get distinct short names, equal names the same one."""
    return _distinct(names, max_chars, _kernel_levels)


def short_names(names: Sequence[str], max_chars: int) -> list[str]:
    """Names (ops, modules, files) cut to `max_chars`, distinct for distinct names: names that the
    cut makes alike show where they differ."""
    return _distinct(names, max_chars, lambda name: [safe_text(name, PARSE_CHARS)])


def _distinct(names: Sequence[str], max_chars: int, levels_of: Callable[[str], list[str]]) -> list[str]:
    unique = list(dict.fromkeys(names))
    levels = {name: levels_of(name) for name in unique}
    level = dict.fromkeys(unique, 0)

    def shown(name: str) -> str:
        return cut(levels[name][level[name]], max_chars)

    while True:  # each round moves every name of a collision one level on: ends at the last level
        groups = _collisions(unique, shown)
        moved = False
        for group in groups:
            for name in group:
                if level[name] < len(levels[name]) - 1:
                    level[name] += 1
                    moved = True
        if not moved:
            break
    result = {name: shown(name) for name in unique}
    for group in _collisions(unique, shown):
        texts = _telling_apart(group, levels)
        for name, part in _differing_parts(group, texts).items():
            room = max(max_chars - len(part) - 3, 1)
            result[name] = f"{cut(levels[name][0], room)} [{part}]"
    _number_repeats(result, max_chars)
    return [result[name] for name in names]


def _collisions(names: list[str], shown: Callable[[str], str]) -> list[list[str]]:
    by_text: dict[str, list[str]] = defaultdict(list)
    for name in names:
        by_text[shown(name)].append(name)
    return [group for group in by_text.values() if len(group) > 1]


def _telling_apart(group: list[str], levels: dict[str, list[str]]) -> dict[str, str]:
    """Per name of a look-alike group, its least detailed level (counted from the most detailed
    end, as the groups' names may have different numbers of levels) at which all differ."""
    depth = min(len(levels[name]) for name in group)
    for back in range(depth, 0, -1):
        texts = {name: levels[name][-back] for name in group}
        if len(set(texts.values())) == len(group):
            return texts
    return {name: levels[name][-1] for name in group}


def _differing_parts(group: list[str], texts: dict[str, str]) -> dict[str, str]:
    """Per name, the part of its text around where it differs from the closest other; names whose
    parts still coincide are compared among themselves again, until the parts differ."""
    parts: dict[str, str] = {}
    pending = group
    while True:
        for name in pending:
            parts[name] = _differing_part(texts[name], [texts[other] for other in pending if other != name])
        still = [name for alike in _collisions(group, parts.__getitem__) for name in alike]
        if not still or set(still) == set(pending):
            return parts
        pending = still


def _differing_part(text: str, others: list[str]) -> str:
    """The part of `text` around its first difference from the closest of `others`."""
    position = max(_common_prefix(text, other) for other in others)
    start = max(position - DIFFERING_LEAD, 0)
    part = text[start : start + DIFFERING_CHARS]
    return (ELLIPSIS if start > 0 else "") + part + (ELLIPSIS if start + DIFFERING_CHARS < len(text) else "")


def _common_prefix(a: str, b: str) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def _number_repeats(shown: dict[str, str], max_chars: int) -> None:
    """The last resort for names that are distinct but display alike (they differ only in characters
    the display drops): `name #2`, `name #3`."""
    seen: dict[str, int] = defaultdict(int)
    for name, text in shown.items():
        seen[text] += 1
        if seen[text] > 1:
            suffix = f" #{seen[text]}"
            shown[name] = cut(text, max(max_chars - len(suffix), 1)) + suffix
