"""Regular expressions over many names at once: one C-level scan of the names joined by newlines
per pattern, instead of a `search` call per name and pattern (those calls cost 27M of
gpt2_pathologies' 1,013M instructions when the idle classification made them). And, where names
are searched one at a time (kernel names, first match of a rule list wins), `GuardedSearch`: a
literal test before the regex.

    text = NameText(names)
    found = text.matches(NamePattern(r"^aten::(mm|addmm)$", anchored=True))  # bool per name

A name holding a newline, or a match that would cross one, is searched alone, so the result is
always what `re.search` (or `re.match` when anchored) gives name by name.
"""

from __future__ import annotations

import functools
import re

import numpy as np

# Leading anchors of patterns -> their form in the joined text, where a newline starts each name:
# re's search then only tries the positions of the newlines (a literal prefix), or of the newlines
# and slashes (a first-character set), not every position of the text.
_JOINED_ANCHORS = (("^", "\n"), ("(^|/)", "[\n/]"))


class NamePattern:
    """One pattern, compiled for `NameText`: as a `search`, or as a `match` when `anchored`.

    With a leading anchor of `_JOINED_ANCHORS` that covers the whole pattern, the joined form
    starts one character before the name or path part it anchors (`offset` 1); `$` matches at
    each name's end.
    """

    def __init__(self, source: str, anchored: bool = False):
        self.source = source
        self.anchored = anchored
        self.joined, self.offset = _joined_form(source)

    @functools.cached_property
    def literals(self) -> tuple[str, ...] | None:
        """`required_literals` of the pattern: where none is in any name, no name matches."""
        return required_literals(self.source)


def _joined_form(source: str) -> tuple[re.Pattern, int]:
    for anchor, joined in _JOINED_ANCHORS:
        rest = source[len(anchor):]
        if source.startswith(anchor) and "^" not in rest and not _alternates_at_top(rest):
            return re.compile(joined + rest, re.MULTILINE), 1
    return re.compile(source, re.MULTILINE), 0


def _alternates_at_top(source: str) -> bool:
    """Whether a pattern has a `|` outside every group (`^a|b`: the anchor holds for `a` only)."""
    depth, escaped, in_set = 0, False, False
    for char in source:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_set:
            in_set = char != "]"
        elif char == "[":
            in_set = True
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif char == "|" and depth == 0:
            return True
    return False


class NameText:
    """Names joined by newlines (a name holding a newline stands empty there and is searched alone)."""

    def __init__(self, names: list[str]):
        self.names = names
        lines = [name if "\n" not in name else "" for name in names]
        self._alone = [i for i, name in enumerate(names) if "\n" in name]
        self._text = "\n" + "\n".join(lines)
        self._line_starts = np.cumsum([1] + [len(line) + 1 for line in lines[:-1]])

    def matches(self, pattern: NamePattern) -> np.ndarray:
        """Per name, whether `pattern` matches it (`re.search`, or `re.match` when anchored)."""
        found = np.zeros(len(self.names), dtype=bool)
        text, line_starts = self._text, self._line_starts
        literals = pattern.literals
        if literals is not None and not any(
            literal in text or any(literal in self.names[i] for i in self._alone) for literal in literals
        ):  # most frame rules name libraries a trace never runs: a substring test of the text rules them out
            return found
        for match in pattern.joined.finditer(text):
            start = match.start() + pattern.offset  # an anchored form's match starts one before the name
            line = int(np.searchsorted(line_starts, start, side="right")) - 1
            if "\n" in text[start:match.end()]:
                return np.array([_matches(pattern, name) for name in self.names], dtype=bool)
            if line >= 0 and (not pattern.anchored or start == line_starts[line]):  # `match`: at the start
                found[line] = True
        for i in self._alone:
            found[i] = _matches(pattern, self.names[i])
        return found


def _matches(pattern: NamePattern, name: str) -> bool:
    """One name against a pattern, as a `match` (anchored) or a `search`."""
    compiled = re.compile(pattern.source)  # rare (a name holding a newline): re's own cache keeps it
    return (compiled.match(name) if pattern.anchored else compiled.search(name)) is not None


class GuardedSearch:
    """A pattern searched in one name at a time, first asking whether the name holds one of the
    literals every match holds (`required_literals`): `in` over a 330-character ATen kernel name is
    faster than re's scan, and a pattern whose literals never occur is never compiled."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.literals = required_literals(pattern)

    @functools.cached_property
    def _compiled(self) -> re.Pattern:
        return re.compile(self.pattern)

    def found_in(self, text: str) -> bool:
        if self.literals is None:
            return self._compiled.search(text) is not None
        for literal in self.literals:  # a loop, not any(...): no generator per call
            if literal in text:
                return self._compiled.search(text) is not None
        return False


def required_literals(pattern: str) -> tuple[str, ...] | None:
    """Strings of which every match of `pattern` holds one: per top-level alternative, its longest
    run of literal characters, else the literals of the first group that every match of it holds
    (not optional, not a lookaround) and that has some. None where an alternative has neither, or
    the pattern uses syntax beyond what this reads: letters, digits, `_PLAIN` and escaped
    punctuation (`\\.`) are literal; `^ $ \\b` and lookarounds are zero-width; a group, `.` or a
    class (`\\w`) ends a run; `?` and `*` take their character out of it, `+` ends the run after
    it; anything else (a set, `{n}`, inline flags) gives None."""
    tokens = _TOKEN.findall(pattern)
    literals: list[str] = []
    runs, run, depth, skip_to = [], "", 0, None
    group_at, groups = 0, []  # where the group being skipped opens; the groups every match holds
    for at, token in enumerate(tokens + ["|"]):  # a final `|` closes the last alternative
        quantified = at + 1 < len(tokens) and tokens[at + 1] in ("?", "*")
        literal = token[1] if token[0] == "\\" and not token[1:].isalnum() else token
        if token == "(?" and not tokens[at + 1 : at + 2] == ["P"]:
            return None  # inline flags (`(?i)`) change what the literals match
        if token == "(" or token.startswith("(?"):
            depth += 1
            if skip_to is None:  # the group's content is not read here; a lookaround consumes nothing
                skip_to, group_at = depth, at
                if token not in _LOOKAROUNDS:
                    runs.append(run)
                    run = ""
        elif token == ")":
            depth -= 1
            if depth < 0:
                return None
            if skip_to is not None and depth < skip_to:
                skip_to = None
                if tokens[group_at] in ("(", "(?:") and not quantified:
                    groups.append("".join(tokens[group_at + 1 : at]))
        elif skip_to is not None or token in ("^", "$", "\\b", "?", "*"):
            continue  # inside a skipped group, zero-width, or a quantifier already applied
        elif token == "|":
            runs.append(run)
            longest = max(runs, key=len)
            inner = None if longest else next(filter(None, map(required_literals, groups)), None)
            if not longest and inner is None:
                return None
            literals.extend((longest,) if longest else inner or ())
            runs, run, groups = [], "", []
        elif literal[0].isalnum() or literal[0] in _PLAIN or literal is not token:
            if quantified:  # the last character is optional: it ends the run
                runs.extend((run + literal[:-1], ""))
                run = ""
            else:
                run += literal
        elif token in (".", "+") or token[0] == "\\":  # `+`: its character (or class) is in, once
            runs.append(run)
            run = ""
        else:
            return None
    return tuple(dict.fromkeys(literals)) if depth == 0 else None


_TOKEN = re.compile(r"\\.|\(\?<?[=!:]?|\)|[A-Za-z0-9_:\-]+|.", re.DOTALL)
"""`required_literals`' tokens: an escape, a group's opening, a run of plain characters, one character."""
_LOOKAROUNDS = ("(?=", "(?!", "(?<=", "(?<!")
_PLAIN = "_:- /#,=<>@%&~;!'\""
"""Characters that stand for themselves outside a set (a group's `(?=`, `(?<` are tokens of their own)."""
